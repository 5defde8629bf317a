// The model on quantized checkpoints (specs/quantized-checkpoints.md): the tiny-fp8 golden
// fixture's weights are re-quantized here into compressed-tensors pack-quantized INT4/INT8 (the
// QuantTrio Int4-Int8Mix precision map, scaled down) and into ModelOpt NVFP4 (routed experts
// only, hf_quant_config.json), written to temp dirs and loaded by LoadGlmMoeDsa. The prompt
// logits must equal, within 1e-5 relative, those of the same model loaded from the packer's
// dequantized values written as fp32: loading a quantized checkpoint is exact dequantization.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/weights/safetensors_writer.h"
#include "engine/weights/weight_store.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr double kTolerance = 1e-5;

fs::path Fixture() { return fs::path(GLM_GOLDEN_DIR) / "tiny-fp8"; }

json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void WriteJson(const fs::path& path, const json& j) { std::ofstream(path) << j.dump(2) << "\n"; }

// Every tensor of the fixture as fp32 (its fp8 weights dequantized), by name.
std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> FixtureTensors() {
  auto config = LoadModelConfig(Fixture().string());
  EXPECT_TRUE(config.ok()) << config.status();
  WeightStoreOptions options;
  options.block = {config->quantization->block_rows, config->quantization->block_cols};
  options.quantization = config->quantization;
  auto store = WeightStore::Open(Fixture().string(), options);
  EXPECT_TRUE(store.ok()) << store.status();
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> out;
  for (const std::string& name : (*store)->TensorNames()) {
    if (name.ends_with("_scale_inv")) continue;
    auto shape = (*store)->ShapeOf(name);
    auto values = (*store)->ReadFloat(name);
    EXPECT_TRUE(values.ok()) << values.status();
    out[name] = {*shape, *values};
  }
  return out;
}

// How a tensor is written: as it is (fp32), INT4/INT8 with a group size (0 = per channel), or
// NVFP4.
struct Encoding {
  enum Kind { kPlain, kInt, kNvfp4 } kind = kPlain;
  int bits = 0;
  int64_t group = 0;
};

// Writes `tensors` to `dir` with `encode(name, shape)` choosing each 2-D linear weight's
// encoding, plus the dequantized fp32 twin to `dequantized_dir`.
void WriteCheckpoints(
    const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& tensors,
    const std::function<Encoding(const std::string& module)>& encode, const fs::path& dir,
    const fs::path& dequantized_dir, int* quantized_count) {
  SafetensorsWriter quantized, plain;
  *quantized_count = 0;
  for (const auto& [name, tensor] : tensors) {
    const auto& [shape, values] = tensor;
    Encoding e;
    if (name.ends_with(".weight") && shape.size() == 2) {
      e = encode(name.substr(0, name.size() - 7));
    }
    std::vector<float> dequantized = values;
    const std::string module = name.substr(0, name.size() - 7);
    switch (e.kind) {
      case Encoding::kPlain:
        ASSERT_TRUE(quantized.AddFloat(name, DType::kF32, shape, values).ok());
        break;
      case Encoding::kInt:
        ASSERT_TRUE(
            quantized.AddPackQuantized(module, shape, values, e.bits, e.group, &dequantized).ok());
        ++*quantized_count;
        break;
      case Encoding::kNvfp4: {
        // Up projections get a global scale 3x the natural one, so gate and up differ.
        const bool up = module.ends_with("up_proj");
        float scale_2 = 0;
        if (up) {
          float amax = 0;
          for (float v : values) amax = std::max(amax, std::fabs(v));
          scale_2 = 3.0f * amax / (6.0f * 448.0f);
        }
        ASSERT_TRUE(
            quantized.AddNvfp4Quantized(module, shape, values, &dequantized, scale_2, 0.5f).ok());
        ++*quantized_count;
        break;
      }
    }
    ASSERT_TRUE(plain.AddFloat(name, DType::kF32, shape, dequantized).ok());
  }
  fs::create_directories(dir);
  fs::create_directories(dequantized_dir);
  ASSERT_TRUE(quantized.WriteFile((dir / "model.safetensors").string()).ok());
  ASSERT_TRUE(plain.WriteFile((dequantized_dir / "model.safetensors").string()).ok());
}

std::unique_ptr<Model> Load(const fs::path& dir) {
  ModelLoadOptions o;
  o.model_dir = dir.string();
  o.kv = {4, 64};
  o.num_threads = 2;
  auto m = LoadGlmMoeDsa(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<float> PromptLogits(Model& m, const std::vector<int32_t>& prompt) {
  ForwardBatch b;
  SequenceSlice s;
  s.seq_id = 1;
  s.token_ids = prompt;
  s.start_pos = 0;
  for (int i = 0; i < static_cast<int>(prompt.size() / 4 + 1); ++i) s.block_table.push_back(i);
  s.all_logits = true;
  b.seqs.push_back(s);
  ForwardResult r;
  absl::Status st = m.Forward(b, &r);
  EXPECT_TRUE(st.ok()) << st;
  return st.ok() ? r.seqs[0].logits : std::vector<float>();
}

double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

class QuantizedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ = FixtureTensors();
    config_ = ReadJson(Fixture() / "config.json");
    config_.erase("quantization_config");
    prompt_ = ReadJson(Fixture() / "reference.json")["prompt_ids"].get<std::vector<int32_t>>();
    root_ = testing_util::ScratchDir("quantized_checkpoint");
  }

  // Loads both directories and compares their prompt logits.
  void ExpectSameLogits(const fs::path& quantized, const fs::path& dequantized) {
    auto q = Load(quantized);
    auto d = Load(dequantized);
    ASSERT_NE(q, nullptr);
    ASSERT_NE(d, nullptr);
    const auto lq = PromptLogits(*q, prompt_);
    const auto ld = PromptLogits(*d, prompt_);
    ASSERT_EQ(lq.size(), ld.size());
    ASSERT_FALSE(ld.empty());
    const double rel = RelDiff(lq, ld);
    EXPECT_LE(rel, kTolerance);
    // The quantization changed the model (the comparison is not fp32 against itself).
    auto original = Load(Fixture());
    EXPECT_GT(RelDiff(PromptLogits(*original, prompt_), ld), 1e-4);
  }

  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors_;
  json config_;
  std::vector<int32_t> prompt_;
  fs::path root_;
};

