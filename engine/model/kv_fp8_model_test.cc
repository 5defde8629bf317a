// The model with an fp8 KV cache (KvCacheGeometry::dtype = kFp8) on the CPU backend is exactly
// the fp32-KV model whose cache rows were rounded through the fp8 layouts: an fp32-KV model on a
// CPU backend whose ScatterRows quantizes and dequantizes the rows it writes into the cache
// (engine/backend/cpu/cpu_kv_fp8.h) gives the same logits (chunked prefill, expanded and absorbed
// forms, a mixed prefill + decode step, greedy decode, IndexShare). So any difference between
// fp8-KV and fp32-KV runs is the quantization of the cache itself, and the layouts, slots and
// dispatch are right. Also: the KV bytes per token (656 + 132 at GLM-5 widths) and the errors.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/cpu_kv_fp8.h"
#include "engine/backend/kv_fp8_layout.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/kv_storage.h"
#include "engine/model/random_weights.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

// A CPU backend whose paged writes into a cache of `latent_cols` / `index_cols` columns round
// every row through the fp8 layout first (fake quantization).
class FakeQuantCpuBackend final : public CpuBackend {
 public:
  FakeQuantCpuBackend(const ModelConfig& c)
      : CpuBackend(2),
        kvr_(static_cast<int>(c.kv_lora_rank)),
        rope_(static_cast<int>(c.qk_rope_head_dim)),
        index_dim_(static_cast<int>(c.index_head_dim)) {}
  void ScatterRows(const MatView& src, const int32_t* rows, const MatView& dst) override {
    std::vector<float> tmp(src.rows * src.cols);
    for (int64_t r = 0; r < src.rows; ++r) {
      float* out = tmp.data() + r * src.cols;
      if (src.cols == kvr_ + rope_) {
        std::vector<uint8_t> q(kv_fp8::LatentRowBytes(kvr_, rope_));
        cpu_kv_fp8::QuantizeLatentRow(src.Row(r), kvr_, rope_, q.data());
        cpu_kv_fp8::DequantizeLatentRow(q.data(), kvr_, rope_, out);
      } else {
        std::vector<uint8_t> q(index_dim_ + 4);
        float scale;
        cpu_kv_fp8::QuantizeIndexKey(src.Row(r), index_dim_, q.data(), &scale);
        Fp8IndexCache one{q.data(), 1, index_dim_, 1};
        std::memcpy(q.data() + index_dim_, &scale, 4);
        cpu_kv_fp8::DequantizeIndexKey(one, 0, out);
      }
    }
    CpuBackend::ScatterRows(MatView{tmp.data(), src.rows, src.cols, src.cols}, rows, dst);
  }

 private:
  int kvr_, rope_, index_dim_;
};

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + seed * 11 + 5) % 256;
  return t;
}

void ExpectSame(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double{a[i]} - b[i]));
    max_ref = std::max(max_ref, std::fabs(double{b[i]}));
  }
  EXPECT_LE(max_diff, 1e-6 * std::max(max_ref, 1.0)) << what;
}

struct Param {
  bool index_share;
  bool expanded;
};

class KvFp8ModelTest : public ::testing::TestWithParam<Param> {};

TEST_P(KvFp8ModelTest, Fp8KvEqualsFp32KvOnFakeQuantizedRows) {
  const Param p = GetParam();
  const ModelConfig config = SmallTestConfig(4, 1, p.index_share);
  InMemoryWeights weights;
  MakeRandomWeights(config, 99, &weights);
  auto fp8_backend = CreateCpuBackend(2);
  FakeQuantCpuBackend fake_backend(config);
  ASSERT_NE(config.kv_lora_rank + config.qk_rope_head_dim, config.index_head_dim);
  ModelLoadOptions o;
  o.kv = {4, 64, KvDType::kFp8};
  o.expanded_prefill = p.expanded;
  auto m8 = CreateGlmMoeDsa(config, weights, fp8_backend.get(), o);
  ASSERT_TRUE(m8.ok()) << m8.status();
  o.kv.dtype = KvDType::kF32;
  auto mq = CreateGlmMoeDsa(config, weights, &fake_backend, o);
  ASSERT_TRUE(mq.ok()) << mq.status();
  const int64_t V = config.vocab_size;

  std::vector<int32_t> table1(16), table2(16);
  for (int b = 0; b < 16; ++b) {
    table1[b] = b;
    table2[b] = 63 - b;
  }
  auto both = [&](const ForwardBatch& batch, const std::string& what) {
    ForwardResult r8, rq;
    EXPECT_TRUE((*m8)->Forward(batch, &r8).ok()) << what;
    EXPECT_TRUE((*mq)->Forward(batch, &rq).ok()) << what;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      ExpectSame(r8.seqs[i].logits, rq.seqs[i].logits, absl::StrCat(what, " seq ", i));
    }
    return r8;
  };
  const std::vector<int32_t> prompt = Prompt(37, 1);
  for (size_t start = 0; start < prompt.size(); start += 7) {
    ForwardBatch batch;
    SequenceSlice s;
    s.seq_id = 1;
    s.token_ids.assign(prompt.begin() + start,
                       prompt.begin() + std::min(prompt.size(), start + 7));
    s.start_pos = static_cast<int32_t>(start);
    s.block_table = table1;
    s.all_logits = true;
    batch.seqs.push_back(s);
    both(batch, absl::StrCat("prefill chunk at ", start));
  }
  int32_t tok = 0;
  {
    ForwardBatch batch;
    SequenceSlice a;
    a.seq_id = 2;
    a.token_ids = Prompt(19, 2);
    a.block_table = table2;
    SequenceSlice b;
    b.seq_id = 1;
    b.token_ids = {static_cast<int32_t>((prompt.back() + 1) % V)};
    b.start_pos = static_cast<int32_t>(prompt.size());
    b.block_table = table1;
    batch.seqs = {a, b};
    const ForwardResult r = both(batch, "mixed prefill + decode");
    tok = static_cast<int32_t>(
        std::max_element(r.seqs[1].logits.begin(), r.seqs[1].logits.end()) -
        r.seqs[1].logits.begin());
  }
  int32_t pos = static_cast<int32_t>(prompt.size()) + 1;
  for (int step = 0; step < 8; ++step, ++pos) {
    ForwardBatch batch;
    SequenceSlice s;
    s.seq_id = 1;
    s.start_pos = pos;
    s.block_table = table1;
    s.token_ids = {tok};
    batch.seqs.push_back(s);
    const ForwardResult r = both(batch, absl::StrCat("decode step ", step));
    tok = static_cast<int32_t>(
        std::max_element(r.seqs[0].logits.begin(), r.seqs[0].logits.end()) -
        r.seqs[0].logits.begin());
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, KvFp8ModelTest,
                         ::testing::Values(Param{false, true}, Param{false, false},
                                           Param{true, true}, Param{true, false}));

