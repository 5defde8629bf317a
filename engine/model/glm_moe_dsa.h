// GlmMoeDsaForCausalLM (GLM-5 / GLM-5.2) on a Backend: embedding, decoder layers (MLA + DSA
// indexer + IndexShare, dense SwiGLU or MoE), final norm, lm_head, and the MTP layer.
// Forward pass: ../shared/specs/glm5-architecture.md §3; the scheduler drives it through
// engine/model/forward_batch.h.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config/model_config.h"
#include "engine/model/forward_batch.h"

namespace glm::engine {

class Backend;
class WeightSource;

struct ModelLoadOptions {
  std::string model_dir;     // HF layout: config.json + *.safetensors (+ index)
  KvCacheGeometry kv;        // paged KV storage the model allocates for every layer it holds
  int num_threads = 0;       // CPU backend threads; 0 = hardware concurrency
  int first_layer = 0;       // first decoder layer of this shard (PP)
  int last_layer = -1;       // inclusive, -1 = last decoder layer
  bool load_mtp = true;      // load layer num_hidden_layers (MTP) when the checkpoint has it
  // Expanded (kv_b_proj, per-head K/V) attention for prefill slices with more than one new
  // token; the absorbed (latent) form otherwise. Both give the same result (tested); false forces
  // the absorbed form everywhere.
  bool expanded_prefill = true;
};

// Loads config.json and the weights from options.model_dir onto a CPU backend.
// Errors name the file and tensor (missing tensor, wrong shape, bad KV geometry).
absl::StatusOr<std::unique_ptr<Model>> LoadGlmMoeDsa(const ModelLoadOptions& options);

// Same, from an already parsed config and an arbitrary weight source (tests, synthetic models).
// `backend` must outlive the model; `weights` is only used during the call.
absl::StatusOr<std::unique_ptr<Model>> CreateGlmMoeDsa(const ModelConfig& config,
                                                      WeightSource& weights, Backend* backend,
                                                      const ModelLoadOptions& options);

}  // namespace glm::engine
