// The fp8 KV cache layouts and quantization rule (engine/backend/kv_fp8_layout.h) on the CPU
// backend, the reference for the CUDA kernels: byte offsets, power-of-two scales, amax <= 448,
// zero rows, NaN / inf handling, paged indexer layout, and Attention / IndexerTopK over fp8
// caches against the fp32 ops on the dequantized rows.
#include "engine/backend/cpu/cpu_kv_fp8.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/kv_fp8_layout.h"
#include "engine/weights/float_codec.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

bool IsPowerOfTwo(float s) {
  int e = 0;
  return s > 0.0f && std::frexp(s, &e) == 0.5f;
}

TEST(KvFp8Layout, Glm5ByteOffsets) {
  EXPECT_EQ(kv_fp8::LatentRowBytes(512, 64), 656);
  EXPECT_EQ(kv_fp8::LatentNumScales(512), 4);
  EXPECT_EQ(kv_fp8::LatentScaleOffset(512), 512);
  EXPECT_EQ(kv_fp8::LatentRopeOffset(512), 528);
  EXPECT_EQ(kv_fp8::IndexBytesPerToken(128), 132);
  // vLLM page layout, block_size 64: block b = [64 x 128 values][64 x 4-byte scales].
  EXPECT_EQ(kv_fp8::IndexValueOffset(0, 64, 128), 0);
  EXPECT_EQ(kv_fp8::IndexValueOffset(1, 64, 128), 128);
  EXPECT_EQ(kv_fp8::IndexScaleOffset(0, 64, 128), 64 * 128);
  EXPECT_EQ(kv_fp8::IndexScaleOffset(63, 64, 128), 64 * 128 + 63 * 4);
  EXPECT_EQ(kv_fp8::IndexValueOffset(64 + 5, 64, 128), 64 * 132 + 5 * 128);
  EXPECT_EQ(kv_fp8::IndexScaleOffset(64 + 5, 64, 128), 64 * 132 + 64 * 128 + 5 * 4);
  // Tiny fixture widths: 16 + 4 + 16.
  EXPECT_EQ(kv_fp8::LatentRowBytes(16, 8), 36);
  EXPECT_EQ(kv_fp8::LatentNumScales(130), 2);
}

TEST(KvFp8Layout, Ue8m0Scale) {
  EXPECT_EQ(kv_fp8::Ue8m0Scale(0.0f), 1.0f);
  EXPECT_EQ(kv_fp8::Ue8m0Scale(448.0f), 1.0f);
  EXPECT_EQ(kv_fp8::Ue8m0Scale(std::nextafter(448.0f, 1e9f)), 2.0f);
  EXPECT_EQ(kv_fp8::Ue8m0Scale(224.0f), 0.5f);
  EXPECT_EQ(kv_fp8::Ue8m0Scale(std::nextafter(224.0f, 1e9f)), 1.0f);
  EXPECT_EQ(kv_fp8::Ue8m0Scale(1.0f), std::ldexp(1.0f, -8));  // 448 / 512 < 1 <= 448 / 256
  EXPECT_EQ(kv_fp8::Ue8m0Scale(1e-40f), std::ldexp(1.0f, -126));  // clamped to a normal float
  EXPECT_EQ(kv_fp8::Ue8m0Scale(3e38f), std::ldexp(1.0f, 120));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> expo(-40.0f, 40.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(expo(rng));
    const float s = kv_fp8::Ue8m0Scale(amax);
    ASSERT_TRUE(IsPowerOfTwo(s)) << amax;
    EXPECT_LE(amax / s, 448.0f) << amax;  // amax maps to <= 448
    EXPECT_GT(amax / (s * 0.5f), 448.0f) << amax;  // and s is the smallest such power
  }
}

