// GlmMoeDsaForCausalLM configuration (HF config.json, model_type "glm_moe_dsa").
// Field meanings: ../shared/specs/glm5-architecture.md §2. This target (glm_model_config) depends
// on common and nlohmann_json only, so the planner in the controller can read model sizes without
// the engine.
//
// Derived fields:
// - indexer_types: the explicit `indexer_types` list ("full"/"shared"), else `index_topk_pattern`
//   ("F"/"S" per layer), else layer i is full iff
//   max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (defaults freq 1, offset 2:
//   all full). Layer 0 must be full (a shared layer reuses the previous full layer's top-k).
// - mlp_layer_types: explicit, else dense for i < first_k_dense_replace.
// - rope_theta / rope_type: `rope_parameters` wins over a top-level `rope_theta`; only "default".
// - eos_token_ids: `eos_token_id` as an int or a list.
// - quantization: config.json `quantization_config` (fp8, compressed-tensors, modelopt; see
//   quantization_config.h); LoadModelConfig also reads ModelOpt's hf_quant_config.json.
// Unsupported variants (n_group != 1, biases, other quantization schemes, tied embeddings, ...)
// are rejected rather than half-supported.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config/quantization_config.h"

namespace glm::engine {

enum class IndexerType { kFull, kShared };  // shared = reuse the previous full layer's top-k
enum class MlpType { kDense, kSparse };

struct ModelConfig {
  std::string model_type = "glm_moe_dsa";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;       // dense SwiGLU width
  int64_t moe_intermediate_size = 0;   // per routed expert width
  int num_hidden_layers = 0;           // MTP layers are extra, indices num_hidden_layers..
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  std::vector<IndexerType> indexer_types;  // size num_hidden_layers
  std::vector<MlpType> mlp_layer_types;    // size num_hidden_layers
  int first_k_dense_replace = 0;
  double rope_theta = 10000.0;
  std::string rope_type = "default";
  int64_t max_position_embeddings = 0;
  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
  int n_shared_experts = 0;
  double routed_scaling_factor = 1.0;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = true;
  int num_nextn_predict_layers = 0;   // MTP layers present in the checkpoint
  double rms_norm_eps = 1e-5;
  // HF builds q_a_layernorm / kv_a_layernorm without passing rms_norm_eps (spec §3.1).
  double latent_norm_eps = 1e-6;
  double indexer_norm_eps = 1e-6;     // indexer k_norm LayerNorm
  bool tie_word_embeddings = false;
  std::vector<int64_t> eos_token_ids;
  std::optional<QuantizationConfig> quantization;
  std::string torch_dtype;             // "bfloat16", "float32", ...

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool IsMoeLayer(int layer_idx) const;        // MTP layers (>= num_hidden_layers) are MoE
  bool HasIndexer(int layer_idx) const;        // full indexer; MTP layers always full
  int num_mtp_layers() const { return num_nextn_predict_layers; }
};

// Parses config.json text. `source` (a path) prefixes every error message. Rejects other
// architectures and inconsistent fields with a message naming the field and the fix.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source);

// Reads `<model_dir>/config.json`, and `<model_dir>/hf_quant_config.json` when present (ModelOpt
// exports; it takes precedence, as in vLLM). A config.json quantization_config of another method
// than the hf_quant_config.json one is refused.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace glm::engine
