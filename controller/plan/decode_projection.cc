#include "controller/plan/decode_projection.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"
#include "controller/plan/plan.h"

namespace glm::controller {
namespace {

using engine::ModelConfig;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Routed-expert bytes per layer: the checkpoint's when known, else the layer's bytes times the
// routed share that config.json's shapes give.
std::vector<int64_t> RoutedBytes(const ModelConfig& model, const WeightSizes& weights) {
  if (weights.routed_expert_bytes.size() == weights.layer_bytes.size()) {
    return weights.routed_expert_bytes;
  }
  std::vector<int64_t> routed(weights.layer_bytes.size(), 0);
  absl::StatusOr<WeightSizes> shapes = EstimateWeightSizes(model);
  if (!shapes.ok()) return routed;
  for (size_t l = 0; l < routed.size() && l < shapes->layer_bytes.size(); ++l) {
    if (shapes->layer_bytes[l] <= 0) continue;
    const long double share = static_cast<long double>(shapes->routed_expert_bytes[l]) /
                              static_cast<long double>(shapes->layer_bytes[l]);
    routed[l] = static_cast<int64_t>(share * static_cast<long double>(weights.layer_bytes[l]));
  }
  return routed;
}

// Bytes of layer l that `experts` distinct routed experts (of E) leave to read.
double ActiveLayerBytes(const WeightSizes& weights, const std::vector<int64_t>& routed, int l,
                        double experts, int n_routed_experts) {
  const double r = static_cast<double>(routed[l]);
  const double fraction =
      n_routed_experts > 0 ? std::min(1.0, experts / static_cast<double>(n_routed_experts)) : 1.0;
  return static_cast<double>(weights.layer_bytes[l]) - r + r * fraction;
}

}  // namespace

double ExpectedDistinctExperts(int n_routed_experts, int num_experts_per_tok, int rows) {
  if (n_routed_experts <= 0) return 0;
  const double e = n_routed_experts;
  const double p = std::min(1.0, num_experts_per_tok / e);
  return e * (1.0 - std::pow(1.0 - p, rows));
}

double MtpAcceptanceRate(double per_position, int k) {
  if (k <= 0) return 0;
  double sum = 0;
  for (int i = 1; i <= k; ++i) sum += std::pow(per_position, i);
  return sum / k;
}

double MtpPerPositionAcceptance(double rate, int k) {
  double lo = 0;
  double hi = 1;
  for (int i = 0; i < 60; ++i) {  // MtpAcceptanceRate rises with a; bisect to 1e-18
    const double mid = (lo + hi) / 2;
    (MtpAcceptanceRate(mid, k) < rate ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

absl::StatusOr<DecodeProjection> ProjectDecode(const Plan& plan, const cluster::ClusterSpec& spec,
                                               const ModelConfig& model, const WeightSizes& weights,
                                               const DecodeProjectionOptions& options) {
  DecodeProjection out;
  out.mtp_draft_tokens = plan.mtp ? spec.model.mtp_draft_tokens : 0;
  if (options.mtp_acceptance_rate.has_value()) {
    const double r = *options.mtp_acceptance_rate;
    if (!(r >= 0.0 && r <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mtp-acceptance ", r,
          " is not a fraction; expected a number in [0, 1]: accepted / "
          "drafted draft tokens, as `glmctl status` reports spec_decode.acceptance_rate"));
    }
    out.mtp_acceptance_rate = r;
    out.mtp_acceptance_assumed = false;
    if (out.mtp_draft_tokens > 0) {
      out.mtp_acceptance = MtpPerPositionAcceptance(r, out.mtp_draft_tokens);
    }
  } else if (out.mtp_draft_tokens > 0) {
    out.mtp_acceptance_rate = MtpAcceptanceRate(out.mtp_acceptance, out.mtp_draft_tokens);
  }
  if (spec.fabric.link_bandwidth_bytes_per_s.has_value()) {
    out.link_bandwidth_bytes_per_s = *spec.fabric.link_bandwidth_bytes_per_s;
    out.link_bandwidth_assumed = false;
  }
  if (spec.fabric.hop_latency_us.has_value()) {
    out.hop_latency_us = *spec.fabric.hop_latency_us;
    out.hop_latency_assumed = false;
  }
  out.activation_bytes_per_token = model.hidden_size * 4;
  out.topk_bytes_per_token = int64_t{model.index_topk} * 4;
  for (const PlanStage& stage : plan.stages) {
    if (stage.pp_rank > 0 && stage.first_layer < static_cast<int>(model.indexer_types.size()) &&
        model.indexer_types[stage.first_layer] == engine::IndexerType::kShared) {
      ++out.shared_indexer_boundaries;
    }
  }
  out.num_experts_per_tok = model.num_experts_per_tok;
  out.n_routed_experts = model.n_routed_experts;

  std::vector<std::string> missing;
  for (const auto& node : spec.nodes) {
    if (!node.memory_bandwidth_bytes_per_s.has_value()) missing.push_back(node.name);
  }
  if (!missing.empty()) {
    const std::string who =
        missing.size() == spec.nodes.size()
            ? std::string("no node has")
            : absl::StrCat("node", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
                           " ha", missing.size() > 1 ? "ve" : "s", " no");
    out.not_made = absl::StrCat(
        "no decode projection: ", who,
        " memory_bandwidth; set node_defaults.memory_bandwidth (or the node's own), e.g. 273GB/s "
        "for a DGX Spark, 3.35TB/s for an H100 SXM, 4.8TB/s for an H200");
    return out;
  }
  if (plan.nodes.size() != spec.nodes.size() || plan.stages.empty() ||
      weights.layer_bytes.size() < static_cast<size_t>(model.num_hidden_layers)) {
    return absl::InvalidArgumentError(
        "decode projection: the plan does not match the cluster spec and weight sizes; expected "
        "the plan MakePlan made from them");
  }

  const std::vector<int64_t> routed = RoutedBytes(model, weights);
  const int tp = plan.tensor;
  const int pp = plan.pipeline;
  const int k = out.mtp_draft_tokens;
  const double link = out.link_bandwidth_bytes_per_s;
  const double hop_latency = out.hop_latency_us * 1e-6;
  const double act = static_cast<double>(out.activation_bytes_per_token);
  const double one_token_experts =
      std::min<double>(model.num_experts_per_tok, model.n_routed_experts);
  const double verify_experts =
      ExpectedDistinctExperts(model.n_routed_experts, model.num_experts_per_tok, k + 1);
  // Ring all-reduce of `tokens` fp32 rows over the TP group.
  auto allreduce = [&](int tokens) {
    return 2.0 * (tp - 1) * (hop_latency + act * tokens / tp / link);
  };
  const double topk = static_cast<double>(out.topk_bytes_per_token);
  const int topk_boundaries = out.shared_indexer_boundaries;
  // The step's hops: broadcast, pp - 1 activation hand-offs (+ the top-k where a stage starts
  // on a shared-indexer layer), the result.
  auto step_hops = [&](int tokens, int* count) {
    double seconds = 0;
    *count = 0;
    if (plan.world_size / plan.replicas > 1) {
      seconds += hop_latency;
      ++*count;
    }
    seconds += (pp - 1) * (hop_latency + act * tokens / link) +
               topk_boundaries * topk * tokens / link;
    *count += pp - 1;
    if (pp > 1) {
      seconds += hop_latency;
      ++*count;
    }
    return seconds;
  };
  const int mtp_layer = model.num_hidden_layers;
  const bool has_mtp_bytes = k > 0 && static_cast<int>(weights.layer_bytes.size()) > mtp_layer;

  for (int r = 0; r < plan.replicas; ++r) {
    DecodeReplicaProjection rep;
    rep.replica = r;
    double verify_compute_uniform = 0;
    for (const PlanStage& stage : plan.stages) {
      DecodeStageProjection sp;
      sp.pp_rank = stage.pp_rank;
      double bytes = 0;
      double bytes_uniform = 0;
      for (int l = stage.first_layer; l <= stage.last_layer; ++l) {
        bytes += ActiveLayerBytes(weights, routed, l, one_token_experts, model.n_routed_experts);
        bytes_uniform +=
            ActiveLayerBytes(weights, routed, l, verify_experts, model.n_routed_experts);
      }
      const double head = static_cast<double>(weights.lm_head_bytes + weights.final_norm_bytes);
      if (stage.has_lm_head) {
        bytes += head;
        bytes_uniform += head;
      }
      sp.bytes_per_token = CeilDiv(static_cast<int64_t>(std::llround(bytes)), tp);
      sp.verify_bytes_uniform = CeilDiv(static_cast<int64_t>(std::llround(bytes_uniform)), tp);
      if (stage.has_lm_head && has_mtp_bytes) {
        const double mtp = ActiveLayerBytes(weights, routed, mtp_layer, one_token_experts,
                                            model.n_routed_experts) +
                           head;
        sp.mtp_bytes_per_pass = CeilDiv(static_cast<int64_t>(std::llround(mtp)), tp);
      }
      // The stage's slowest node in this replica.
      double best = -1;
      for (int t = 0; t < tp; ++t) {
        const int rank = r * pp * tp + stage.pp_rank * tp + t;
        const cluster::NodeSpec& ns = spec.nodes[rank];
        const double eff =
            ns.memory_bandwidth_efficiency.value_or(kMeasuredDecodeBandwidthEfficiency);
        const double rate = *ns.memory_bandwidth_bytes_per_s * eff;
        if (best < 0 || rate < best) {
          best = rate;
          sp.node = ns.name;
          sp.memory_bandwidth_bytes_per_s = *ns.memory_bandwidth_bytes_per_s;
          sp.efficiency = eff;
          sp.efficiency_measured = !ns.memory_bandwidth_efficiency.has_value();
        }
      }
      sp.seconds = static_cast<double>(sp.bytes_per_token) / best;
      sp.busy_seconds = sp.seconds + (tp > 1 ? 2.0 * (stage.last_layer - stage.first_layer + 1) *
                                                   allreduce(1)
                                             : 0.0);
      rep.compute_seconds += sp.seconds;
      verify_compute_uniform += static_cast<double>(sp.verify_bytes_uniform) / best;
      if (sp.mtp_bytes_per_pass > 0) {
        rep.mtp_pass_seconds = static_cast<double>(sp.mtp_bytes_per_pass) / best;
      }
      rep.stages.push_back(std::move(sp));
    }
    rep.allreduces_per_token = tp > 1 ? 2 * model.num_hidden_layers : 0;
    rep.allreduce_seconds = tp > 1 ? allreduce(1) : 0;
    rep.hop_seconds = step_hops(1, &rep.hops_per_token);
    rep.step_seconds =
        rep.compute_seconds + rep.allreduces_per_token * rep.allreduce_seconds + rep.hop_seconds;
    rep.tokens_per_s = rep.step_seconds > 0 ? 1.0 / rep.step_seconds : 0.0;
    // A sequence is in at most one step at a time: m steps need m sequences.
    rep.micro_batches =
        pp > 1 ? std::max(1, std::min({spec.parallel.micro_batches > 0
                                           ? std::min(spec.parallel.micro_batches, pp)
                                           : pp,
                                       spec.model.max_num_seqs}))
               : 1;
    for (const DecodeStageProjection& sp : rep.stages) {
      if (sp.busy_seconds > rep.busiest_stage_seconds) {
        rep.busiest_stage_seconds = sp.busy_seconds;
        rep.busiest_stage = sp.pp_rank;
      }
    }
    const double cycle =
        std::max(rep.step_seconds, rep.micro_batches * rep.busiest_stage_seconds);
    rep.pipelined_tokens_per_s = cycle > 0 ? rep.micro_batches / cycle : 0.0;
    if (k > 0) {
      int hops = 0;
      const double verify_comm =
          rep.allreduces_per_token * (tp > 1 ? allreduce(k + 1) : 0.0) + step_hops(k + 1, &hops);
      rep.verify_seconds = rep.compute_seconds + verify_comm;
      rep.verify_seconds_uniform = verify_compute_uniform + verify_comm;
      // A draft pass: the MTP layer's 2 all-reduces, the head's broadcast and the result.
      rep.mtp_pass_seconds += (tp > 1 ? 2 * allreduce(1) : 0.0) +
                              (plan.world_size / plan.replicas > 1 ? hop_latency : 0.0) +
                              (pp > 1 ? hop_latency : 0.0);
      rep.tokens_per_step = 1.0 + k * out.mtp_acceptance_rate;
      rep.mtp_step_seconds = rep.verify_seconds + k * rep.mtp_pass_seconds;
      const double uniform_step = rep.verify_seconds_uniform + k * rep.mtp_pass_seconds;
      rep.mtp_tokens_per_s =
          rep.mtp_step_seconds > 0 ? rep.tokens_per_step / rep.mtp_step_seconds : 0.0;
      rep.mtp_tokens_per_s_uniform = uniform_step > 0 ? rep.tokens_per_step / uniform_step : 0.0;
    }
    out.replicas.push_back(std::move(rep));
  }
  out.made = true;
  return out;
}

}  // namespace glm::controller
