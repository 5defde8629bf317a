// Fuzz target: any config.json the parser accepts must plan (or be refused) without overflow or
// crash, for several cluster shapes. Shares the model_config seed corpus.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "controller/plan/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto model = glm::engine::ParseModelConfig(text, "fuzz.json");
  if (!model.ok()) return 0;
  auto weights = glm::controller::EstimateWeightSizes(*model);
  if (!weights.ok()) return 0;
  const int shapes[][3] = {{1, 1, 1}, {4, 1, 1}, {1, 8, 1}, {2, 2, 2}, {1, 3, 1}};
  for (const auto& shape : shapes) {
    glm::cluster::ClusterSpec spec;
    spec.source = "fuzz.yaml";
    spec.name = "fuzz";
    spec.model.max_model_len = 1 + static_cast<int64_t>(size) * 97;
    spec.model.max_num_seqs = 1 + static_cast<int>(size % 7);
    spec.model.mtp_draft_tokens = size % 2 == 0 ? 0 : 1;
    spec.parallel.tensor = shape[0];
    spec.parallel.pipeline = shape[1];
    spec.parallel.replicas = shape[2];
    for (int i = 0; i < shape[0] * shape[1] * shape[2]; ++i) {
      glm::cluster::NodeSpec node;
      node.name = "n" + std::to_string(i);
      node.memory_budget_bytes = (int64_t{1} << 20) << (i % 24);
      if (i % 3 != 2 || shape[0] * shape[1] * shape[2] == 1) {
        node.memory_bandwidth_bytes_per_s = 1e9 * (1 + i);  // exercises the decode projection
      }
      spec.nodes.push_back(node);
    }
    glm::controller::PlanOptions options;
    if (size % 3 == 0) options.decode.mtp_acceptance_rate = static_cast<double>(size % 11) / 10;
    auto plan = glm::controller::MakePlan(spec, *model, *weights, options);
    if (plan.ok()) {
      (void)glm::controller::PlanToText(*plan);
      (void)glm::controller::PlanToJson(*plan).dump();
    }
  }
  return 0;
}
