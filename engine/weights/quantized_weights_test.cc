// compressed-tensors pack-quantized INT4/INT8 and ModelOpt NVFP4 through WeightStore: exact
// dequantization of hand-packed bits, the packers' round trip, TP row/column slices, the
// ignore / exclude cross-check and each refusal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "engine/config/quantization_config.h"
#include "engine/weights/dequantize.h"
#include "engine/weights/float_codec.h"
#include "engine/weights/safetensors_writer.h"
#include "engine/weights/tensor_filter.h"
#include "engine/weights/weight_store.h"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  return (testing_util::ScratchDir("quantized_weights") / name).string();
}

QuantizationConfig Ct(const std::string& groups, const std::string& ignore = "[]") {
  auto q = ParseQuantizationConfig(
      R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": )" +
          groups + R"(, "ignore": )" + ignore + "}",
      "test/config.json");
  EXPECT_TRUE(q.ok()) << q.status();
  return *q;
}

std::string CtGroup(const std::string& name, const std::string& target, int bits, int group) {
  const std::string strategy =
      group > 0 ? R"("strategy": "group", "group_size": )" + std::to_string(group)
                : std::string(R"("strategy": "channel")");
  return "\"" + name + R"(": {"targets": [")" + target + R"("], "weights": {"num_bits": )" +
         std::to_string(bits) + R"(, "type": "int", "symmetric": true, )" + strategy + "}}";
}

QuantizationConfig Nvfp4(const std::string& exclude = R"(["lm_head", "*self_attn*"])") {
  auto q = ParseHfQuantConfig(
      R"({"quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": )" +
          exclude + "}}",
      "test/hf_quant_config.json");
  EXPECT_TRUE(q.ok()) << q.status();
  return *q;
}

std::unique_ptr<WeightStore> Open(const SafetensorsWriter& writer, const std::string& file,
                                  std::optional<QuantizationConfig> quantization,
                                  TensorFilter filter = {}) {
  const std::string path = TempPath(file);
  EXPECT_TRUE(writer.WriteFile(path).ok());
  WeightStoreOptions options;
  options.quantization = std::move(quantization);
  options.filter = std::move(filter);
  auto store = WeightStore::Open(path, std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

// Packs signed values q (one row after another, `cols` per row) into I32 words, low bits first,
// offset-unsigned, as compressed-tensors' pack_to_int32 does.
std::vector<std::byte> PackRows(const std::vector<int>& q, int64_t cols, int bits) {
  const int64_t per_word = 32 / bits;
  const int64_t rows = static_cast<int64_t>(q.size()) / cols;
  const int64_t words = (cols + per_word - 1) / per_word;
  std::vector<uint32_t> packed(static_cast<size_t>(rows * words), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const uint32_t u = static_cast<uint32_t>(q[r * cols + k] + (1 << (bits - 1)));
      packed[r * words + k / per_word] |= u << (bits * (k % per_word));
    }
  }
  std::vector<std::byte> bytes(packed.size() * 4);
  std::memcpy(bytes.data(), packed.data(), bytes.size());
  return bytes;
}

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// q[r][k] for a [rows, cols] test pattern covering the whole signed range of `bits`.
std::vector<int> Codes(int64_t rows, int64_t cols, int bits) {
  const int lo = -(1 << (bits - 1));
  const int span = 1 << bits;
  std::vector<int> q(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) q[i] = lo + static_cast<int>((i * 7 + i / cols) % span);
  return q;
}

// Adds a hand-packed module and returns the expected dequantized [rows, cols].
std::vector<float> AddHandPacked(SafetensorsWriter& w, const std::string& module, int64_t rows,
                                 int64_t cols, int bits, int64_t group) {
  const std::vector<int> q = Codes(rows, cols, bits);
  const int64_t groups = group > 0 ? (cols + group - 1) / group : 1;
  std::vector<float> scales(static_cast<size_t>(rows * groups));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = std::ldexp(1.0f + 0.125f * (i % 8), -int(i % 5));
  const int64_t words = (cols * bits + 31) / 32;
  EXPECT_TRUE(w.Add(module + ".weight_packed", DType::kI32, {rows, words}, PackRows(q, cols, bits)).ok());
  EXPECT_TRUE(w.AddFloat(module + ".weight_scale", DType::kBF16, {rows, groups}, scales).ok());
  const std::vector<int32_t> shape = {static_cast<int32_t>(rows), static_cast<int32_t>(cols)};
  EXPECT_TRUE(w.Add(module + ".weight_shape", DType::kI32, {2}, Bytes(shape)).ok());
  std::vector<float> expected(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      expected[r * cols + k] =
          static_cast<float>(q[r * cols + k]) * scales[r * groups + (group > 0 ? k / group : 0)];
    }
  }
  return expected;
}

std::vector<float> Cut(const std::vector<float>& m, int64_t cols, int64_t r0, int64_t r1,
                       int64_t c0, int64_t c1) {
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) out.push_back(m[r * cols + c]);
  }
  return out;
}