TEST(KvFp8Model, BytesPerTokenAndParse) {
  ModelConfig c = SmallTestConfig(4, 1, false);
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.index_head_dim = 128;
  EXPECT_EQ(KvBytesPerTokenOfLayer(c, KvDType::kFp8, false), 656);
  EXPECT_EQ(KvBytesPerTokenOfLayer(c, KvDType::kFp8, true), 656 + 132);
  EXPECT_EQ(KvBytesPerTokenOfLayer(c, KvDType::kF32, true), 4 * (576 + 128));
  ModelLoadOptions o;
  o.load_mtp = false;
  o.kv.dtype = KvDType::kFp8;
  EXPECT_EQ(KvCacheBytesPerToken(c, o), 4 * (656 + 132));  // 4 layers, all full indexers
  o.kv.dtype = KvDType::kF32;
  EXPECT_EQ(KvCacheBytesPerToken(c, o), 4 * 4 * (576 + 128));
  KvDType d = KvDType::kF32;
  EXPECT_TRUE(ParseKvDType("fp8", &d).ok());
  EXPECT_EQ(d, KvDType::kFp8);
  const absl::Status bad = ParseKvDType("e5m2", &d);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("fp32, fp8"), std::string::npos) << bad;
  EXPECT_STREQ(KvDTypeName(KvDType::kFp8), "fp8");
}

// PagedKvStorage::FillRandom (benches): every slot of every layer written, finite, no two slots'
// rows equal (chunks of 8192 slots differ by a constant), in both dtypes.
TEST(KvStorage, FillRandomWritesDistinctFiniteRows) {
  const ModelConfig c = SmallTestConfig(2, 1, false);
  auto backend = CreateCpuBackend(1);
  for (const KvDType dtype : {KvDType::kF32, KvDType::kFp8}) {
    SCOPED_TRACE(KvDTypeName(dtype));
    const int block = 64, blocks = 300;  // 19200 slots: three 8192-slot chunks
    auto kv = PagedKvStorage::Create(backend.get(), c, {block, blocks, dtype}, {0, 1});
    ASSERT_TRUE(kv.ok()) << kv.status();
    (*kv)->FillRandom(backend.get(), 5);
    const int64_t slots = (*kv)->num_slots();
    for (int layer : {0, 1}) {
      const LayerKv& lk = (*kv)->layer(layer);
      const int64_t w = c.kv_lora_rank + c.qk_rope_head_dim;
      std::vector<float> lat(static_cast<size_t>(slots * w));
      std::vector<float> keys;
      if (dtype == KvDType::kF32) {
        std::copy_n(lk.latent.data, lat.size(), lat.begin());
        keys.assign(lk.index_keys.data, lk.index_keys.data + slots * c.index_head_dim);
      } else {
        std::vector<int32_t> all(static_cast<size_t>(slots));
        std::iota(all.begin(), all.end(), 0);
        backend->GatherLatentFp8(lk.latent_fp8, all.data(), MatView{lat.data(), slots, w, w});
        keys.resize(static_cast<size_t>(slots * c.index_head_dim));
        for (int64_t i = 0; i < slots; ++i) {
          cpu_kv_fp8::DequantizeIndexKey(lk.index_fp8, i, keys.data() + i * c.index_head_dim);
        }
      }
      for (const std::vector<float>* v : {&lat, &keys}) {
        const int64_t cols = v == &lat ? w : c.index_head_dim;
        ASSERT_TRUE(std::all_of(v->begin(), v->end(), [](float f) { return std::isfinite(f); }));
        // Slot 0 vs slots 8192 and 16384 (the same base row, other chunks) and slot 1.
        for (int64_t other : {int64_t{1}, int64_t{8192}, int64_t{16384}}) {
          EXPECT_FALSE(std::equal(v->begin(), v->begin() + cols, v->begin() + other * cols))
              << "layer " << layer << " slot " << other << " repeats slot 0";
        }
        EXPECT_GT(std::count_if(v->begin(), v->begin() + cols, [](float f) { return f != 0.f; }),
                  cols / 2);
      }
    }
  }
}

TEST(KvFp8Model, UnsupportedWidthsNameTheFix) {
  ModelConfig c = SmallTestConfig(2, 1, false);
  c.kv_lora_rank = 18;  // not a multiple of 4
  InMemoryWeights weights;
  MakeRandomWeights(c, 1, &weights);
  auto backend = CreateCpuBackend(1);
  ModelLoadOptions o;
  o.kv = {4, 8, KvDType::kFp8};
  auto m = CreateGlmMoeDsa(c, weights, backend.get(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--kv-dtype fp32"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace glm::engine
