// quantization_config parsing: compressed-tensors pack-quantized and ModelOpt NVFP4 (config.json
// and hf_quant_config.json forms), module matching, and every refusal naming field and value.
#include "engine/config/quantization_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/scratch_dir.h"
#include "engine/config/model_config.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

using json = nlohmann::ordered_json;

// The layout of QuantTrio/GLM-5.2-Int4-Int8Mix (specs/quantized-checkpoints.md §1.2).
json Int4Int8Mix() {
  return json::parse(R"({
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "kv_cache_scheme": null,
    "quantization_status": "compressed",
    "config_groups": {
      "w4a16_experts": {
        "targets": ["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"],
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                    "group_size": 128, "dynamic": false, "actorder": null}
      },
      "w8a16_mtp_channel": {
        "targets": ["re:model\\.layers\\.78\\..*(proj|proj_with_mqa)$"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel",
                    "group_size": -1, "dynamic": false}
      },
      "w8a16_linears": {
        "targets": ["re:.*self_attn\\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)$",
                    "re:.*mlp\\.(gate|up|down)_proj$",
                    "re:.*mlp\\.shared_experts\\.(gate|up|down)_proj$"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "group",
                    "group_size": 128, "dynamic": false}
      }
    },
    "ignore": ["re:model\\.layers\\.0\\..*", "re:.*mlp\\.gate$", "re:.*self_attn\\.indexer\\..*",
               "lm_head"]
  })");
}

absl::StatusOr<QuantizationConfig> Parse(const json& q) {
  return ParseQuantizationConfig(q.dump(), "/m/config.json");
}

TEST(QuantizationConfig, CompressedTensorsGroupsAndIgnore) {
  auto q = Parse(Int4Int8Mix());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->method, QuantMethod::kPackQuantized);
  ASSERT_EQ(q->groups.size(), 3u);

  const QuantGroup* expert = q->GroupOf("model.layers.3.mlp.experts.17.up_proj");
  ASSERT_NE(expert, nullptr);
  EXPECT_EQ(expert->name, "w4a16_experts");
  EXPECT_EQ(expert->num_bits, 4);
  EXPECT_EQ(expert->group_size, 128);

  const QuantGroup* attn = q->GroupOf("model.layers.5.self_attn.kv_b_proj");
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->num_bits, 8);
  EXPECT_EQ(q->GroupOf("model.layers.1.mlp.down_proj")->name, "w8a16_linears");
  EXPECT_EQ(q->GroupOf("model.layers.4.mlp.shared_experts.gate_proj")->name, "w8a16_linears");

  const QuantGroup* mtp = q->GroupOf("model.layers.78.self_attn.q_a_proj");
  ASSERT_NE(mtp, nullptr);
  EXPECT_EQ(mtp->group_size, 0);  // per channel

  // Ignored: layer 0, routers, the indexer, lm_head; and never targeted: norms.
  EXPECT_EQ(q->GroupOf("model.layers.0.self_attn.q_a_proj"), nullptr);
  EXPECT_EQ(q->GroupOf("model.layers.3.mlp.gate"), nullptr);
  EXPECT_EQ(q->GroupOf("model.layers.3.self_attn.indexer.wq_b"), nullptr);
  EXPECT_EQ(q->GroupOf("lm_head"), nullptr);
  EXPECT_EQ(q->GroupOf("model.layers.3.input_layernorm"), nullptr);
  ASSERT_NE(q->IgnoredBy("model.layers.0.mlp.up_proj"), nullptr);
  EXPECT_EQ(q->IgnoredBy("model.layers.0.mlp.up_proj")->text(), "re:model\\.layers\\.0\\..*");
  // re.match semantics: anchored at the start only.
  EXPECT_EQ(q->IgnoredBy("xmodel.layers.0.mlp.up_proj"), nullptr);
}

TEST(QuantizationConfig, CompressedTensorsPlainTargets) {
  json j = Int4Int8Mix();
  j["config_groups"] = {{"group_0",
                         {{"targets", {"Linear"}},
                          {"weights",
                           {{"num_bits", 8}, {"type", "int"}, {"symmetric", true},
                            {"strategy", "channel"}}}}}};
  j["ignore"] = {"lm_head", "model.layers.0.mlp.down_proj"};
  auto q = Parse(j);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_NE(q->GroupOf("model.layers.0.mlp.up_proj"), nullptr);
  EXPECT_EQ(q->GroupOf("model.layers.0.mlp.down_proj"), nullptr);
  EXPECT_EQ(q->GroupOf("lm_head"), nullptr);
}

struct Refusal {
  const char* what;
  void (*edit)(json&);
  const char* field;
  const char* value;
};