TEST(PackQuantized, Int4GroupInt4ChannelInt8GroupExact) {
  SafetensorsWriter w;
  const std::string expert = "model.layers.3.mlp.experts.1.down_proj";
  const std::string mtp = "model.layers.9.mlp.experts.0.up_proj";
  const std::string attn = "model.layers.3.self_attn.o_proj";
  const auto int4_group = AddHandPacked(w, expert, 3, 64, 4, 16);
  const auto int4_channel = AddHandPacked(w, mtp, 4, 24, 4, 0);
  const auto int8_group = AddHandPacked(w, attn, 5, 40, 8, 16);  // partial last group
  ASSERT_TRUE(w.AddFloat("model.layers.3.mlp.gate.weight", DType::kF32, {2, 3},
                         std::vector<float>{1, 2, 3, 4, 5, 6})
                  .ok());
  const QuantizationConfig config =
      Ct("{" + CtGroup("experts", "re:.*experts\\\\.\\\\d+\\\\.(gate|up|down)_proj$", 4, 16) + ", " +
         CtGroup("mtp", "re:model\\\\.layers\\\\.9\\\\.", 4, 0) + ", " +
         CtGroup("attn", attn, 8, 16) + "}",
         R"(["re:.*mlp\\.gate$"])");
  // The MTP experts also match the experts regex: the group the tensors agree with is used.
  auto store = Open(w, "ct.safetensors", config);

  EXPECT_TRUE(store->Contains(expert + ".weight"));
  EXPECT_EQ(*store->ShapeOf(expert + ".weight"), (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(*store->EncodingOf(expert + ".weight"), WeightStore::Encoding::kPackedInt);
  EXPECT_EQ(store->PartsOf(expert + ".weight"),
            (std::vector<std::string>{expert + ".weight_packed", expert + ".weight_scale",
                                      expert + ".weight_shape"}));
  auto a = store->ReadFloat(expert + ".weight", {3, 64});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, int4_group);
  auto b = store->ReadFloat(mtp + ".weight");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, int4_channel);
  auto c = store->ReadFloat(attn + ".weight");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, int8_group);
  // Unquantized tensors keep their dtype.
  EXPECT_EQ(*store->ReadFloat("model.layers.3.mlp.gate.weight"),
            (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(*store->EncodingOf("model.layers.3.mlp.gate.weight"), WeightStore::Encoding::kPlain);

  // Without the config the tensors describe themselves.
  auto bare = Open(w, "ct_bare.safetensors", std::nullopt);
  EXPECT_EQ(*bare->ReadFloat(expert + ".weight"), int4_group);
  EXPECT_EQ(*bare->ReadFloat(mtp + ".weight"), int4_channel);
}

TEST(PackQuantized, TensorParallelSlices) {
  SafetensorsWriter w;
  const std::string m = "model.layers.2.self_attn.o_proj";
  const std::string ch = "model.layers.2.self_attn.q_b_proj";
  const auto full = AddHandPacked(w, m, 6, 64, 4, 16);
  const auto channel = AddHandPacked(w, ch, 4, 48, 8, 0);
  auto store = Open(w, "slices.safetensors",
                    Ct("{" + CtGroup("g", m, 4, 16) + ", " + CtGroup("c", ch, 8, 0) + "}"));

  auto rows = store->ReadRowSlice(m + ".weight", 2, 5);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, Cut(full, 64, 2, 5, 0, 64));
  auto cols = store->ReadColSlice(m + ".weight", 32, 64);
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_EQ(*cols, Cut(full, 64, 0, 6, 32, 64));

  auto split = store->ReadColSlice(m + ".weight", 8, 40);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("splits a quantization group of 16"), std::string::npos)
      << split.status();
  EXPECT_NE(split.status().message().find(m + ".weight_packed"), std::string::npos);

  // Per-channel scales: any column range keeps whole scales.
  auto any = store->ReadColSlice(ch + ".weight", 5, 29);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(*any, Cut(channel, 48, 0, 4, 5, 29));
}

