// Random GlmMoeDsa checkpoints in memory, for tests and benchmarks: every tensor the model reads,
// scaled so activations stay O(1) through the layers (Linear weights ~ N(0, 1/in), norms ~ 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/model_config.h"
#include "engine/model/weight_source.h"

namespace glm::engine {

// One tensor of a random checkpoint: its values have mean `mean` and standard deviation `stddev`
// (Linear weights [out, in]: mean 0, stddev gain / sqrt(in); norms 1 +- 0.1; embedding 0 +- 1).
struct RandomTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  float mean = 0.0f;
  float stddev = 0.0f;
  int64_t numel() const;
};

// Every tensor GlmMoeDsa's loader reads for `config` (all decoder layers, model.norm, lm_head,
// the embedding, and the MTP layer when config.num_nextn_predict_layers > 0), in load order.
// The one table behind MakeRandomWeights and LazyRandomWeights.
std::vector<RandomTensorSpec> RandomTensorSpecs(const ModelConfig& config);

// Fills `out` with RandomTensorSpecs(config), normal values. Deterministic in `seed`.
void MakeRandomWeights(const ModelConfig& config, uint64_t seed, InMemoryWeights* out);

// A small, fully specified config (used by tests and the benchmark): `num_layers` layers, the
// first `num_dense` dense, IndexShare pattern full/shared alternating after layer 0 when
// `index_share`, and an MTP layer.
ModelConfig SmallTestConfig(int num_layers, int num_dense, bool index_share);

}  // namespace glm::engine