TEST(QuantizationConfig, CompressedTensorsRefusals) {
  const Refusal cases[] = {
      {"format", [](json& j) { j["format"] = "int-quantized"; }, "quantization_config.format",
       "int-quantized"},
      {"asymmetric",
       [](json& j) { j["config_groups"]["w4a16_experts"]["weights"]["symmetric"] = false; },
       "quantization_config.config_groups.w4a16_experts.weights.symmetric", "false"},
      {"actorder",
       [](json& j) { j["config_groups"]["w4a16_experts"]["weights"]["actorder"] = "group"; },
       "quantization_config.config_groups.w4a16_experts.weights.actorder", "group"},
      {"fp8 group",
       [](json& j) {
         j["config_groups"]["w8a16_linears"]["weights"]["type"] = "float";
       },
       "quantization_config.config_groups.w8a16_linears.weights.type", "float"},
      {"num_bits",
       [](json& j) { j["config_groups"]["w4a16_experts"]["weights"]["num_bits"] = 2; },
       "quantization_config.config_groups.w4a16_experts.weights.num_bits", "2"},
      {"strategy",
       [](json& j) { j["config_groups"]["w4a16_experts"]["weights"]["strategy"] = "tensor"; },
       "quantization_config.config_groups.w4a16_experts.weights.strategy", "tensor"},
      {"group size",
       [](json& j) { j["config_groups"]["w4a16_experts"]["weights"].erase("group_size"); },
       "quantization_config.config_groups.w4a16_experts.weights.group_size", "missing"},
      {"activations",
       [](json& j) {
         j["config_groups"]["w4a16_experts"]["input_activations"] = {{"num_bits", 8}};
       },
       "quantization_config.config_groups.w4a16_experts.input_activations", "num_bits"},
      {"kv scheme", [](json& j) { j["kv_cache_scheme"] = {{"num_bits", 8}}; },
       "quantization_config.kv_cache_scheme", "num_bits"},
      {"bad regex", [](json& j) { j["ignore"] = {"re:(?P<x>a)"}; },
       "quantization_config.ignore[0]", "(?P<x>a)"},
      {"no groups", [](json& j) { j.erase("config_groups"); },
       "quantization_config.config_groups", "missing"},
  };
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.what);
    json j = Int4Int8Mix();
    c.edit(j);
    auto q = Parse(j);
    ASSERT_FALSE(q.ok());
    const std::string message(q.status().message());
    EXPECT_NE(message.find("/m/config.json"), std::string::npos) << message;
    EXPECT_NE(message.find(c.field), std::string::npos) << message;
    EXPECT_NE(message.find(c.value), std::string::npos) << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << message;
  }
}

TEST(QuantizationConfig, HfQuantConfigNvfp4) {
  auto q = ParseHfQuantConfig(R"({
    "producer": {"name": "modelopt", "version": "0.46.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                     "exclude_modules": ["lm_head", "model.layers.*.self_attn*",
                                         "model.layers.*.mlp.shared_experts*",
                                         "model.layers.[0-2].mlp*", "model.layers.78*"]}})",
                              "/m/hf_quant_config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->method, QuantMethod::kNvfp4);
  EXPECT_EQ(q->kv_cache_quant_algo, "FP8");
  const QuantGroup* g = q->GroupOf("model.layers.3.mlp.experts.5.gate_proj");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->group_size, 16);
  EXPECT_EQ(q->GroupOf("model.layers.3.self_attn.o_proj"), nullptr);
  EXPECT_EQ(q->GroupOf("model.layers.3.mlp.shared_experts.up_proj"), nullptr);
  EXPECT_EQ(q->GroupOf("model.layers.1.mlp.up_proj"), nullptr);
  EXPECT_EQ(q->GroupOf("model.layers.78.mlp.experts.0.up_proj"), nullptr);
  EXPECT_EQ(q->GroupOf("lm_head"), nullptr);
  EXPECT_EQ(q->IgnoredBy("model.layers.7.self_attn.q_b_proj")->text(), "model.layers.*.self_attn*");
}

TEST(QuantizationConfig, ModelOptInConfigJson) {
  auto q = Parse(json::parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4",
                                 "group_size": 16, "ignore": ["lm_head", "*self_attn*"]})"));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->method, QuantMethod::kNvfp4);
  EXPECT_EQ(q->GroupOf("model.layers.9.self_attn.o_proj"), nullptr);
  EXPECT_NE(q->GroupOf("model.layers.9.mlp.experts.1.down_proj"), nullptr);
}

TEST(QuantizationConfig, ModelOptRefusals) {
  auto mixed = ParseHfQuantConfig(
      R"({"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {}}})",
      "/m/hf_quant_config.json");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("quantization.quant_algo"), std::string::npos);
  EXPECT_NE(mixed.status().message().find("MIXED_PRECISION"), std::string::npos);
  EXPECT_NE(mixed.status().message().find("\"NVFP4\""), std::string::npos);

  auto group = Parse(json::parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4",
                                     "group_size": 32})"));
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find("quantization_config.group_size"), std::string::npos);
  EXPECT_NE(group.status().message().find("32"), std::string::npos);

  auto method = Parse(json::parse(R"({"quant_method": "awq"})"));
  ASSERT_FALSE(method.ok());
  EXPECT_NE(method.status().message().find("\"awq\""), std::string::npos);
  EXPECT_NE(method.status().message().find("compressed-tensors"), std::string::npos);
}

TEST(QuantizationConfig, LoadModelConfigReadsHfQuantConfig) {
  const std::string dir = testing_util::ScratchDir("hf_quant_model").string();
  std::ifstream src(std::string(GLM_TEST_SOURCE_DIR) + "/tests/golden/tiny-moe/config.json");
  json config = json::parse(src);
  std::ofstream(dir + "/config.json") << config.dump();
  std::ofstream(dir + "/hf_quant_config.json")
      << R"({"quantization": {"quant_algo": "NVFP4", "group_size": 16,
                             "exclude_modules": ["lm_head"]}})";
  auto c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->quantization.has_value());
  EXPECT_EQ(c->quantization->method, QuantMethod::kNvfp4);
  EXPECT_EQ(c->quantization->source, dir + "/hf_quant_config.json");

  // A config.json declaring another method contradicts it.
  config["quantization_config"] = Int4Int8Mix();
  std::ofstream(dir + "/config.json") << config.dump();
  auto bad = LoadModelConfig(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("hf_quant_config.json"), std::string::npos);
  EXPECT_NE(bad.status().message().find("compressed-tensors"), std::string::npos);
}

}  // namespace
}  // namespace glm::engine