TEST_F(QuantizedCheckpoint, Int4Int8MixMatchesDequantizedFp32) {
  // Layer 0 BF16 (here fp32), routed experts INT4 g16, other linears INT8 g16, layer 2's
  // attention INT8 per channel (the MTP layer's scheme); routers and indexers ignored.
  const std::regex experts(R"(.*mlp\.experts\.\d+\.(gate|up|down)_proj$)");
  const std::regex layer0(R"(model\.layers\.0\..*)");
  const std::regex l2attn(R"(model\.layers\.2\.self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)$)");
  const std::regex linears(
      R"(.*(self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)|mlp\.(gate|up|down)_proj|mlp\.shared_experts\.(gate|up|down)_proj)$)");
  auto encode = [&](const std::string& m) {
    if (std::regex_match(m, layer0)) return Encoding{};
    if (std::regex_match(m, experts)) return Encoding{Encoding::kInt, 4, 16};
    if (std::regex_match(m, l2attn)) return Encoding{Encoding::kInt, 8, 0};
    if (std::regex_match(m, linears)) return Encoding{Encoding::kInt, 8, 16};
    return Encoding{};
  };
  int count = 0;
  WriteCheckpoints(tensors_, encode, root_ / "int4mix", root_ / "int4mix-dequantized", &count);
  EXPECT_GT(count, 40);

  json q = json::parse(R"({
    "quant_method": "compressed-tensors", "format": "pack-quantized", "kv_cache_scheme": null,
    "config_groups": {
      "w4a16_experts": {"targets": ["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"],
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                    "group_size": 16, "dynamic": false, "actorder": null}},
      "w8a16_channel": {"targets": ["re:model\\.layers\\.2\\.self_attn\\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)$"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel",
                    "group_size": -1, "dynamic": false}},
      "w8a16_linears": {"targets": ["re:.*self_attn\\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)$",
                                    "re:.*mlp\\.(gate|up|down)_proj$",
                                    "re:.*mlp\\.shared_experts\\.(gate|up|down)_proj$"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "group",
                    "group_size": 16, "dynamic": false}}},
    "ignore": ["re:model\\.layers\\.0\\..*", "re:.*mlp\\.gate$", "re:.*self_attn\\.indexer\\..*",
               "lm_head"]})");
  json quantized = config_;
  quantized["quantization_config"] = q;
  WriteJson(root_ / "int4mix" / "config.json", quantized);
  WriteJson(root_ / "int4mix-dequantized" / "config.json", config_);
  ExpectSameLogits(root_ / "int4mix", root_ / "int4mix-dequantized");
}

TEST_F(QuantizedCheckpoint, Nvfp4MatchesDequantizedFp32) {
  const std::regex experts(R"(model\.layers\.[1-9]\d*\.mlp\.experts\.\d+\.(gate|up|down)_proj$)");
  auto encode = [&](const std::string& m) {
    return std::regex_match(m, experts) ? Encoding{Encoding::kNvfp4, 4, 16} : Encoding{};
  };
  int count = 0;
  WriteCheckpoints(tensors_, encode, root_ / "nvfp4", root_ / "nvfp4-dequantized", &count);
  EXPECT_GT(count, 40);
  std::ofstream(root_ / "nvfp4" / "hf_quant_config.json") << R"({
    "producer": {"name": "modelopt", "version": "0.46.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                     "exclude_modules": ["lm_head", "model.layers.*.self_attn*",
                                         "model.layers.*.mlp.shared_experts*",
                                         "model.layers.*.mlp.gate", "model.layers.0.*"]}})";
  WriteJson(root_ / "nvfp4" / "config.json", config_);
  WriteJson(root_ / "nvfp4-dequantized" / "config.json", config_);
  ExpectSameLogits(root_ / "nvfp4", root_ / "nvfp4-dequantized");
}

TEST_F(QuantizedCheckpoint, ExcludedModuleStoredQuantizedIsRefused) {
  const std::regex experts(R"(.*mlp\.experts\.\d+\.(gate|up|down)_proj$)");
  auto encode = [&](const std::string& m) {
    return std::regex_match(m, experts) ? Encoding{Encoding::kNvfp4, 4, 16} : Encoding{};
  };
  int count = 0;
  WriteCheckpoints(tensors_, encode, root_ / "bad", root_ / "bad-dequantized", &count);
  std::ofstream(root_ / "bad" / "hf_quant_config.json")
      << R"({"quantization": {"quant_algo": "NVFP4", "group_size": 16,
                             "exclude_modules": ["*experts.3.*"]}})";
  WriteJson(root_ / "bad" / "config.json", config_);
  ModelLoadOptions o;
  o.model_dir = (root_ / "bad").string();
  o.kv = {4, 64};
  auto m = LoadGlmMoeDsa(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("experts.3."), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("ignores it (pattern \"*experts.3.*\")"), std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace glm::engine
