// Random GlmMoeDsa checkpoints in memory, for tests and benchmarks: every tensor the model reads,
// scaled so activations stay O(1) through the layers (Linear weights ~ N(0, 1/in), norms ~ 1).
#pragma once

#include <cstdint>

#include "engine/config/model_config.h"
#include "engine/model/weight_source.h"

namespace glm::engine {

// Fills `out` with the weights of `config` (all decoder layers, plus the MTP layer when
// config.num_nextn_predict_layers > 0). Deterministic in `seed`.
void MakeRandomWeights(const ModelConfig& config, uint64_t seed, InMemoryWeights* out);

// A small, fully specified config (used by tests and the benchmark): `num_layers` layers, the
// first `num_dense` dense, IndexShare pattern full/shared alternating after layer 0 when
// `index_share`, and an MTP layer.
ModelConfig SmallTestConfig(int num_layers, int num_dense, bool index_share);

}  // namespace glm::engine