TEST(KvFp8Latent, RoundTripScalesAndError) {
  const int kvr = 512, rope = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(kvr + rope), back(kvr + rope);
  std::vector<uint8_t> row(kv_fp8::LatentRowBytes(kvr, rope));
  for (int trial = 0; trial < 50; ++trial) {
    const float mag = std::exp2(static_cast<float>(trial % 20) - 10.0f);
    for (float& v : x) v = nd(rng) * mag;
    cpu_kv_fp8::QuantizeLatentRow(x.data(), kvr, rope, row.data());
    cpu_kv_fp8::DequantizeLatentRow(row.data(), kvr, rope, back.data());
    for (int g = 0; g < 4; ++g) {
      float scale;
      std::memcpy(&scale, row.data() + 512 + 4 * g, 4);
      ASSERT_TRUE(IsPowerOfTwo(scale));
      float amax = 0;
      for (int d = 128 * g; d < 128 * g + 128; ++d) amax = std::max(amax, std::fabs(x[d]));
      EXPECT_EQ(scale, kv_fp8::Ue8m0Scale(amax));
      for (int d = 128 * g; d < 128 * g + 128; ++d) {
        EXPECT_EQ(row[d], FloatToFp8E4M3(x[d] / scale));
        // e4m3: 3 mantissa bits (half-ulp 2^-4 relative), subnormal step 2^-9.
        EXPECT_LE(std::fabs(back[d] - x[d]),
                  std::max(std::fabs(x[d]) * 0.0625f, scale * std::ldexp(1.0f, -10)))
            << d;
        EXPECT_LE(std::fabs(back[d]), 448.0f * scale);
      }
    }
    for (int d = 0; d < rope; ++d) {
      uint16_t b;
      std::memcpy(&b, row.data() + 528 + 2 * d, 2);
      EXPECT_EQ(b, FloatToBf16(x[kvr + d]));
      EXPECT_EQ(back[kvr + d], Bf16ToFloat(b));
    }
  }
}

TEST(KvFp8Latent, ZeroRowAndNonFinite) {
  const int kvr = 256, rope = 8;
  std::vector<float> x(kvr + rope, 0.0f), back(kvr + rope);
  std::vector<uint8_t> row(kv_fp8::LatentRowBytes(kvr, rope), 0xAB);
  cpu_kv_fp8::QuantizeLatentRow(x.data(), kvr, rope, row.data());
  for (int d = 0; d < kvr; ++d) EXPECT_EQ(row[d], 0) << d;
  for (int g = 0; g < 2; ++g) {
    float s;
    std::memcpy(&s, row.data() + kvr + 4 * g, 4);
    EXPECT_EQ(s, 1.0f);  // a zero block gets scale 1
  }
  cpu_kv_fp8::DequantizeLatentRow(row.data(), kvr, rope, back.data());
  for (float v : back) EXPECT_EQ(v, 0.0f);

  // Group 0: a NaN and +inf among finite values; amax ignores both.
  for (int d = 0; d < 128; ++d) x[d] = 0.01f * static_cast<float>(d - 64);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = -std::numeric_limits<float>::infinity();
  // Group 1: all NaN -> scale 1, NaN bytes.
  for (int d = 128; d < 256; ++d) x[d] = std::numeric_limits<float>::quiet_NaN();
  cpu_kv_fp8::QuantizeLatentRow(x.data(), kvr, rope, row.data());
  float s0, s1;
  std::memcpy(&s0, row.data() + kvr, 4);
  std::memcpy(&s1, row.data() + kvr + 4, 4);
  EXPECT_EQ(s0, kv_fp8::Ue8m0Scale(0.64f));
  EXPECT_EQ(s1, 1.0f);
  EXPECT_EQ(row[3], 0x7F);  // NaN stays NaN
  EXPECT_EQ(row[5], 0x7E);  // +inf saturates to +448
  EXPECT_EQ(row[6], 0xFE);  // -inf saturates to -448
  EXPECT_EQ(row[130], 0x7F);
  cpu_kv_fp8::DequantizeLatentRow(row.data(), kvr, rope, back.data());
  EXPECT_TRUE(std::isnan(back[3]));
  EXPECT_EQ(back[5], 448.0f * s0);
}