TEST(PackQuantized, PackerRoundTrip) {
  SafetensorsWriter w;
  std::vector<float> values(8 * 96);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * i) * (1 + i % 5);
  values[5] = 0;  // a zero row segment stays zero
  std::vector<float> int4, int8, channel;
  ASSERT_TRUE(w.AddPackQuantized("a", {8, 96}, values, 4, 32, &int4).ok());
  ASSERT_TRUE(w.AddPackQuantized("b", {8, 96}, values, 8, 32, &int8).ok());
  ASSERT_TRUE(w.AddPackQuantized("c", {8, 96}, values, 8, 0, &channel).ok());
  auto store = Open(w, "roundtrip.safetensors", std::nullopt);
  EXPECT_EQ(*store->ReadFloat("a.weight"), int4);
  EXPECT_EQ(*store->ReadFloat("b.weight"), int8);
  EXPECT_EQ(*store->ReadFloat("c.weight"), channel);
  // RTN error: half a step (absmax / 7.5 or absmax / 127.5, |values| <= 5) inside the range;
  // up to a whole step at +absmax, which maps to qmax + 0.5 and clamps to qmax (a bf16 scale
  // rounded down adds to it).
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_LE(std::fabs(int4[i] - values[i]), 5.0f / 7.5f) << i;
    EXPECT_LE(std::fabs(int8[i] - values[i]), 5.0f / 127.5f) << i;
  }
}

TEST(PackQuantized, IgnoreAndConfigMismatchesAreRefused) {
  SafetensorsWriter w;
  const std::string m = "model.layers.0.self_attn.q_a_proj";
  AddHandPacked(w, m, 2, 32, 4, 16);

  // The module is ignored but stored packed.
  auto ignored = Open(w, "ignored.safetensors",
                      Ct("{" + CtGroup("g", "Linear", 4, 16) + "}", R"(["re:model\\.layers\\.0\\."])"));
  auto a = ignored->ReadFloat(m + ".weight");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("ignores it (pattern \"re:model\\.layers\\.0\\.\")"),
            std::string::npos)
      << a.status();

  // The config's bit width disagrees with the packed width.
  auto bits = Open(w, "bits.safetensors", Ct("{" + CtGroup("g8", m, 8, 16) + "}"));
  auto b = bits->ReadFloat(m + ".weight");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("config group 'g8' (8-bit"), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("packs to [2, 8]"), std::string::npos) << b.status();

  // The group size disagrees with the scale width.
  auto group = Open(w, "group.safetensors", Ct("{" + CtGroup("g", m, 4, 8) + "}"));
  auto g = group->ReadFloat(m + ".weight");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("group_size 8 needs [2, 4]"), std::string::npos)
      << g.status();

  // An fp8 config over pack-quantized tensors.
  QuantizationConfig fp8;
  fp8.quant_method = "fp8";
  fp8.source = "test/config.json";
  auto other = Open(w, "fp8cfg.safetensors", fp8);
  auto o = other->ReadFloat(m + ".weight");
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("declares fp8 block-scaled"), std::string::npos)
      << o.status();

  // A missing weight_shape.
  SafetensorsWriter partial;
  const std::vector<int> q = Codes(2, 32, 4);
  ASSERT_TRUE(partial.Add(m + ".weight_packed", DType::kI32, {2, 4}, PackRows(q, 32, 4)).ok());
  ASSERT_TRUE(partial.AddFloat(m + ".weight_scale", DType::kBF16, {2, 2},
                               std::vector<float>{1, 1, 1, 1}).ok());
  auto incomplete = Open(partial, "partial.safetensors", std::nullopt);
  auto p = incomplete->ReadFloat(m + ".weight");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(m + ".weight_shape"), std::string::npos) << p.status();
}

