#include "controller/orchestrate/load_step.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/orchestrate/steps.h"

namespace glm::orchestrate {

absl::StatusOr<glm::v1::LoadShardRequest> BuildLoadShardRequest(const ClusterTopology& topology,
                                                                const NodeEndpoint& node) {
  if (node.layer_end <= node.layer_begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", node.name, ": the plan assigned it no decoder layers (", node.layer_begin, "..",
        node.layer_end, "); fix: check `glmctl plan ", topology.config_path,
        "` (parallel.layer_partition, nodes) and re-run glmctl up"));
  }
  glm::v1::LoadShardRequest r;
  r.mutable_shard()->set_replica(node.replica);
  r.mutable_shard()->set_pp_rank(node.pp_rank);
  r.mutable_shard()->set_tp_rank(node.tp_rank);
  r.set_model_dir(topology.model_dir);
  r.set_first_layer(node.layer_begin);
  r.set_last_layer(node.layer_end - 1);
  r.set_tp_size(std::max(1, topology.tensor));
  r.set_pp_size(std::max(1, topology.pipeline));
  r.set_kv_cache_bytes(node.kv_cache_bytes);
  r.set_load_mtp(topology.mtp && node.last_stage);
  r.mutable_page_cache()->set_policy(topology.page_cache.policy);
  r.mutable_page_cache()->set_interval_s(topology.page_cache.interval_s);
  r.mutable_page_cache()->set_min_available_bytes(topology.page_cache.min_available_bytes);
  return r;
}

absl::Status LoadStep::Run(BringUpContext& ctx) {
  return ForEachConnectedNode(ctx, "shard load", [&](const NodeEndpoint& node,
                                                     AgentClient& client, const NodeFailFn& fail) {
    absl::StatusOr<glm::v1::LoadShardRequest> req = BuildLoadShardRequest(ctx.topology, node);
    if (!req.ok()) {
      fail(std::string(req.status().message()));
      return;
    }
    auto forward = [&](const glm::v1::Progress& p) {
      if (p.has_shard()) ctx.state().SetNodeShard(node.name, p.shard());
      glm::v1::UpEvent e;
      e.set_phase(glm::v1::BRING_UP_PHASE_LOAD);
      e.set_node(node.name);
      e.set_node_state(glm::v1::NODE_STATE_CONNECTED);
      e.set_message(p.message());
      if (p.total_bytes() > 0) {
        *e.mutable_progress() = p;
        e.mutable_progress()->clear_shard();  // the CLI needs the bytes, not the whole status
      }
      ctx.Emit(e);
    };
    absl::Status s = client.LoadShard(*req, forward, timeout_);
    if (!s.ok()) {
      fail(absl::StrCat("node ", node.name, ": loading its shard (layers ", req->first_layer(),
                        "-", req->last_layer(), ") failed: ", s.message()));
    }
  });
}

std::vector<std::string> StopShards(const ClusterTopology& topology, AgentClientFactory* factory,
                                    Clock::Duration timeout, int* stopped) {
  std::mutex mu;
  std::vector<std::string> lines;
  int count = 0;
  ParallelFor(topology.nodes, [&](const NodeEndpoint& node) {
    std::string line;
    absl::StatusOr<std::shared_ptr<AgentClient>> client = factory->Create(node);
    if (!client.ok()) {
      line = absl::StrCat(node.name, ": ", client.status().message());
    } else {
      std::string last;
      absl::Status s = (*client)->StopShard(
          glm::v1::StopShardRequest(), [&](const glm::v1::Progress& p) { last = p.message(); },
          timeout);
      line = absl::StrCat(node.name, ": ", s.ok() ? last : std::string(s.message()));
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++count;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(std::move(line));
  });
  std::sort(lines.begin(), lines.end());
  if (stopped) *stopped = count;
  return lines;
}

}  // namespace glm::orchestrate