TEST(KvFp8Index, PagedLayoutAcrossBlocks) {
  const int dim = 128, bs = 16, blocks = 4;
  std::vector<uint8_t> cache(static_cast<size_t>(bs) * blocks * (dim + 4), 0);
  Fp8IndexCache c{cache.data(), bs * blocks, dim, bs};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const std::vector<int32_t> slots = {0, 17, 15, 63, 40};
  std::vector<float> keys(slots.size() * dim);
  for (float& v : keys) v = nd(rng);
  cpu_kv_fp8::WriteIndexKeys(MatView{keys.data(), static_cast<int64_t>(slots.size()), dim, dim},
                             slots.data(), c);
  std::vector<uint8_t> expect(cache.size(), 0);
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    const int64_t b = s / bs, o = s % bs;
    uint8_t* v = expect.data() + b * bs * 132 + o * dim;
    float scale;
    cpu_kv_fp8::QuantizeIndexKey(keys.data() + i * dim, dim, v, &scale);
    ASSERT_TRUE(IsPowerOfTwo(scale));
    std::memcpy(expect.data() + b * bs * 132 + bs * dim + 4 * o, &scale, 4);
    std::vector<float> back(dim);
    cpu_kv_fp8::DequantizeIndexKey(c, s, back.data());
    for (int d = 0; d < dim; ++d) {
      EXPECT_EQ(back[d], Fp8E4M3ToFloat(v[d]) * scale);
      EXPECT_LE(std::fabs(back[d] - keys[i * dim + d]),
                std::max(std::fabs(keys[i * dim + d]) * 0.0625f, scale * std::ldexp(1.0f, -10)));
    }
  }
  EXPECT_EQ(cache, expect);  // bit-exact, untouched bytes stay zero
}

