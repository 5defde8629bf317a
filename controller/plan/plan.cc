#include "controller/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"

namespace glm::controller {
namespace {

using engine::ModelConfig;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// "12.3 GiB", rounded up so that "needs X more" is always enough.
std::string GiB(int64_t bytes) {
  double gib = static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30);
  return absl::StrFormat("%.1f GiB", std::ceil(gib * 10.0) / 10.0);
}

std::string Thousands(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

// Everything about one PP stage that does not depend on the node.
struct StageShape {
  int first_layer = 0;
  int last_layer = 0;
  bool first = false;
  bool last = false;
  int64_t stage_weight_bytes = 0;  // before TP sharding
  int64_t kv_bytes_per_token = 0;
  int full_indexers = 0;
};

struct Inputs {
  Inputs(const cluster::ClusterSpec& spec_in, const ModelConfig& model_in,
         const WeightSizes& weights_in, bool mtp_in, int64_t reserve_in)
      : spec(spec_in), model(model_in), weights(weights_in), mtp(mtp_in), reserve(reserve_in) {
    // Prefix sums over decoder layers so a stage's totals cost O(1) (the partition search
    // evaluates many ranges).
    const int layers = model.num_hidden_layers;
    weight_prefix.assign(layers + 1, 0);
    kv_prefix.assign(layers + 1, 0);
    full_prefix.assign(layers + 1, 0);
    for (int l = 0; l < layers; ++l) {
      weight_prefix[l + 1] = weight_prefix[l] + weights.layer_bytes[l];
      kv_prefix[l + 1] = kv_prefix[l] + KvBytesPerToken(model, spec.model.kv_cache_dtype, l, l);
      full_prefix[l + 1] = full_prefix[l] + (model.HasIndexer(l) ? 1 : 0);
    }
  }
  const cluster::ClusterSpec& spec;
  const ModelConfig& model;
  const WeightSizes& weights;
  bool mtp = false;
  int64_t reserve = 0;
  std::vector<int64_t> weight_prefix;  // [layers + 1]
  std::vector<int64_t> kv_prefix;      // [layers + 1]
  std::vector<int> full_prefix;        // [layers + 1]
};

StageShape ShapeOf(const Inputs& in, int first_layer, int last_layer, bool first, bool last) {
  StageShape s;
  s.first_layer = first_layer;
  s.last_layer = last_layer;
  s.first = first;
  s.last = last;
  s.stage_weight_bytes = in.weight_prefix[last_layer + 1] - in.weight_prefix[first_layer];
  s.full_indexers = in.full_prefix[last_layer + 1] - in.full_prefix[first_layer];
  s.kv_bytes_per_token = in.kv_prefix[last_layer + 1] - in.kv_prefix[first_layer];
  if (first) s.stage_weight_bytes += in.weights.embedding_bytes + in.weights.other_bytes;
  if (last) {
    s.stage_weight_bytes += in.weights.lm_head_bytes + in.weights.final_norm_bytes;
    if (in.mtp) {
      const int mtp_layer = in.model.num_hidden_layers;
      s.stage_weight_bytes += in.weights.layer_bytes[mtp_layer];
      s.kv_bytes_per_token +=
          KvBytesPerToken(in.model, in.spec.model.kv_cache_dtype, mtp_layer, mtp_layer);
      s.full_indexers += 1;
    }
  }
  return s;
}

struct NodeBudget {
  int64_t usable = 0;    // bytes the engine may use on this node
  int64_t kv_bytes = 0;  // bytes for KV (negative: short by that much)
};

NodeBudget BudgetFor(const Inputs& in, int64_t memory_budget, int64_t node_weight_bytes) {
  NodeBudget b;
  const cluster::ModelSpec& m = in.spec.model;
  if (m.kv_cache_bytes.has_value()) {
    b.usable = memory_budget;
    b.kv_bytes = *m.kv_cache_bytes;
    int64_t over = node_weight_bytes + in.reserve + *m.kv_cache_bytes - memory_budget;
    if (over > 0) b.kv_bytes = -over;
  } else {
    const double fraction = m.kv_cache_memory_fraction.value_or(kDefaultKvCacheMemoryFraction);
    b.usable = static_cast<int64_t>(fraction * static_cast<double>(memory_budget));
    b.kv_bytes = b.usable - node_weight_bytes - in.reserve;
    if (b.kv_bytes == 0) b.kv_bytes = -1;
  }
  return b;
}

// Tokens stage [first, last] holds on a node with `memory_budget` bytes; -1 when the weights do
// not fit.
int64_t StageCapacity(const Inputs& in, int first_layer, int last_layer, bool first, bool last,
                      int64_t memory_budget) {
  StageShape s = ShapeOf(in, first_layer, last_layer, first, last);
  NodeBudget b = BudgetFor(in, memory_budget, CeilDiv(s.stage_weight_bytes, in.spec.parallel.tensor));
  if (b.kv_bytes <= 0) return -1;
  return b.kv_bytes / s.kv_bytes_per_token;
}

// Proposes a contiguous partition maximizing the smallest per-stage KV capacity, then as even as
// that allows. `stage_budget[s]` is the smallest memory budget among the nodes of stage s.
std::vector<int> ProposePartition(const Inputs& in, const std::vector<int64_t>& stage_budget) {
  const int layers = in.model.num_hidden_layers;
  const int pp = static_cast<int>(stage_budget.size());
  auto capacity = [&](int stage, int first_layer, int count) {
    return StageCapacity(in, first_layer, first_layer + count - 1, stage == 0, stage == pp - 1,
                         stage_budget[stage]);
  };
  // Can stages `stage`.. hold layers `start`.. with capacity >= target each? Greedy: each stage
  // takes as many layers as it can while leaving one per remaining stage.
  std::function<bool(int, int, int64_t)> feasible = [&](int stage, int start, int64_t target) {
    for (int s = stage; s < pp; ++s) {
      const int remaining_stages = pp - s - 1;
      const int max_count = layers - start - remaining_stages;
      if (max_count < 1) return false;
      if (s == pp - 1) return capacity(s, start, max_count) >= target;
      int best = 0;
      for (int k = 1; k <= max_count && capacity(s, start, k) >= target; ++k) best = k;
      if (best == 0) return false;
      start += best;
    }
    return start == layers;
  };
  std::vector<int> even(pp, layers / pp);
  for (int s = 0; s < layers % pp; ++s) ++even[s];
  if (!feasible(0, 0, 0)) return even;  // nothing fits; the budget check reports it
  int64_t lo = 0;
  int64_t hi = int64_t{1} << 40;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (feasible(0, 0, mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t target = lo;
  // Balance: each stage takes the count closest to an even share that keeps `target` feasible
  // for the rest. O(pp^2 * layers^2) capacity lookups; beyond a few thousand, keep the greedy.
  if (int64_t{pp} * layers > 4096) {
    std::vector<int> greedy;
    int start = 0;
    for (int s = 0; s < pp; ++s) {
      int best = s == pp - 1 ? layers - start : 1;
      for (int k = 1; s < pp - 1 && k <= layers - start - (pp - s - 1); ++k) {
        if (capacity(s, start, k) >= target) best = k;
      }
      greedy.push_back(best);
      start += best;
    }
    return greedy;
  }
  std::vector<int> parts;
  int start = 0;
  for (int s = 0; s < pp; ++s) {
    const int remaining_stages = pp - s;
    if (remaining_stages == 1) {
      parts.push_back(layers - start);
      break;
    }
    const double ideal = static_cast<double>(layers - start) / remaining_stages;
    int chosen = -1;
    double chosen_gap = 1e9;
    for (int k = 1; k <= layers - start - (remaining_stages - 1); ++k) {
      if (capacity(s, start, k) < target || !feasible(s + 1, start + k, target)) continue;
      double gap = std::fabs(k - ideal);
      if (gap < chosen_gap) {
        chosen_gap = gap;
        chosen = k;
      }
    }
    if (chosen < 0) return even;  // cannot happen when target is feasible
    parts.push_back(chosen);
    start += chosen;
  }
  return parts;
}

}  // namespace

int64_t LatentKvBytesPerTokenLayer(const ModelConfig& config, cluster::KvCacheDtype dtype) {
  if (dtype == cluster::KvCacheDtype::kBf16)
    return (config.kv_lora_rank + config.qk_rope_head_dim) * 2;
  return config.kv_lora_rank + 2 * config.qk_rope_head_dim + 4 * CeilDiv(config.kv_lora_rank, 128);
}

int64_t IndexerKvBytesPerTokenLayer(const ModelConfig& config, cluster::KvCacheDtype dtype) {
  if (dtype == cluster::KvCacheDtype::kBf16) return 2 * config.index_head_dim;
  return config.index_head_dim + 4 * CeilDiv(config.index_head_dim, 128);
}

int64_t KvBytesPerToken(const ModelConfig& config, cluster::KvCacheDtype dtype, int first_layer,
                        int last_layer) {
  int64_t total = 0;
  for (int l = first_layer; l <= last_layer; ++l) {
    total += LatentKvBytesPerTokenLayer(config, dtype);
    if (config.HasIndexer(l)) total += IndexerKvBytesPerTokenLayer(config, dtype);
  }
  return total;
}

int64_t DefaultActivationReserveBytes(const ModelConfig& config) {
  return (int64_t{2} << 30) + int64_t{8192} * config.hidden_size * 32;
}

absl::StatusOr<Plan> MakePlan(const cluster::ClusterSpec& spec, const ModelConfig& model,
                              const WeightSizes& weights, const PlanOptions& options) {
  const cluster::ParallelSpec& par = spec.parallel;
  const cluster::ModelSpec& m = spec.model;
  const int tp = par.tensor;
  const int pp = par.pipeline;
  const int layers = model.num_hidden_layers;
  auto invalid = [&](const cluster::SourceLocation& loc, std::string_view field,
                     std::string_view what, std::string_view expected) {
    return absl::InvalidArgumentError(absl::StrCat(spec.Where(loc), ": field `", ToAbsl(field),
                                                   "`: ", ToAbsl(what), "; expected ",
                                                   ToAbsl(expected)));
  };

  // Inputs that need both the spec and the model.
  if (tp < 1 || pp < 1 || par.replicas < 1) {
    return invalid(cluster::SourceLocation{}, "parallel", "sizes must be >= 1", "positive sizes");
  }
  if (static_cast<int64_t>(spec.nodes.size()) != int64_t{tp} * pp * par.replicas) {
    return invalid(spec.nodes_location, "nodes",
                   absl::StrCat("has ", spec.nodes.size(), " entries but tensor × pipeline × ",
                                "replicas = ", tp * pp * par.replicas),
                   "one node per rank");
  }
  if (model.num_attention_heads % tp != 0) {
    return invalid(cluster::SourceLocation{}, "parallel.tensor",
                   absl::StrCat(tp, " does not divide the model's num_attention_heads = ",
                                model.num_attention_heads),
                   "a divisor of num_attention_heads (e.g. 1, 2, 4, 8)");
  }
  if (model.moe_intermediate_size % tp != 0 || model.intermediate_size % tp != 0) {
    return invalid(cluster::SourceLocation{}, "parallel.tensor",
                   absl::StrCat(tp, " does not divide moe_intermediate_size = ",
                                model.moe_intermediate_size, " and intermediate_size = ",
                                model.intermediate_size),
                   "a divisor of both");
  }
  if (pp > layers) {
    return invalid(cluster::SourceLocation{}, "parallel.pipeline",
                   absl::StrCat(pp, " stages for ", layers, " layers"),
                   "at most num_hidden_layers stages");
  }
  if (m.max_model_len > model.max_position_embeddings) {
    return invalid(m.max_model_len_location, "model.max_model_len",
                   absl::StrCat(Thousands(m.max_model_len),
                                " is longer than the model's max_position_embeddings ",
                                Thousands(model.max_position_embeddings)),
                   absl::StrCat("at most ", Thousands(model.max_position_embeddings)));
  }
  const bool mtp = m.mtp_draft_tokens > 0;
  if (mtp && model.num_mtp_layers() == 0) {
    return invalid(m.location, "model.mtp_draft_tokens",
                   absl::StrCat(m.mtp_draft_tokens, " but the checkpoint has no MTP layer ",
                                "(num_nextn_predict_layers = 0)"),
                   "0");
  }
  if (static_cast<int>(weights.layer_bytes.size()) < layers + (mtp ? 1 : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight sizes cover ", weights.layer_bytes.size(), " layers; expected ",
        layers + (mtp ? 1 : 0), " (decoder layers", mtp ? " + MTP" : "", ")"));
  }
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    if (!spec.nodes[i].memory_budget_bytes.has_value()) {
      return invalid(spec.nodes[i].location, absl::StrCat("nodes[", i, "].memory_budget_bytes"),
                     absl::StrCat("node ", spec.nodes[i].name, " has no memory budget"),
                     "memory_budget_bytes on the node or under node_defaults (e.g. 110GiB)");
    }
  }

  Inputs in(spec, model, weights, mtp,
            m.activation_reserve_bytes.value_or(DefaultActivationReserveBytes(model)));
  auto node_at = [&](int replica, int pp_rank, int tp_rank) {
    return replica * pp * tp + pp_rank * tp + tp_rank;
  };

  Plan plan;
  plan.cluster_name = spec.name;
  plan.served_name = m.served_name;
  plan.tensor = tp;
  plan.pipeline = pp;
  plan.replicas = par.replicas;
  plan.world_size = tp * pp * par.replicas;
  plan.kv_cache_dtype = m.kv_cache_dtype;
  plan.backend = m.backend;
  plan.weight_dtype = m.weight_dtype;
  plan.mtp = mtp;
  plan.weight_source = weights.source;
  plan.total_weight_bytes = weights.total_bytes();
  plan.model_kv_bytes_per_token = KvBytesPerToken(model, m.kv_cache_dtype, 0, layers - 1) +
                                  (mtp ? KvBytesPerToken(model, m.kv_cache_dtype, layers, layers) : 0);
  plan.max_model_len = m.max_model_len;
  plan.max_num_seqs = m.max_num_seqs;
  plan.required_tokens = m.max_model_len * m.max_num_seqs;
  plan.max_position_embeddings = model.max_position_embeddings;

  // Layer partition.
  if (!par.layer_partition.empty()) {
    if (static_cast<int>(par.layer_partition.size()) != pp) {
      return invalid(par.layer_partition_location, "parallel.layer_partition",
                     absl::StrCat("has ", par.layer_partition.size(), " entries for ", pp,
                                  " pipeline stages"),
                     "one layer count per stage");
    }
    int64_t sum = 0;
    for (int p : par.layer_partition) sum += p;
    if (sum != layers) {
      return invalid(par.layer_partition_location, "parallel.layer_partition",
                     absl::StrCat("sums to ", sum, " layers but the model has num_hidden_layers = ",
                                  layers),
                     absl::StrCat("counts that add up to ", layers,
                                  " (the MTP layer is not counted; it goes on the last stage)"));
    }
    plan.layer_partition = par.layer_partition;
  } else {
    std::vector<int64_t> stage_budget(pp, std::numeric_limits<int64_t>::max());
    for (int r = 0; r < par.replicas; ++r) {
      for (int s = 0; s < pp; ++s) {
        for (int t = 0; t < tp; ++t) {
          stage_budget[s] = std::min(stage_budget[s],
                                     *spec.nodes[node_at(r, s, t)].memory_budget_bytes);
        }
      }
    }
    plan.layer_partition = pp == 1 ? std::vector<int>{layers} : ProposePartition(in, stage_budget);
    plan.partition_proposed = true;
  }

  // Stages and nodes.
  std::vector<std::string> shortfalls;
  plan.nodes.resize(spec.nodes.size());
  int first_layer = 0;
  for (int s = 0; s < pp; ++s) {
    const int count = plan.layer_partition[s];
    StageShape shape = ShapeOf(in, first_layer, first_layer + count - 1, s == 0, s == pp - 1);
    PlanStage stage;
    stage.pp_rank = s;
    stage.first_layer = shape.first_layer;
    stage.last_layer = shape.last_layer;
    stage.has_embedding = shape.first;
    stage.has_lm_head = shape.last;
    stage.has_mtp = shape.last && mtp;
    stage.num_full_indexer_layers = shape.full_indexers;
    stage.weight_bytes = CeilDiv(shape.stage_weight_bytes, tp);
    stage.kv_bytes_per_token = shape.kv_bytes_per_token;
    stage.kv_capacity_tokens = std::numeric_limits<int64_t>::max();
    for (int r = 0; r < par.replicas; ++r) {
      for (int t = 0; t < tp; ++t) {
        const int rank = node_at(r, s, t);
        const cluster::NodeSpec& ns = spec.nodes[rank];
        PlanNode& node = plan.nodes[rank];
        node.name = ns.name;
        node.rank = rank;
        node.replica = r;
        node.pp_rank = s;
        node.tp_rank = t;
        node.memory_budget_bytes = *ns.memory_budget_bytes;
        node.weight_bytes = stage.weight_bytes;
        node.reserve_bytes = in.reserve;
        node.kv_bytes_per_token = stage.kv_bytes_per_token;
        NodeBudget b = BudgetFor(in, node.memory_budget_bytes, node.weight_bytes);
        node.usable_bytes = b.usable;
        if (b.kv_bytes <= 0) {
          const int64_t short_by = -b.kv_bytes;
          std::string budget_text =
              m.kv_cache_bytes.has_value()
                  ? absl::StrCat("weights ", GiB(node.weight_bytes), " + reserve ", GiB(in.reserve),
                                 " + kv_cache_bytes ", GiB(*m.kv_cache_bytes), " > budget ",
                                 GiB(node.memory_budget_bytes))
                  : absl::StrCat("weights ", GiB(node.weight_bytes), " + reserve ", GiB(in.reserve),
                                 " > budget ", GiB(b.usable), " (",
                                 absl::StrFormat("%.2f", m.kv_cache_memory_fraction.value_or(
                                                             kDefaultKvCacheMemoryFraction)),
                                 " × memory_budget_bytes ", GiB(node.memory_budget_bytes), ")");
          shortfalls.push_back(absl::StrCat(
              "node ", ns.name, " (pp stage ", s, ", layers ", stage.first_layer, "-",
              stage.last_layer, ") needs ", GiB(short_by), " more: ", budget_text,
              " and leaves no room for the KV cache"));
          node.kv_cache_bytes = 0;
          node.kv_capacity_tokens = 0;
        } else {
          node.kv_cache_bytes = b.kv_bytes;
          node.kv_capacity_tokens = b.kv_bytes / node.kv_bytes_per_token;
        }
        stage.kv_capacity_tokens = std::min(stage.kv_capacity_tokens, node.kv_capacity_tokens);
        stage.nodes.push_back(ns.name);  // rank order: replica-major, then tp_rank
      }
    }
    plan.stages.push_back(std::move(stage));
    first_layer += count;
  }
  if (!shortfalls.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        spec.source, ": the plan does not fit:\n  ", absl::StrJoin(shortfalls, "\n  "),
        "\nfix: add nodes or pipeline stages, move layers off the short stage with "
        "parallel.layer_partition, or raise memory_budget_bytes"));
  }

  int64_t capacity = std::numeric_limits<int64_t>::max();
  for (const auto& node : plan.nodes) capacity = std::min(capacity, node.kv_capacity_tokens);
  plan.max_context_tokens = std::min(capacity, model.max_position_embeddings);
  if (capacity < m.max_model_len) {
    std::vector<std::string> lines;
    for (const auto& node : plan.nodes) {
      if (node.kv_capacity_tokens >= m.max_model_len) continue;
      const int64_t need = (m.max_model_len - node.kv_capacity_tokens) * node.kv_bytes_per_token;
      lines.push_back(absl::StrCat("node ", node.name, " (pp stage ", node.pp_rank, ") holds ",
                                   Thousands(node.kv_capacity_tokens), " tokens of KV (",
                                   Thousands(node.kv_bytes_per_token), " B/token); needs ",
                                   GiB(need), " more for one ", Thousands(m.max_model_len),
                                   "-token sequence"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        spec.Where(m.max_model_len_location), ": field `model.max_model_len`: ",
        Thousands(m.max_model_len), " tokens do not fit in the KV cache:\n  ",
        absl::StrJoin(lines, "\n  "), "\nexpected max_model_len <= ", Thousands(capacity),
        ", or more KV memory (kv_cache_bytes / kv_cache_memory_fraction / memory_budget_bytes)"));
  }
  plan.fits = capacity >= plan.required_tokens;
  if (!plan.fits) {
    plan.notes.push_back(absl::StrCat(
        "max_model_len × max_num_seqs = ", Thousands(m.max_model_len), " × ", m.max_num_seqs,
        " = ", Thousands(plan.required_tokens), " tokens exceed the KV capacity of ",
        Thousands(capacity), " tokens; at most ", capacity / m.max_model_len,
        " full-length sequences fit at once (the scheduler queues the rest)"));
  }
  if (weights.source == WeightSizes::Source::kEstimated) {
    plan.notes.push_back("weight bytes are estimated from config.json (no safetensors found)");
  }
  GLM_ASSIGN_OR_RETURN(plan.decode, ProjectDecode(plan, spec, model, weights, options.decode));
  if (!plan.decode.made) plan.notes.push_back(plan.decode.not_made);
  if (options.decode.mtp_acceptance_rate.has_value() && !mtp) {
    plan.notes.push_back(
        "--mtp-acceptance has no effect: model.mtp_draft_tokens is 0 (MTP drafting off)");
  }
  return plan;
}

absl::StatusOr<Plan> PlanFromFiles(const std::string& cluster_yaml_path,
                                   const PlanOptions& options) {
  GLM_ASSIGN_OR_RETURN(cluster::ClusterSpec spec, cluster::LoadClusterSpec(cluster_yaml_path));
  const std::string model_dir = spec.ResolvePath(spec.model.path);
  auto model = engine::LoadModelConfig(model_dir);
  if (!model.ok()) {
    return Annotate(model.status(),
                    absl::StrCat(spec.Where(spec.model.location), ": model.path ",
                                 spec.model.path, " (resolved to ", model_dir, ")"));
  }
  GLM_ASSIGN_OR_RETURN(WeightSizes weights, LoadWeightSizes(model_dir, *model));
  return MakePlan(spec, *model, weights, options);
}

}  // namespace glm::controller
