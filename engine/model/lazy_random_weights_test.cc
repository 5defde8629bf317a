// LazyRandomWeights: the same tensor set as MakeRandomWeights, deterministic values whatever the
// thread count or request order, the intended statistics, and a model that loads and decodes.
#include "engine/model/lazy_random_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/random_weights.h"

namespace glm::engine {
namespace {

TEST(LazyRandomWeights, SameTensorsAndShapesAsMakeRandomWeights) {
  for (bool index_share : {false, true}) {
    const ModelConfig c = SmallTestConfig(4, 1, index_share);
    InMemoryWeights eager;
    MakeRandomWeights(c, 7, &eager);
    LazyRandomWeights lazy(c, {});
    EXPECT_EQ(lazy.specs().size(), eager.tensors().size());
    for (const auto& [name, tensor] : eager.tensors()) {
      ASSERT_TRUE(lazy.Has(name)) << name;
      std::vector<int64_t> shape;
      auto data = lazy.ReadFloat(name, &shape);
      ASSERT_TRUE(data.ok()) << data.status();
      EXPECT_EQ(shape, tensor.shape) << name;
      EXPECT_EQ(data->size(), tensor.data.size()) << name;
    }
    EXPECT_FALSE(lazy.Has("model.layers.99.mlp.gate.weight"));
    std::vector<int64_t> shape;
    EXPECT_EQ(lazy.ReadFloat("no.such.tensor", &shape).status().code(),
              absl::StatusCode::kNotFound);
  }
}

TEST(LazyRandomWeights, ValuesIndependentOfThreadsAndOrder) {
  const ModelConfig c = SmallTestConfig(2, 0, false);
  LazyRandomWeights a(c, {.seed = 3, .num_threads = 1, .prefetch = false});
  LazyRandomWeights b(c, {.seed = 3, .num_threads = 5, .prefetch = true});
  LazyRandomWeights other_seed(c, {.seed = 4, .num_threads = 1, .prefetch = false});
  // b in reverse order (every prefetch is discarded), a in load order.
  std::vector<std::vector<float>> from_b;
  for (auto it = b.specs().rbegin(); it != b.specs().rend(); ++it) {
    from_b.push_back(*b.ReadFloat(it->name, nullptr));
  }
  for (size_t i = 0; i < a.specs().size(); ++i) {
    const auto& name = a.specs()[i].name;
    EXPECT_EQ(*a.ReadFloat(name, nullptr), from_b[from_b.size() - 1 - i]) << name;
    EXPECT_NE(*a.ReadFloat(name, nullptr), *other_seed.ReadFloat(name, nullptr)) << name;
  }
  EXPECT_EQ(a.bytes_served(), 2 * a.TotalBytes());
}

TEST(LazyRandomWeights, FillIsThreadCountInvariantWithTheIntendedMoments) {
  const size_t n = (3u << 20) + 1;  // odd and large enough for several threads
  std::vector<float> one(n), many(n);
  LazyRandomWeights::Fill(11, 0.5f, 2.0f, 1, &one);
  LazyRandomWeights::Fill(11, 0.5f, 2.0f, 7, &many);
  EXPECT_EQ(one, many);
  double sum = 0, sq = 0;
  float lo = 1e9f, hi = -1e9f;
  for (float x : one) {
    sum += x;
    sq += (x - 0.5) * (x - 0.5);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(sq / n, 4.0 / 3.0, 0.01);  // uniform on [-2, 2): variance bound^2 / 3
  EXPECT_GE(lo, -1.5f);
  EXPECT_LE(hi, 2.5f);  // 0.5 + 2 * (1 - 2^-31) rounds to 2.5 in fp32
  EXPECT_LT(lo, -1.49f);
  EXPECT_GT(hi, 2.49f);
}

TEST(LazyRandomWeights, LinearScalingMatchesRandomWeights) {
  const ModelConfig c = SmallTestConfig(1, 0, false);
  LazyRandomWeights lazy(c, {});
  for (const auto& s : lazy.specs()) {
    if (s.name == "model.layers.0.self_attn.q_b_proj.weight") {
      // gain 2 over in = q_lora_rank: stddev 2 / sqrt(32).
      EXPECT_NEAR(s.stddev, 2.0f / std::sqrt(32.0f), 1e-6);
      EXPECT_EQ(s.mean, 0.0f);
    }
    if (s.name == "model.norm.weight") {
      EXPECT_EQ(s.mean, 1.0f);
      EXPECT_NEAR(s.stddev, 0.1f, 1e-6);
    }
  }
}

TEST(LazyRandomWeights, ServesLinearWeightsAsFp8BlocksWithTheSameSpread) {
  ModelConfig c = SmallTestConfig(1, 0, false);
  c.hidden_size = 256;  // two 128-column blocks
  LazyRandomWeights plain(c, {});
  LazyRandomWeights fp8(c, {.seed = 2, .num_threads = 3, .fp8_linear = true});
  const std::string q_a = "model.layers.0.self_attn.q_a_proj.weight";
  EXPECT_FALSE(plain.IsFp8Block(q_a));
  EXPECT_TRUE(fp8.IsFp8Block(q_a));
  EXPECT_TRUE(fp8.IsFp8Block("lm_head.weight"));
  EXPECT_TRUE(fp8.IsFp8Block("model.layers.0.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(fp8.IsFp8Block("model.layers.0.self_attn.kv_b_proj.weight"));
  EXPECT_TRUE(fp8.IsFp8Block("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"));
  EXPECT_FALSE(fp8.IsFp8Block("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(fp8.IsFp8Block("model.embed_tokens.weight"));
  EXPECT_FALSE(fp8.IsFp8Block("model.norm.weight"));
  EXPECT_FALSE(plain.ReadFp8Block(q_a).ok());

  auto t = fp8.ReadFp8Block("lm_head.weight");  // [256, 256], gain 4: stddev 4 / 16
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape, (std::vector<int64_t>{c.vocab_size, 256}));
  ASSERT_EQ(t->data.size(), static_cast<size_t>(c.vocab_size * 256));
  ASSERT_EQ(t->scales.size(), static_cast<size_t>((c.vocab_size + 127) / 128 * 2));
  double sq = 0;
  for (uint8_t b : t->data) {
    ASSERT_NE(b & 0x7F, 0x7F) << "NaN code";
    const int e = (b >> 3) & 0xF, m = b & 7;
    const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    sq += v * v * t->scales[0] * t->scales[0];
  }
  EXPECT_NEAR(std::sqrt(sq / t->data.size()), 0.25, 0.01);
  // Deterministic.
  EXPECT_EQ(fp8.ReadFp8Block("lm_head.weight")->data, t->data);
}

TEST(LazyRandomWeights, ServesQuantizedLayoutsAsStoredWithTheSameSpread) {
  ModelConfig c = SmallTestConfig(1, 0, false);
  c.hidden_size = 256;  // two 128-input groups
  using Q = LazyRandomWeights::Options::Quantized;
  LazyRandomWeights plain(c, {});
  LazyRandomWeights mix(c, {.seed = 3, .num_threads = 3, .quantized = Q::kInt4Int8Mix});
  LazyRandomWeights fp4(c, {.seed = 3, .quantized = Q::kNvfp4});
  const std::string expert = "model.layers.0.mlp.experts.1.gate_proj.weight";
  const std::string q_a = "model.layers.0.self_attn.q_a_proj.weight";
  EXPECT_FALSE(plain.QuantizedInfoOf(expert).has_value());
  EXPECT_EQ(mix.QuantizedInfoOf(expert)->dtype, WeightDType::kInt4);
  EXPECT_EQ(mix.QuantizedInfoOf(expert)->group_size, 128);
  EXPECT_EQ(mix.QuantizedInfoOf(q_a)->dtype, WeightDType::kInt8);
  EXPECT_EQ(mix.QuantizedInfoOf("model.layers.0.self_attn.o_proj.weight")->dtype,
            WeightDType::kInt8);
  EXPECT_FALSE(mix.QuantizedInfoOf("model.layers.0.mlp.gate.weight").has_value());
  EXPECT_FALSE(mix.QuantizedInfoOf("model.layers.0.self_attn.indexer.wk.weight").has_value());
  EXPECT_FALSE(mix.QuantizedInfoOf("lm_head.weight").has_value());
  EXPECT_EQ(fp4.QuantizedInfoOf(expert)->dtype, WeightDType::kNvfp4);
  EXPECT_FALSE(fp4.QuantizedInfoOf(q_a).has_value());
  EXPECT_EQ(plain.ReadQuantized(expert, {}).status().code(), absl::StatusCode::kNotFound);

  // Dequantized W[r][k] = q * scale * global; its spread is the fp32 tensor's.
  auto spread = [](const QuantizedTensor& t) {
    double sq = 0;
    int64_t n = 0;
    for (int64_t r = 0; r < t.shape[0]; ++r) {
      for (int64_t k = 0; k < t.shape[1]; ++k) {
        const uint8_t* row = t.data.data() + r * t.row_bytes;
        double q = 0, s = 0;
        if (t.dtype == WeightDType::kNvfp4) {
          static const double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
          const int code = (row[k / 2] >> (4 * (k % 2))) & 0xF;
          q = (code & 8 ? -1 : 1) * kE2m1[code & 7];
          const uint8_t e = t.scales[r * t.scale_cols + k / t.group_size];
          EXPECT_EQ(e, 0x38);  // e4m3 1.0
          s = t.global_scale;
        } else {
          const int bits = t.dtype == WeightDType::kInt4 ? 4 : 8;
          const int per_word = 32 / bits;
          uint32_t word;
          std::memcpy(&word, row + 4 * (k / per_word), 4);
          const int u = (word >> (bits * (k % per_word))) & ((1 << bits) - 1);
          q = u - (1 << (bits - 1));
          uint16_t b;
          std::memcpy(&b, t.scales.data() + 2 * (r * t.scale_cols + k / t.group_size), 2);
          const uint32_t f = static_cast<uint32_t>(b) << 16;
          float fs;
          std::memcpy(&fs, &f, 4);
          s = fs;
        }
        sq += q * q * s * s;
        ++n;
      }
    }
    return std::sqrt(sq / n);
  };
  std::vector<int64_t> shape;
  for (LazyRandomWeights* w : {&mix, &fp4}) {
    for (const std::string& name : {expert, q_a}) {
      if (!w->QuantizedInfoOf(name).has_value()) continue;
      auto whole = w->ReadQuantized(name, {});
      ASSERT_TRUE(whole.ok()) << whole.status();
      auto fp32 = plain.ReadFloat(name, &shape);
      ASSERT_TRUE(fp32.ok());
      EXPECT_EQ(whole->full_shape, shape);
      EXPECT_EQ(whole->shape, shape);
      double sq = 0;
      for (float v : *fp32) sq += static_cast<double>(v) * v;
      const double want = std::sqrt(sq / fp32->size());
      EXPECT_NEAR(spread(*whole), want, 0.05 * want) << name;
      // A column slice on group boundaries is the whole tensor's bytes; deterministic.
      auto cols = w->ReadQuantized(name, {TensorSlice::kCols, 128, 256});
      ASSERT_TRUE(cols.ok()) << cols.status();
      EXPECT_EQ(cols->shape, (std::vector<int64_t>{shape[0], 128}));
      for (int64_t r = 0; r < shape[0]; ++r) {
        ASSERT_EQ(0, std::memcmp(cols->data.data() + r * cols->row_bytes,
                                 whole->data.data() + r * whole->row_bytes + whole->row_bytes / 2,
                                 cols->row_bytes));
      }
      EXPECT_EQ(w->ReadQuantized(name, {})->data, whole->data);
      EXPECT_EQ(w->ReadQuantized(name, {TensorSlice::kCols, 8, 256}).status().code(),
                absl::StatusCode::kInvalidArgument);  // splits a group
    }
  }
}

TEST(LazyRandomWeights, ModelLoadsAndDecodesFiniteLogits) {
  const ModelConfig c = SmallTestConfig(3, 1, true);
  LazyRandomWeights lazy(c, {.seed = 5});
  std::unique_ptr<Backend> backend = CreateCpuBackend(2);
  ModelLoadOptions o;
  o.kv = {4, 16};
  auto model = CreateGlmMoeDsa(c, lazy, backend.get(), o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(lazy.bytes_served(), lazy.TotalBytes());
  // Decode at start_pos 20 over zero-filled cache blocks (what the decode benchmark does).
  ForwardBatch batch;
  for (int s = 0; s < 2; ++s) {
    SequenceSlice slice;
    slice.seq_id = s;
    slice.token_ids = {17 + s};
    slice.start_pos = 20;
    for (int b = 0; b < 6; ++b) slice.block_table.push_back(s * 6 + b);
    batch.seqs.push_back(slice);
  }
  ForwardResult r;
  ASSERT_TRUE((*model)->Forward(batch, &r).ok());
  ASSERT_EQ(r.seqs.size(), 2u);
  float max_abs = 0;
  for (const auto& seq : r.seqs) {
    ASSERT_EQ(seq.logits.size(), static_cast<size_t>(c.vocab_size));
    for (float x : seq.logits) {
      ASSERT_TRUE(std::isfinite(x));
      max_abs = std::max(max_abs, std::fabs(x));
    }
  }
  EXPECT_GT(max_abs, 0.0f);
}

}  // namespace
}  // namespace glm::engine
