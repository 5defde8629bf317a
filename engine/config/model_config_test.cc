#include "engine/config/model_config.h"

#include <cstdlib>
#include <functional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

std::string SourceDir() {
  const char* dir = std::getenv("GLM_SOURCE_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return GLM_TEST_SOURCE_DIR;  // set by CMake: the source tree
}

// A tiny valid config (spec §2 "Tiny-ref" column).
json TinyConfig() {
  return json{{"architectures", {"GlmMoeDsaForCausalLM"}},
              {"model_type", "glm_moe_dsa"},
              {"vocab_size", 256},
              {"hidden_size", 64},
              {"intermediate_size", 128},
              {"moe_intermediate_size", 32},
              {"num_hidden_layers", 3},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"q_lora_rank", 32},
              {"kv_lora_rank", 16},
              {"qk_nope_head_dim", 16},
              {"qk_rope_head_dim", 8},
              {"v_head_dim", 16},
              {"index_n_heads", 2},
              {"index_head_dim", 16},
              {"index_topk", 4},
              {"max_position_embeddings", 128},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"n_shared_experts", 1},
              {"first_k_dense_replace", 1},
              {"rope_theta", 10000},
              {"eos_token_id", 1}};
}

absl::StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), "tiny.json"); }

TEST(ModelConfig, RealGlm5) {
  auto c = LoadModelConfig(SourceDir() + "/configs/models/glm-5");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 154880);
  EXPECT_EQ(c->hidden_size, 6144);
  EXPECT_EQ(c->num_hidden_layers, 78);
  EXPECT_EQ(c->kv_lora_rank, 512);
  EXPECT_EQ(c->qk_rope_head_dim, 64);
  EXPECT_EQ(c->qk_head_dim(), 256);
  EXPECT_EQ(c->index_head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 202752);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_type, "default");
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{154820, 154827, 154829}));
  ASSERT_EQ(c->indexer_types.size(), 78u);
  for (int i = 0; i < 78; ++i) EXPECT_TRUE(c->HasIndexer(i)) << i;  // freq 1 offset 2 => all full
  ASSERT_EQ(c->mlp_layer_types.size(), 78u);
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_TRUE(c->IsMoeLayer(3));
  EXPECT_TRUE(c->IsMoeLayer(78));  // MTP
  ASSERT_TRUE(c->quantization.has_value());
  EXPECT_EQ(c->quantization->quant_method, "fp8");
  EXPECT_EQ(c->quantization->block_rows, 128);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ModelConfig, RealGlm52IndexShare) {
  auto c = LoadModelConfig(SourceDir() + "/configs/models/glm-5.2-fp8");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_position_embeddings, 1048576);
  EXPECT_DOUBLE_EQ(c->rope_theta, 8e6);
  // freq 4, offset 3: full iff max(i-2, 0) % 4 == 0 => 0,1,2,6,10,...,74 (21 layers).
  int full = 0;
  for (int i = 0; i < 78; ++i) {
    bool expect_full = i <= 2 || (i - 2) % 4 == 0;
    EXPECT_EQ(c->HasIndexer(i), expect_full) << i;
    full += c->HasIndexer(i);
  }
  EXPECT_EQ(full, 21);
  EXPECT_TRUE(c->HasIndexer(78));  // MTP layer always full
  EXPECT_EQ(c->mlp_layer_types[2], MlpType::kDense);
  EXPECT_EQ(c->mlp_layer_types[3], MlpType::kSparse);
}

TEST(ModelConfig, TinyDefaults) {
  auto c = Parse(TinyConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_group, 1);
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{1});
  EXPECT_FALSE(c->quantization.has_value());
  EXPECT_EQ(c->mlp_layer_types,
            (std::vector<MlpType>{MlpType::kDense, MlpType::kSparse, MlpType::kSparse}));
}

TEST(ModelConfig, IndexerPatternAndExplicitList) {
  json j = TinyConfig();
  j["index_topk_pattern"] = "FSF";
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->indexer_types,
            (std::vector<IndexerType>{IndexerType::kFull, IndexerType::kShared, IndexerType::kFull}));
  j["indexer_types"] = {"full", "full", "shared"};  // explicit list beats the pattern
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->indexer_types[2], IndexerType::kShared);
}

TEST(ModelConfig, RopeParametersBeatTopLevel) {
  json j = TinyConfig();
  j["rope_parameters"] = {{"rope_theta", 5e5}, {"rope_type", "default"}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e5);
}

struct BadCase {
  const char* name;
  std::function<void(json&)> mutate;
  const char* field;     // appears as "field `x`"
  const char* message;   // further substring
};

class ModelConfigBad : public ::testing::TestWithParam<BadCase> {};

TEST_P(ModelConfigBad, NamesFieldAndFix) {
  json j = TinyConfig();
  GetParam().mutate(j);
  auto c = Parse(j);
  ASSERT_FALSE(c.ok()) << GetParam().name;
  std::string msg(c.status().message());
  EXPECT_THAT(msg, HasSubstr("tiny.json: field `" + std::string(GetParam().field) + "`"));
  EXPECT_THAT(msg, HasSubstr(GetParam().message));
  EXPECT_THAT(msg, HasSubstr("expected"));
}

