#include "engine/pipeline/shard_topology.h"

#include "absl/strings/str_cat.h"
#include "engine/config/model_config.h"

namespace glm::engine {

absl::Status ValidateShardTopology(const ShardTopology& t) {
  if (t.pp_size < 1 || t.tp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shard topology: pp_size=", t.pp_size,
                                                   " and tp_size=", t.tp_size, " must be >= 1"));
  }
  if (t.pp_rank < 0 || t.pp_rank >= t.pp_size || t.tp_rank < 0 || t.tp_rank >= t.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard topology: pp_rank=", t.pp_rank, " tp_rank=", t.tp_rank,
        " outside pp_size=", t.pp_size, " tp_size=", t.tp_size));
  }
  if (t.first_layer < 0 || (t.last_layer >= 0 && t.last_layer < t.first_layer)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard topology: layer range [", t.first_layer, ", ", t.last_layer,
        "] is empty or negative (inclusive; last_layer -1 = the model's last layer)"));
  }
  if (!t.distributed()) return absl::OkStatus();
  if (t.rendezvous == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard topology: pp_size * tp_size = ", t.world_size(),
        " ranks need a rendezvous to find each other; set ShardTopology::rendezvous"));
  }
  if (t.group_key.empty()) {
    return absl::InvalidArgumentError(
        "shard topology: group_key is empty; pass one unique per replica and epoch");
  }
  if (t.connect_timeout.count() <= 0 || t.op_timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        "shard topology: connect_timeout and op_timeout must be > 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateShardTopology(const ShardTopology& t, const ModelConfig& config) {
  if (absl::Status s = ValidateShardTopology(t); !s.ok()) return s;
  const int num_layers = static_cast<int>(config.num_hidden_layers);
  const int last = t.last_layer < 0 ? num_layers - 1 : t.last_layer;
  if (last >= num_layers || t.first_layer > last) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard topology: layers [", t.first_layer, ", ", last, "] are outside the model's ",
        num_layers, " decoder layers [0, ", num_layers - 1, "]"));
  }
  if (t.first_stage() && t.first_layer != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard topology: pp stage 0 must start at layer 0, not ", t.first_layer));
  }
  if (t.last_stage() && last != num_layers - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard topology: the last pp stage (", t.pp_rank, ") must end on the last layer ",
        num_layers - 1, ", not ", last));
  }
  if (!t.last_stage() && last == num_layers - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard topology: pp stage ", t.pp_rank, " of ", t.pp_size,
        " ends on the last layer; later stages would hold no layer"));
  }
  return absl::OkStatus();
}

std::string DescribeRank(const ShardTopology& t, int world_rank) {
  return absl::StrCat("world rank ", world_rank, " (pp ", world_rank / t.tp_size, ", tp ",
                      world_rank % t.tp_size, ")");
}

}  // namespace glm::engine