TEST(PackQuantized, LayerFilterSelectsCompanions) {
  SafetensorsWriter w;
  AddHandPacked(w, "model.layers.1.mlp.down_proj", 2, 32, 8, 16);
  AddHandPacked(w, "model.layers.2.mlp.down_proj", 2, 32, 8, 16);
  auto store = Open(w, "filter.safetensors", std::nullopt, LayerRangeFilter(2, 2, false, false));
  EXPECT_FALSE(store->Contains("model.layers.1.mlp.down_proj.weight"));
  EXPECT_TRUE(store->Contains("model.layers.2.mlp.down_proj.weight"));
  EXPECT_EQ(store->num_tensors(), 3u);
  EXPECT_TRUE(store->ReadFloat("model.layers.2.mlp.down_proj.weight").ok());
}

// An NVFP4 module from explicit codes: row r, element k has code codes[(r * cols + k) % 16].
struct Nvfp4Module {
  std::vector<float> expected;
};
Nvfp4Module AddHandNvfp4(SafetensorsWriter& w, const std::string& module, int64_t rows,
                         int64_t cols, float scale_2) {
  std::vector<std::byte> bytes(static_cast<size_t>(rows * cols / 2), std::byte{0});
  const int64_t blocks = (cols + 15) / 16;
  std::vector<uint8_t> scale_codes(static_cast<size_t>(rows * blocks));
  // e4m3 0x30 = 0.5, 0x38 = 1, 0x40 = 2, 0x4c = 6, 0x01 = 2^-9 (subnormal).
  const uint8_t kScales[] = {0x30, 0x38, 0x40, 0x4c, 0x01};
  for (size_t i = 0; i < scale_codes.size(); ++i) scale_codes[i] = kScales[i % 5];
  Nvfp4Module out;
  const float kE2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const uint8_t code = static_cast<uint8_t>((r * cols + k * 3) % 16);
      bytes[(r * cols + k) / 2] |= static_cast<std::byte>(k % 2 == 0 ? code : code << 4);
      const float block = Fp8E4M3ToFloat(scale_codes[r * blocks + k / 16]);
      out.expected.push_back(kE2m1[code] * block * scale_2);
    }
  }
  EXPECT_TRUE(w.Add(module + ".weight", DType::kU8, {rows, cols / 2}, bytes).ok());
  EXPECT_TRUE(w.Add(module + ".weight_scale", DType::kF8E4M3, {rows, blocks},
                    std::as_bytes(std::span<const uint8_t>(scale_codes)))
                  .ok());
  EXPECT_TRUE(w.AddFloat(module + ".weight_scale_2", DType::kF32, {}, std::vector<float>{scale_2}).ok());
  EXPECT_TRUE(w.AddFloat(module + ".input_scale", DType::kF32, {}, std::vector<float>{0.5f}).ok());
  return out;
}

