// Single-stream decode rate of one replica, projected from the plan: how long one decode step
// takes when every node streams the weights its rank reads per token at a measured fraction of
// its memory bandwidth, plus the fabric messages of the step. Pure functions.
//
// Model (batch 1; every figure per replica, shown by `glmctl plan` with its inputs):
//   bytes per token, per rank of stage s = ceil(A_s / tensor), where A_s sums over the stage's
//     decoder layers  layer_bytes - routed + routed × num_experts_per_tok / n_routed_experts
//     (routed = the layer's mlp.experts.* bytes: read from the safetensors headers, else the
//     config's shapes as weight_sizes.cc counts them), plus lm_head + final norm on the last
//     stage. The embedding (one row per token), other tensors and the KV cache reads (~2 MB per
//     layer at 4K context, under 1 %) are not counted.
//   compute time of stage s = bytes / (bandwidth × efficiency), bandwidth and efficiency of the
//     stage's slowest node (its TP peers wait for it); stages run one after another.
//   all-reduce (tensor > 1): 2 per decoder layer (attention, MLP), each a ring over the TP group:
//     2 (tensor - 1) × (hop latency + hidden_size × 4 B (fp32, engine/dist/communicator.h) ×
//     tokens / tensor / link bandwidth).
//   hops (engine/pipeline/stage_group.h): the head's step broadcast when the replica has more
//     than one rank; pipeline - 1 activation hand-offs of hidden_size × 4 B per token; the last
//     stage's result back to the head when pipeline > 1. Each: hop latency + bytes / link.
//   step time (k = 0) = Σ compute + all-reduces + hops; tokens/s = 1 / step time.
//   Micro-batches (pipeline > 1; m = parallel.micro_batches, default pipeline, at most
//     model.max_num_seqs): with m sequences decoding at once the head keeps m steps in flight
//     (a sequence is in one step at a time), so stages work on different
//     steps. A stage is busy per step for its compute and its layers' all-reduces (hand-offs
//     overlap other steps' compute); the busiest stage bounds the rate: m sequences together
//     make m / max(step time, m × busiest stage) tokens/s (each sequence still its own step
//     time per token while the stages keep up).
//   MTP (k = model.mtp_draft_tokens > 0): with per-position acceptance a (a draft is accepted
//     with probability a when the drafts before it were), tokens per step = 1 + a + ... + a^k
//     = 1 + k r, where r = accepted / drafted drafts is the rate `glmctl status` measures
//     (spec_decode.acceptance_rate); step = verify (the k + 1 tokens in one main step: weight
//     bytes as one token when the drafts' routed experts overlap the first token's,
//     communication for k + 1 tokens) + k draft passes (each: the MTP layer's active bytes + lm_head, on the last stage,
//     2 all-reduces when tensor > 1, the broadcast and the result hop); tokens/s = tokens per
//     step / step. The low figure charges the verify step the distinct routed experts of k + 1
//     independently (uniformly) routed tokens, E (1 - (1 - top_k / E)^(k+1)), as
//     docs/benchmarks.md counts them for batches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/spec/cluster_spec.h"
#include "engine/config/model_config.h"