// A small absorbed-MLA problem on the CPU backend: fp8 cache vs the fp32 op on the dequantized
// rows (equal), and vs the fp32 op on the original rows (close).
TEST(KvFp8Ops, AttentionIndexerGatherMatchDequantizedFp32) {
  auto backend = CreateCpuBackend(2);
  const int kvr = 64, rope = 16, heads = 4, slots_n = 48, rows = 3, dim = 32, iheads = 4;
  const int bs = 16, topk = 10;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> lat(slots_n * (kvr + rope));
  for (float& v : lat) v = nd(rng);
  std::vector<int32_t> all_slots(slots_n);
  for (int i = 0; i < slots_n; ++i) all_slots[i] = (i * 7) % slots_n;  // a permutation
  std::vector<uint8_t> cache(slots_n * kv_fp8::LatentRowBytes(kvr, rope));
  Fp8LatentCache lc{cache.data(), slots_n, kvr, rope};
  backend->WriteLatentFp8(MatView{lat.data(), slots_n, kvr + rope, kvr + rope}, all_slots.data(),
                          lc);
  // Dequantized fp32 cache in slot order.
  std::vector<float> deq(slots_n * (kvr + rope));
  std::vector<int32_t> ident(slots_n);
  for (int i = 0; i < slots_n; ++i) ident[i] = i;
  backend->GatherLatentFp8(lc, ident.data(), MatView{deq.data(), slots_n, kvr + rope, kvr + rope});
  std::vector<float> lat_by_slot(lat.size());
  for (int i = 0; i < slots_n; ++i) {
    std::copy_n(lat.data() + i * (kvr + rope), kvr + rope,
                lat_by_slot.data() + all_slots[i] * (kvr + rope));
  }
  for (size_t i = 0; i < deq.size(); ++i) {
    ASSERT_LE(std::fabs(deq[i] - lat_by_slot[i]), std::fabs(lat_by_slot[i]) * 0.0625f + 1e-2f);
  }

  // Key table: row t sees positions [0, n_t) mapped to slots through a shuffled table.
  std::vector<int32_t> table(slots_n), offsets = {0, 0, 0}, nkeys = {48, 20, 5};
  for (int i = 0; i < slots_n; ++i) table[i] = (i * 5 + 3) % slots_n;
  std::vector<int32_t> indices(rows * topk, -1);
  for (int t = 0; t < rows; ++t) {
    for (int i = 0; i < topk; ++i) indices[t * topk + i] = (i * 3 + t) % (nkeys[t] + 2) - 1;
  }
  std::vector<float> qa(rows * heads * kvr), qb(rows * heads * rope);
  for (float& v : qa) v = nd(rng) * 0.2f;
  for (float& v : qb) v = nd(rng) * 0.2f;
  for (const bool with_indices : {true, false}) {
    std::vector<float> out8(rows * heads * kvr), out_deq(out8.size()), out32(out8.size());
    AttentionArgs a;
    a.q_a = HeadsView{qa.data(), rows, heads, kvr, heads * kvr, kvr};
    a.q_b = HeadsView{qb.data(), rows, heads, rope, heads * rope, rope};
    a.table = {table.data(), offsets.data(), nkeys.data(), 48};
    a.indices = with_indices ? indices.data() : nullptr;
    a.index_width = topk;
    a.scale = 0.1f;
    a.k_a = HeadsView{nullptr, slots_n, heads, kvr, 0, 0};
    a.k_b = HeadsView{nullptr, slots_n, heads, rope, 0, 0};
    a.v = a.k_a;
    a.latent_fp8 = lc;
    a.out = HeadsView{out8.data(), rows, heads, kvr, heads * kvr, kvr};
    backend->Attention(a);
    AttentionArgs f = a;
    f.latent_fp8 = {};
    f.k_a = HeadsView{deq.data(), slots_n, heads, kvr, kvr + rope, 0};
    f.k_b = HeadsView{deq.data() + kvr, slots_n, heads, rope, kvr + rope, 0};
    f.v = f.k_a;
    f.out.data = out_deq.data();
    backend->Attention(f);
    f.k_a.data = lat_by_slot.data();
    f.k_b.data = lat_by_slot.data() + kvr;
    f.v = f.k_a;
    f.out.data = out32.data();
    backend->Attention(f);
    for (size_t i = 0; i < out8.size(); ++i) {
      ASSERT_EQ(out8[i], out_deq[i]) << i;
      EXPECT_NEAR(out8[i], out32[i], 0.05f) << i;
    }
  }

  // Indexer: fp8 keys vs fp32 keys equal to the dequantized values (same top-k).
  std::vector<uint8_t> icache(slots_n * (dim + 4));
  Fp8IndexCache ic{icache.data(), slots_n, dim, bs};
  std::vector<float> keys(slots_n * dim);
  for (float& v : keys) v = nd(rng);
  backend->WriteIndexKeysFp8(MatView{keys.data(), slots_n, dim, dim}, ident.data(), ic);
  std::vector<float> kdeq(keys.size());
  for (int s = 0; s < slots_n; ++s) cpu_kv_fp8::DequantizeIndexKey(ic, s, kdeq.data() + s * dim);
  std::vector<float> iq(rows * iheads * dim), w(rows * iheads);
  for (float& v : iq) v = nd(rng);
  for (float& v : w) v = nd(rng);
  std::vector<int32_t> out8(rows * topk), out32(rows * topk);
  IndexerTopKArgs ia;
  ia.q = HeadsView{iq.data(), rows, iheads, dim, iheads * dim, dim};
  ia.weights = MatView{w.data(), rows, iheads, iheads};
  ia.keys = MatView{nullptr, slots_n, dim, dim};
  ia.keys_fp8 = ic;
  ia.table = {table.data(), offsets.data(), nkeys.data(), 48};
  ia.weight_scale = 0.5f;
  ia.score_scale = 0.2f;
  ia.top_k = topk;
  ia.out = out8.data();
  backend->IndexerTopK(ia);
  IndexerTopKArgs ib = ia;
  ib.keys_fp8 = {};
  ib.keys = MatView{kdeq.data(), slots_n, dim, dim};
  ib.out = out32.data();
  backend->IndexerTopK(ib);
  EXPECT_EQ(out8, out32);
  for (int i = 0; i < topk; ++i) EXPECT_EQ(out8[2 * topk + i], i < 5 ? i : -1);  // short row
}

}  // namespace
}  // namespace glm::engine
