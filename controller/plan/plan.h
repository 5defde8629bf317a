// The planner: from a ClusterSpec and the model's config.json (plus weight sizes) compute the
// topology (ranks, replicas, TP groups, PP stages with layer ranges) and the per-node memory
// budget (weights, activation reserve, KV cache) and KV capacity. Pure functions; no I/O except
// in Load*/PlanFromFiles.
//
// Placement: global rank = replica * (pipeline * tensor) + pp_rank * tensor + tp_rank, and rank r
// runs on nodes[r] of the YAML. The embedding sits on PP stage 0; the final norm, lm_head and (when
// MTP drafting is on) the MTP layer sit on the last stage. TP shards every weight of a stage
// (node weight bytes = ceil(stage bytes / tensor)). The MLA latent KV has one head, so every TP
// rank holds the full per-token latent for its stage's layers; PP splits the KV by layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/spec/cluster_spec.h"
#include "controller/plan/decode_projection.h"
#include "engine/config/model_config.h"
#include "nlohmann/json.hpp"

namespace glm::controller {

// Checkpoint weight bytes grouped the way the planner places them.
struct WeightSizes {
  enum class Source {
    kEstimated,          // from config.json shapes and dtype/quantization
    kIndexTotal,         // estimate scaled to model.safetensors.index.json metadata.total_size
    kSafetensorsHeaders  // exact, summed from the *.safetensors headers
  };
  Source source = Source::kEstimated;
  // [num_hidden_layers + num_mtp_layers]: decoder layers 0..L-1, then MTP layers.
  std::vector<int64_t> layer_bytes;
  // [same as layer_bytes]: the part of each layer in its routed experts (mlp.experts.*, all
  // n_routed_experts); 0 for dense layers. Empty when unknown.
  std::vector<int64_t> routed_expert_bytes;
  int64_t embedding_bytes = 0;   // model.embed_tokens
  int64_t lm_head_bytes = 0;     // lm_head
  int64_t final_norm_bytes = 0;  // model.norm
  int64_t other_bytes = 0;       // tensors outside these groups; placed on stage 0