namespace glm::controller {

struct Plan;
struct WeightSizes;

// Fraction of a node's spec memory bandwidth one batch-1 decode step reaches, measured on the
// H200 (docs/benchmarks.md, "Decode step per layer", batch 1, 4,096 context: 0.217 ms per layer
// at 0.563 of the 4,236-4,277 GB/s device-to-device copy rate; the layer reads
// 0.563 × 4,256 GB/s × 0.217 ms ≈ 520 MB, i.e. it streams at ≈ 2.40 TB/s = 0.50 of the H200's
// 4.8 TB/s). A node's `memory_bandwidth_efficiency` in cluster.yaml replaces it.
inline constexpr double kMeasuredDecodeBandwidthEfficiency = 0.50;
// MTP per-position acceptance a when `glmctl plan --mtp-acceptance` is not given: an assumption
// (with k = 4 it means r = 0.443 of drafts accepted, 2.77 tokens per step). A running cluster's
// measured r is `glmctl status`'s spec_decode.acceptance_rate; pass it with --mtp-acceptance.
inline constexpr double kAssumedMtpAcceptance = 0.7;
// fabric.link_bandwidth / fabric.hop_latency_us when cluster.yaml leaves them out (assumed:
// a 200G RoCE NIC; one Gloo message between two nodes).
inline constexpr double kDefaultLinkBandwidthBytesPerS = 25e9;  // 200 Gb/s
inline constexpr double kDefaultHopLatencyUs = 10.0;

struct DecodeProjectionOptions {
  // Accepted / drafted draft tokens, in [0, 1], as `glmctl status` reports it; nullopt: the rate
  // kAssumedMtpAcceptance gives.
  std::optional<double> mtp_acceptance_rate;
};

struct DecodeStageProjection {
  int pp_rank = 0;
  int64_t bytes_per_token = 0;       // per rank, one decode token
  int64_t mtp_bytes_per_pass = 0;    // per rank, one MTP draft pass (last stage with MTP)
  int64_t verify_bytes_uniform = 0;  // per rank, the verify step under uniform routing
  std::string node;                  // the stage's slowest node (in this replica)
  double memory_bandwidth_bytes_per_s = 0;
  double efficiency = 0;
  bool efficiency_measured = true;  // kMeasuredDecodeBandwidthEfficiency, not the YAML's
  double seconds = 0;               // bytes_per_token / (bandwidth × efficiency)
  double busy_seconds = 0;          // per step: seconds + its layers' all-reduces
};

struct DecodeReplicaProjection {
  int replica = 0;
  std::vector<DecodeStageProjection> stages;
  int allreduces_per_token = 0;
  double allreduce_seconds = 0;  // one, one token
  int hops_per_token = 0;
  double hop_seconds = 0;      // all hops of one decode step, summed
  double compute_seconds = 0;  // Σ stage seconds
  double step_seconds = 0;     // k = 0
  double tokens_per_s = 0;     // k = 0
  // Micro-batches (pipeline > 1): m steps in flight, the busiest stage's busy time, and the
  // tokens/s of m sequences together (k = 0).
  int micro_batches = 1;
  int busiest_stage = 0;
  double busiest_stage_seconds = 0;
  double pipelined_tokens_per_s = 0;
  // MTP, when k > 0.
  double verify_seconds = 0;
  double verify_seconds_uniform = 0;
  double mtp_pass_seconds = 0;  // one draft pass
  double tokens_per_step = 1;
  double mtp_step_seconds = 0;
  double mtp_tokens_per_s = 0;
  double mtp_tokens_per_s_uniform = 0;  // low figure (uniform routing in the verify step)
};

struct DecodeProjection {
  bool made = false;
  std::string not_made;  // why not, and what to set
  double link_bandwidth_bytes_per_s = kDefaultLinkBandwidthBytesPerS;
  bool link_bandwidth_assumed = true;
  double hop_latency_us = kDefaultHopLatencyUs;
  bool hop_latency_assumed = true;
  int64_t activation_bytes_per_token = 0;  // hidden_size × 4 (fp32)
  // A stage that starts on a shared-indexer layer also receives the previous layer's top-k
  // (index_topk int32 per token); how many of the replica's PP boundaries do.
  int64_t topk_bytes_per_token = 0;
  int shared_indexer_boundaries = 0;
  int num_experts_per_tok = 0;
  int n_routed_experts = 0;
  int mtp_draft_tokens = 0;                       // k
  double mtp_acceptance = kAssumedMtpAcceptance;  // per position, a
  double mtp_acceptance_rate = 0;                 // accepted / drafted, r (k > 0)
  bool mtp_acceptance_assumed = true;
  std::vector<DecodeReplicaProjection> replicas;
};

// Expected distinct routed experts that `rows` tokens activate in one MoE layer when each picks
// num_experts_per_tok of n_routed_experts uniformly: E (1 - (1 - top_k / E)^rows).
double ExpectedDistinctExperts(int n_routed_experts, int num_experts_per_tok, int rows);

// r = (a + a^2 + ... + a^k) / k: the share of drafts accepted at per-position acceptance a.
double MtpAcceptanceRate(double per_position, int k);
// The a whose MtpAcceptanceRate is `rate` (rate in [0, 1], k >= 1).
double MtpPerPositionAcceptance(double rate, int k);

// Projects every replica of `plan`. Hardware comes from `spec` (nodes' memory_bandwidth and
// memory_bandwidth_efficiency, fabric.link_bandwidth and hop_latency_us). A replica whose nodes
// lack memory_bandwidth gives made = false with `not_made` naming them and the field to set.
// InvalidArgument when options.mtp_acceptance_rate is outside [0, 1].
absl::StatusOr<DecodeProjection> ProjectDecode(const Plan& plan, const cluster::ClusterSpec& spec,
                                               const engine::ModelConfig& model,
                                               const WeightSizes& weights,
                                               const DecodeProjectionOptions& options);

}  // namespace glm::controller