INSTANTIATE_TEST_SUITE_P(
    All, ModelConfigBad,
    ::testing::Values(
        BadCase{"other_model", [](json& j) { j["model_type"] = "deepseek_v32"; }, "model_type",
                "deepseek_v32"},
        BadCase{"no_model_type", [](json& j) { j.erase("model_type"); }, "model_type", "missing"},
        BadCase{"other_arch", [](json& j) { j["architectures"] = {"LlamaForCausalLM"}; },
                "architectures", "GlmMoeDsaForCausalLM"},
        BadCase{"missing_hidden", [](json& j) { j.erase("hidden_size"); }, "hidden_size",
                "missing"},
        BadCase{"zero_hidden", [](json& j) { j["hidden_size"] = 0; }, "hidden_size", "got 0"},
        BadCase{"negative_layers", [](json& j) { j["num_hidden_layers"] = -1; },
                "num_hidden_layers", "an integer in 1..1024"},
        BadCase{"huge_layers", [](json& j) { j["num_hidden_layers"] = 2000000000; },
                "num_hidden_layers", "1..1024"},
        BadCase{"huge_experts", [](json& j) { j["n_routed_experts"] = 1 << 20; },
                "n_routed_experts", "1..4096"},
        BadCase{"string_dim", [](json& j) { j["kv_lora_rank"] = "512"; }, "kv_lora_rank",
                "an integer"},
        BadCase{"null_q_lora", [](json& j) { j["q_lora_rank"] = nullptr; }, "q_lora_rank",
                "missing"},
        BadCase{"indexer_len", [](json& j) { j["indexer_types"] = {"full", "shared"}; },
                "indexer_types", "num_hidden_layers = 3"},
        BadCase{"indexer_value", [](json& j) { j["indexer_types"] = {"full", "half", "full"}; },
                "indexer_types[1]", "\"full\" or \"shared\""},
        BadCase{"first_shared", [](json& j) { j["indexer_types"] = {"shared", "full", "full"}; },
                "indexer_types", "no previous full layer"},
        BadCase{"first_shared_pattern", [](json& j) { j["index_topk_pattern"] = "SFF"; },
                "index_topk_pattern", "no previous full layer"},
        BadCase{"pattern_len", [](json& j) { j["index_topk_pattern"] = "FF"; },
                "index_topk_pattern", "2 letters"},
        BadCase{"pattern_letter", [](json& j) { j["index_topk_pattern"] = "FXF"; },
                "index_topk_pattern", "'X'"},
        BadCase{"mlp_len", [](json& j) { j["mlp_layer_types"] = {"dense"}; }, "mlp_layer_types",
                "1 entries"},
        BadCase{"topk_gt_experts", [](json& j) { j["num_experts_per_tok"] = 9; },
                "num_experts_per_tok", "n_routed_experts = 8"},
        BadCase{"n_group", [](json& j) { j["n_group"] = 8; }, "n_group", "not supported"},
        BadCase{"rope_type", [](json& j) { j["rope_parameters"] = {{"rope_type", "yarn"}}; },
                "rope_parameters.rope_type", "yarn"},
        BadCase{"rope_theta", [](json& j) { j["rope_theta"] = -1; }, "rope_theta", "> 0"},
        BadCase{"eos_list", [](json& j) { j["eos_token_id"] = {1, "x"}; }, "eos_token_id[1]",
                "token id"},
        BadCase{"quant_method", [](json& j) { j["quantization_config"] = {{"quant_method", "awq"}}; },
                "quantization_config.quant_method", "awq"},
        BadCase{"quant_block",
                [](json& j) {
                  j["quantization_config"] = {{"quant_method", "fp8"},
                                              {"weight_block_size", {128}}};
                },
                "quantization_config.weight_block_size", "[128, 128]"},
        BadCase{"qk_head_dim", [](json& j) { j["qk_head_dim"] = 100; }, "qk_head_dim", "= 24"},
        BadCase{"index_head_small", [](json& j) { j["index_head_dim"] = 4; }, "index_head_dim",
                "qk_rope_head_dim"},
        BadCase{"act", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act", "silu"},
        BadCase{"dense_gt_layers", [](json& j) { j["first_k_dense_replace"] = 5; },
                "first_k_dense_replace", "num_hidden_layers = 3"},
        BadCase{"bool_type", [](json& j) { j["norm_topk_prob"] = 1; }, "norm_topk_prob",
                "true or false"}),
    [](const ::testing::TestParamInfo<BadCase>& param_info) { return std::string(param_info.param.name); });

TEST(ModelConfig, NotJson) {
  auto c = ParseModelConfig("{\"a\": ", "x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("x/config.json: not valid JSON"));
  c = ParseModelConfig("[1,2]", "x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("top level is array"));
}

TEST(ModelConfig, MissingFile) {
  auto c = LoadModelConfig("/nonexistent-dir-for-test");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent-dir-for-test/config.json"));
}

}  // namespace
}  // namespace glm::engine
