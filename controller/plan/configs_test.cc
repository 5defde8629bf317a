// Every cluster YAML in configs/ must parse, and plan as its header comment says.
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <map>

#include "controller/plan/plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::controller {
namespace {

using ::testing::HasSubstr;

std::string SourceDir() {
  const char* dir = std::getenv("GLM_SOURCE_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return GLM_TEST_SOURCE_DIR;
}

// Examples the planner must refuse (GLM-5.2-FP8 is 189 GB per node at TP4; a Spark has 128 GB).
// Every other example must plan and fit (spark-4x-tp4-200k.yaml serves the Int4-Int8Mix
// checkpoint, which does).
const std::map<std::string, std::string>& ExpectedRefusals() {
  static const auto* refusals = new std::map<std::string, std::string>{
      {"spark-8x-2xtp4.yaml", "node spark-5 (pp stage 0, layers 0-77) needs "},
  };
  return *refusals;
}

TEST(Configs, EveryExampleParsesAndPlans) {
  namespace fs = std::filesystem;
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(SourceDir()) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string file = entry.path().filename().string();
    SCOPED_TRACE(file);
    ++checked;
    auto spec = cluster::LoadClusterSpec(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    // GPU clusters name their backend, so a node without a usable GPU fails instead of crawling.
    if (file.rfind("spark-", 0) == 0) {
      EXPECT_EQ(spec->model.backend, cluster::EngineBackend::kCuda);
    }
    auto plan = PlanFromFiles(entry.path().string());
    auto refusal = ExpectedRefusals().find(file);
    if (refusal != ExpectedRefusals().end()) {
      ASSERT_FALSE(plan.ok());
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(plan.status().message(), HasSubstr(refusal->second));
      continue;
    }
    // Spark examples state the GB10's memory bandwidth and the ConnectX-7 link, so the plan
    // projects decode.
    if (file.rfind("spark-", 0) == 0) {
      ASSERT_EQ(spec->nodes[0].memory_bandwidth_bytes_per_s, 273e9);
      ASSERT_EQ(spec->fabric.link_bandwidth_bytes_per_s, 25e9);
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->fits) << PlanToText(*plan);
    EXPECT_GE(plan->max_context_tokens, spec->model.max_model_len);
  }
  EXPECT_GE(checked, 4);
}

TEST(Configs, Pp8OneMillion) {
  auto plan = PlanFromFiles(SourceDir() + "/configs/spark-8x-pp8-1m.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layer_partition, (std::vector<int>{11, 10, 10, 10, 10, 10, 10, 7}));
  EXPECT_EQ(plan->stages[7].first_layer, 71);
  EXPECT_EQ(plan->max_context_tokens, 1048576);
  EXPECT_TRUE(plan->fits);
  // PP runs the stages one after another: every token streams all ~41 GB of active fp8 weights
  // (+ lm_head) at 273 GB/s × 0.50 ≈ 137 GB/s, ~0.3 s, plus 9 hops: 2.5-4.5 tokens/s.
  ASSERT_TRUE(plan->decode.made) << plan->decode.not_made;
  ASSERT_EQ(plan->decode.replicas.size(), 1u);
  EXPECT_EQ(plan->decode.replicas[0].stages.size(), 8u);
  EXPECT_EQ(plan->decode.replicas[0].hops_per_token, 9);
  EXPECT_GT(plan->decode.replicas[0].tokens_per_s, 2.5);
  EXPECT_LT(plan->decode.replicas[0].tokens_per_s, 4.5);
}

// GLM-5.2-Int4-Int8Mix on 4 Sparks: ~94 GiB of checkpoint per node at TP4 (405.2 GB / 4) and
// one 200K-token fp8 sequence of KV in the 112 GiB budget.
TEST(Configs, Spark4xTp4Int4Int8Mix) {
  auto plan = PlanFromFiles(SourceDir() + "/configs/spark-4x-tp4-200k.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->fits) << PlanToText(*plan);
  EXPECT_EQ(plan->total_weight_bytes, int64_t{405459090304});  // spec §5.1, FP32 routers
  const double gib = 1024.0 * 1024 * 1024;
  EXPECT_GT(plan->nodes[0].weight_bytes / gib, 93.0);
  EXPECT_LT(plan->nodes[0].weight_bytes / gib, 96.5);
  EXPECT_GE(plan->max_context_tokens, 200000);
}

// GLM-5.2-NVFP4 on 8 A800s: TP8 ~52 GiB per GPU; PP8 [9, 10 x 6, 9] with a 1M context.
TEST(Configs, A800Nvfp4Tp8AndPp8) {
  const double gib = 1024.0 * 1024 * 1024;
  auto tp8 = PlanFromFiles(SourceDir() + "/configs/a800-8x-tp8-nvfp4.yaml");
  ASSERT_TRUE(tp8.ok()) << tp8.status();
  EXPECT_TRUE(tp8->fits) << PlanToText(*tp8);
  EXPECT_EQ(tp8->total_weight_bytes, int64_t{464795267072});
  // 464.8 GB / 8 = 51.8 GiB: the planner shards every weight by TP; vLLM replicates q_a/kv_a,
  // the indexer and the router (spec §5.3: 54.36 GiB).
  EXPECT_GT(tp8->nodes[0].weight_bytes / gib, 51.5);
  EXPECT_LT(tp8->nodes[0].weight_bytes / gib, 54.4);

  auto pp8 = PlanFromFiles(SourceDir() + "/configs/a800-8x-pp8-nvfp4-1m.yaml");
  ASSERT_TRUE(pp8.ok()) << pp8.status();
  EXPECT_TRUE(pp8->fits) << PlanToText(*pp8);
  EXPECT_EQ(pp8->layer_partition, (std::vector<int>{9, 10, 10, 10, 10, 10, 10, 9}));
  EXPECT_GE(pp8->max_context_tokens, 1048576);
  // The largest stage (10 NVFP4 MoE layers) stays within the spec's 54.5 GiB.
  int64_t largest = 0;
  for (const auto& node : pp8->nodes) largest = std::max(largest, node.weight_bytes);
  EXPECT_LT(largest / gib, 55.0);
}

TEST(Configs, LocalDemoIsLoopbackTp4) {
  auto spec = cluster::LoadClusterSpec(SourceDir() + "/configs/local-demo.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->local);
  ASSERT_EQ(spec->nodes.size(), 4u);
  EXPECT_EQ(spec->nodes[3].agent, "127.0.0.1:47104");
  EXPECT_EQ(spec->model.backend, cluster::EngineBackend::kAuto);  // cuda where usable, else cpu
  auto plan = PlanFromFiles(SourceDir() + "/configs/local-demo.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tensor, 4);
}

}  // namespace
}  // namespace glm::controller