  int64_t total_bytes() const;
};
std::string_view WeightSourceName(WeightSizes::Source source);

// Shapes from spec §4: fp8 tensors cost 1 byte per element + one f32 scale per
// block_rows x block_cols block; unquantized tensors (norms, router, indexer weights_proj,
// embeddings, lm_head, MTP eh_proj) cost 2 bytes (bf16), or 4 when torch_dtype is float32.
// compressed-tensors and NVFP4 checkpoints (specs/quantized-checkpoints.md §5.1): each linear
// module the quantization_config targets (and does not ignore) costs bits/8 bytes per element +
// a BF16 scale per group (or per row) + 16 bytes of weight_shape (INT4/INT8), or 0.5 byte per
// element + an E4M3 scale per 16 + 8 bytes of global/input scales (NVFP4); routed experts use
// expert 0's encoding. The router is counted at the plain dtype (QuantTrio's FP32 routers are
// 0.24 GB more than the estimate).
// Indexer tensors are counted only on layers with a full indexer (and on MTP layers).
absl::StatusOr<WeightSizes> EstimateWeightSizes(const engine::ModelConfig& config);

// Reads `model_dir`: exact sizes from *.safetensors headers when shards are present, else the
// estimate scaled to model.safetensors.index.json's metadata.total_size when that exists, else
// the estimate.
absl::StatusOr<WeightSizes> LoadWeightSizes(const std::string& model_dir,
                                            const engine::ModelConfig& config);

// KV bytes per token for one layer (spec §5).
//   MLA latent: bf16 (kv_lora_rank + qk_rope_head_dim) * 2; fp8 (FlashMLA fp8_ds_mla)
//   kv_lora_rank fp8 + qk_rope_head_dim bf16 + one f32 scale per 128 latent dims.
//   Indexer key (full-indexer layers only): fp8 index_head_dim + one f32 scale per 128 dims;
//   bf16 2 * index_head_dim. The indexer cache uses the same dtype choice as the latent.
int64_t LatentKvBytesPerTokenLayer(const engine::ModelConfig& config, cluster::KvCacheDtype dtype);
int64_t IndexerKvBytesPerTokenLayer(const engine::ModelConfig& config, cluster::KvCacheDtype dtype);
// Sum over layers first..last (inclusive; indices >= num_hidden_layers are MTP layers).
int64_t KvBytesPerToken(const engine::ModelConfig& config, cluster::KvCacheDtype dtype,
                        int first_layer, int last_layer);

// Default activation/workspace reserve per node when the YAML does not set
// model.activation_reserve_bytes: 2 GiB (CUDA context, NCCL buffers, GEMM workspaces) plus
// 8192 prefill tokens x hidden_size x 32 bytes of activations.
int64_t DefaultActivationReserveBytes(const engine::ModelConfig& config);
// Fraction of the memory budget the engine may use when neither kv_cache_bytes nor
// kv_cache_memory_fraction is given.
inline constexpr double kDefaultKvCacheMemoryFraction = 0.9;

struct PlanNode {
  std::string name;
  int rank = 0;
  int replica = 0;
  int pp_rank = 0;
  int tp_rank = 0;
  int64_t memory_budget_bytes = 0;
  int64_t usable_bytes = 0;        // fraction x budget (or the whole budget with kv_cache_bytes)
  int64_t weight_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t kv_cache_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t kv_capacity_tokens = 0;
};

struct PlanStage {
  int pp_rank = 0;
  int first_layer = 0;  // inclusive
  int last_layer = 0;   // inclusive, decoder layers only
  bool has_embedding = false;
  bool has_lm_head = false;  // also the final norm
  bool has_mtp = false;      // MTP layer (index num_hidden_layers) placed here
  int num_full_indexer_layers = 0;  // including the MTP layer when present
  std::vector<std::string> nodes;   // every replica's nodes at this pp_rank, rank order
  int64_t weight_bytes = 0;         // per node
  int64_t kv_bytes_per_token = 0;   // per node
  int64_t kv_capacity_tokens = 0;   // min over this stage's nodes
};

struct Plan {
  std::string cluster_name;
  std::string served_name;
  int tensor = 1;
  int pipeline = 1;
  int replicas = 1;
  int world_size = 1;
  std::vector<int> layer_partition;
  bool partition_proposed = false;  // true when the planner chose layer_partition
  cluster::KvCacheDtype kv_cache_dtype = cluster::KvCacheDtype::kFp8;
  // model.backend / model.weight_dtype, sent to every node's engine as stated ("auto": each
  // node's agent picks). Weight bytes above are the checkpoint's, whatever the storage.
  cluster::EngineBackend backend = cluster::EngineBackend::kAuto;
  cluster::WeightDtype weight_dtype = cluster::WeightDtype::kAuto;
  bool mtp = false;                 // MTP drafting on (and the checkpoint has the layer)
  WeightSizes::Source weight_source = WeightSizes::Source::kEstimated;
  int64_t total_weight_bytes = 0;   // whole checkpoint (one replica)
  int64_t model_kv_bytes_per_token = 0;  // all layers of one replica
  int64_t max_model_len = 0;
  int max_num_seqs = 0;
  int64_t required_tokens = 0;      // max_model_len x max_num_seqs
  int64_t max_position_embeddings = 0;
  std::vector<PlanStage> stages;    // PP order
  std::vector<PlanNode> nodes;      // rank order
  bool fits = false;                // required_tokens fit in every replica's KV cache
  int64_t max_context_tokens = 0;   // largest single context that fits (min over nodes,
                                    // capped at max_position_embeddings)
  std::vector<std::string> notes;   // warnings an operator should read
  DecodeProjection decode;          // single-stream decode rate (decode_projection.h)
};

struct PlanOptions {
  DecodeProjectionOptions decode;   // `glmctl plan --mtp-acceptance`
};

// Computes the plan. Refuses (FailedPrecondition) a plan whose weights + reserve (+ fixed
// kv_cache_bytes) exceed a node's budget, or whose KV capacity cannot hold one sequence of
// max_model_len; the message names each short node, its stage and by how much. Inconsistent
// inputs (partition sum, TP not dividing the heads, missing memory budget) are InvalidArgument
// naming the YAML field. A plan whose capacity holds max_model_len but not
// max_model_len x max_num_seqs is returned with fits = false and a note.
// Nodes need memory_budget_bytes (from the YAML, or filled in from the agents' reports).
// Also projects the decode rate (Plan::decode; a note says what to set when it cannot).
absl::StatusOr<Plan> MakePlan(const cluster::ClusterSpec& spec, const engine::ModelConfig& model,
                              const WeightSizes& weights, const PlanOptions& options = {});

std::string PlanToText(const Plan& plan);
nlohmann::json PlanToJson(const Plan& plan);

// Loads the YAML, resolves model.path relative to it, loads config.json and weight sizes, plans.
absl::StatusOr<Plan> PlanFromFiles(const std::string& cluster_yaml_path,
                                   const PlanOptions& options = {});

}  // namespace glm::controller
