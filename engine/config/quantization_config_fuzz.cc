// Fuzz target: a checkpoint's quantization settings on arbitrary bytes, read both ways the loader
// reads them (config.json's `quantization_config` object and ModelOpt's hf_quant_config.json),
// must return a status, never crash or hang; whatever is accepted answers module lookups.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/config/quantization_config.h"

namespace {

// Names of the modules a GLM-5 checkpoint has, routed experts and the MTP layer included.
constexpr std::string_view kModules[] = {
    "model.layers.0.self_attn.q_a_proj",
    "model.layers.3.self_attn.kv_b_proj",
    "model.layers.3.self_attn.indexer.wq_b",
    "model.layers.3.mlp.gate",
    "model.layers.3.mlp.experts.17.up_proj",
    "model.layers.3.mlp.shared_experts.down_proj",
    "model.layers.78.mlp.experts.255.down_proj",
    "lm_head",
};

void Exercise(const glm::engine::QuantizationConfig& config) {
  (void)config.Describe();
  for (std::string_view m : kModules) {
    (void)config.GroupOf(m);
    (void)config.GroupsOf(m);
    (void)config.IgnoredBy(m);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto c = glm::engine::ParseQuantizationConfig(text, "fuzz/config.json"); c.ok()) {
    Exercise(*c);
  }
  if (auto c = glm::engine::ParseHfQuantConfig(text, "fuzz/hf_quant_config.json"); c.ok()) {
    Exercise(*c);
  }
  return 0;
}