TEST(Nvfp4, ExactWithGateAndUpScales) {
  EXPECT_EQ(E2m1ToFloat(7), 6.0f);
  EXPECT_EQ(E2m1ToFloat(0xB), -1.5f);
  SafetensorsWriter w;
  const std::string gate = "model.layers.3.mlp.experts.4.gate_proj";
  const std::string up = "model.layers.3.mlp.experts.4.up_proj";
  const auto g = AddHandNvfp4(w, gate, 4, 48, 0.0078125f);
  const auto u = AddHandNvfp4(w, up, 4, 48, 3.0e-3f);  // a different global scale
  ASSERT_TRUE(w.AddFloat("model.layers.3.self_attn.o_proj.weight", DType::kBF16, {2, 2},
                         std::vector<float>{1, -2, 0.5, 4})
                  .ok());
  auto store = Open(w, "nvfp4.safetensors", Nvfp4());
  EXPECT_EQ(*store->EncodingOf(gate + ".weight"), WeightStore::Encoding::kNvfp4);
  EXPECT_EQ(*store->ShapeOf(gate + ".weight"), (std::vector<int64_t>{4, 48}));
  EXPECT_EQ(store->PartsOf(up + ".weight"),
            (std::vector<std::string>{up + ".weight", up + ".weight_scale",
                                      up + ".weight_scale_2", up + ".input_scale"}));
  EXPECT_EQ(*store->ReadFloat(gate + ".weight"), g.expected);
  EXPECT_EQ(*store->ReadFloat(up + ".weight"), u.expected);
  EXPECT_NE(g.expected, u.expected);
  // Excluded BF16 attention keeps its dtype.
  EXPECT_EQ(*store->ReadFloat("model.layers.3.self_attn.o_proj.weight"),
            (std::vector<float>{1, -2, 0.5, 4}));

  // Slices: rows anywhere, columns on 16-input blocks.
  EXPECT_EQ(*store->ReadRowSlice(up + ".weight", 1, 3), Cut(u.expected, 48, 1, 3, 0, 48));
  EXPECT_EQ(*store->ReadColSlice(up + ".weight", 16, 48), Cut(u.expected, 48, 0, 4, 16, 48));
  auto split = store->ReadColSlice(up + ".weight", 0, 24);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("splits a quantization group of 16"), std::string::npos);
}

TEST(Nvfp4, PackerRoundTrip) {
  SafetensorsWriter w;
  std::vector<float> values(6 * 64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::cos(0.11f * i) * (0.01f + i % 7);
  std::vector<float> a, b;
  ASSERT_TRUE(w.AddNvfp4Quantized("m.a", {6, 64}, values, &a).ok());
  ASSERT_TRUE(w.AddNvfp4Quantized("m.b", {6, 64}, values, &b, 1.0e-3f).ok());
  auto store = Open(w, "nvfp4_roundtrip.safetensors", std::nullopt);
  EXPECT_EQ(*store->ReadFloat("m.a.weight"), a);
  EXPECT_EQ(*store->ReadFloat("m.b.weight"), b);
  double err = 0, ref = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    err += std::fabs(a[i] - values[i]);
    ref += std::fabs(values[i]);
  }
  EXPECT_LT(err / ref, 0.15);  // e2m1 with per-16 scales: ~10 % mean relative error
}

TEST(Nvfp4, Refusals) {
  SafetensorsWriter w;
  const std::string m = "model.layers.3.self_attn.o_proj";
  AddHandNvfp4(w, m, 2, 32, 1.0f);
  auto excluded = Open(w, "excluded.safetensors", Nvfp4());
  auto e = excluded->ReadFloat(m + ".weight");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("ignores it (pattern \"*self_attn*\")"), std::string::npos)
      << e.status();

  auto ct = Open(w, "nvfp4_ctcfg.safetensors", Ct("{" + CtGroup("g", "Linear", 4, 16) + "}"));
  auto c = ct->ReadFloat(m + ".weight");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is NVFP4 but test/config.json declares "
                                      "compressed-tensors pack-quantized"),
            std::string::npos)
      << c.status();

  SafetensorsWriter partial;
  std::vector<std::byte> bytes(32, std::byte{0x11});
  ASSERT_TRUE(partial.Add(m + ".weight", DType::kU8, {2, 16}, bytes).ok());
  ASSERT_TRUE(partial.Add(m + ".weight_scale", DType::kF8E4M3, {2, 2},
                          std::vector<std::byte>(4, std::byte{0x38}))
                  .ok());
  auto incomplete = Open(partial, "nvfp4_partial.safetensors", Nvfp4("[]"));
  auto p = incomplete->ReadFloat(m + ".weight");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(m + ".weight_scale_2"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace glm::engine
