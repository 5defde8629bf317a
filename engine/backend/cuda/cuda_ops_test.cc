// Tests of the heavy CUDA ops (cuda_ops.h) against the CPU backend on random data: a sweep over
// shapes (one row, sizes that are not multiples of the tiles, broadcast and per-head keys, -1
// padded indices, num_keys <= top_k, exact ties, empty experts, top_k 1 and 8, 256 experts), with
// guard bytes around every output, poisoned outputs and NaN/Inf checks. Skips without a GPU.
// Cases named *Large* are the GLM-5-sized ones (left out under compute-sanitizer).
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_indexer.h"
#include "engine/backend/cuda/cuda_ops_hooks.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "kernels/device_limits.h"
#include "kernels/gpu_test_util.h"
#include "kernels/kernel_policy.h"

namespace glm::engine::cuda {

namespace {

using kernels::testing::GuardedBuffer;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_SKIP_WITHOUT_GPU();
    cpu_ = CreateCpuBackend(0);
  }

  template <typename T>
  std::unique_ptr<GuardedBuffer> Upload(const std::vector<T>& v) {
    auto b = std::make_unique<GuardedBuffer>(std::max<size_t>(v.size(), 1) * sizeof(T));
    EXPECT_TRUE(b->ok());
    if (!v.empty()) {
      EXPECT_EQ(b->Upload(v.data(), v.size() * sizeof(T)), cudaSuccess);
    }
    return b;
  }
  template <typename T>
  std::vector<T> Download(const GuardedBuffer& b, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(b.Download(v.data(), n * sizeof(T)), cudaSuccess);
    return v;
  }

  std::unique_ptr<Backend> cpu_;
  TestScratch scratch_;
  std::mt19937 rng_{1234};
};

// Uniform in [lo, hi); an LCG seeded from `rng`, fast enough for the GLM-5-sized expert weights.
std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  uint32_t x = static_cast<uint32_t>(rng());
  std::vector<float> v(n);
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = lo + (hi - lo) * static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
  }
  return v;
}

// A key table: row t owns slots [row_offset[t], + num_keys[t]) pointing at random key rows.
struct HostTable {
  std::vector<int32_t> slots, row_offset, row_num_keys;
  int32_t max_num_keys = 0;
};

HostTable MakeTable(std::mt19937& rng, const std::vector<int>& num_keys, int num_key_rows) {
  HostTable t;
  std::uniform_int_distribution<int> row(0, num_key_rows - 1);
  for (int n : num_keys) {
    t.row_offset.push_back(static_cast<int32_t>(t.slots.size()));
    t.row_num_keys.push_back(n);
    t.max_num_keys = std::max(t.max_num_keys, n);
    for (int i = 0; i < n; ++i) t.slots.push_back(row(rng));
  }
  return t;
}

struct DeviceTable {
  std::unique_ptr<GuardedBuffer> slots, row_offset, row_num_keys;
  KeyTable View(int32_t max_num_keys) const {
    return {slots->as<int32_t>(), row_offset->as<int32_t>(), row_num_keys->as<int32_t>(),
            max_num_keys};
  }
};

bool AllFinite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// ---- Attention -------------------------------------------------------------------------------

struct AttnCase {
  std::string name;
  int rows, heads, da, db, dv;
  bool absorbed;            // k_a = v = latent (broadcast), k_b broadcast; else per-head k_a, v
  std::vector<int> num_keys;  // per row
  int index_width;          // 0: no indices (all p < num_keys)
  int num_key_rows;
};

std::vector<int> Keys(int rows, int first, int step) {
  std::vector<int> v(rows);
  for (int t = 0; t < rows; ++t) v[t] = std::max(0, first + step * t);
  return v;
}

class AttentionTest : public CudaOpsTest, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(AttentionTest, MatchesCpu) {
  const AttnCase& c = GetParam();
  if (c.absorbed) {
    ASSERT_EQ(c.dv, c.da);
  }
  const int rows = c.rows, heads = c.heads;
  const int dq = c.da + c.db;
  std::vector<float> q = RandomFloats(rng_, size_t(rows) * heads * dq);
  // absorbed: latent [keys, da + db]; expanded: kv [keys, heads, da + dv] and k_pe [keys, db].
  const int64_t kv_row = c.absorbed ? dq : int64_t{heads} * (c.da + c.dv);
  std::vector<float> kv = RandomFloats(rng_, size_t(c.num_key_rows) * kv_row);
  std::vector<float> kpe = c.absorbed ? std::vector<float>{}
                                      : RandomFloats(rng_, size_t(c.num_key_rows) * c.db);
  HostTable table = MakeTable(rng_, c.num_keys, c.num_key_rows);
  std::vector<int32_t> indices;
  if (c.index_width > 0) {
    for (int t = 0; t < rows; ++t) {
      const int n = table.row_num_keys[t];
      std::vector<int32_t> perm(n);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      for (int i = 0; i < c.index_width; ++i) {
        int32_t v = i < n ? perm[i] : -1;
        if (i % 17 == 5) v = -1;                  // padding in the middle
        if (i % 29 == 11 && v >= 0) v = n + 3;  // past num_keys: skipped
        indices.push_back(v);
      }
    }
  }

  auto make_args = [&](float* qp, float* kvp, float* kpep, float* outp, KeyTable kt,
                       const int32_t* idx) {
    AttentionArgs a;
    const HeadsView qv{qp, rows, heads, dq, int64_t{heads} * dq, dq};
    a.q_a = qv.Dims(0, c.da);
    a.q_b = qv.Dims(c.da, c.db);
    if (c.absorbed) {
      const HeadsView lat{kvp, c.num_key_rows, heads, dq, dq, 0};
      a.k_a = lat.Dims(0, c.da);
      a.k_b = lat.Dims(c.da, c.db);
      a.v = lat.Dims(0, c.da);
    } else {
      const HeadsView kvv{kvp, c.num_key_rows, heads, c.da + c.dv, kv_row, c.da + c.dv};
      a.k_a = kvv.Dims(0, c.da);
      a.v = kvv.Dims(c.da, c.dv);
      a.k_b = HeadsView{kpep, c.num_key_rows, heads, c.db, c.db, 0};
    }
    a.table = kt;
    a.indices = idx;
    a.index_width = c.index_width;
    a.scale = 1.0f / std::sqrt(static_cast<float>(dq));
    a.out = HeadsView{outp, rows, heads, c.dv, int64_t{heads} * c.dv, c.dv};
    return a;
  };

  const size_t out_n = size_t(rows) * heads * c.dv;
  std::vector<float> want(out_n, -7.f);
  KeyTable host_kt{table.slots.data(), table.row_offset.data(), table.row_num_keys.data(),
                   table.max_num_keys};
  cpu_->Attention(make_args(q.data(), kv.data(), kpe.data(), want.data(), host_kt,
                            indices.empty() ? nullptr : indices.data()));

  auto dq_buf = Upload(q), dkv = Upload(kv), dkpe = Upload(kpe), didx = Upload(indices);
  DeviceTable dt{Upload(table.slots), Upload(table.row_offset), Upload(table.row_num_keys)};
  // Runs 0, 1: the staged kernel wherever it applies (twice: bitwise the same, fixed reduction
  // order); run 2: the split kernel; run 3: the default choice by shape; run 4: the choice by
  // shape planned for GB10's 99 KiB of shared memory per block (KernelPolicy::smem_cap_bytes).
  const char* const kRunNames[] = {"staged", "staged", "split", "default", "default gb10"};
  std::vector<float> first;
  for (const int run : {0, 1, 2, 3, 4}) {
    kernels::KernelPolicy policy;
    policy.attention.path = run <= 1   ? kernels::MlaAttentionPath::kStaged
                            : run == 2 ? kernels::MlaAttentionPath::kSplit
                                       : kernels::MlaAttentionPath::kByShape;
    if (run == 4) policy.smem_cap_bytes = kernels::Gb10Limits().smem_optin_per_block;
    GuardedBuffer dout(out_n * sizeof(float));
    ASSERT_EQ(dout.Poison(0xFF), cudaSuccess);
    const absl::Status st = Attention(
        make_args(dq_buf->as<float>(), dkv->as<float>(), dkpe->as<float>(), dout.as<float>(),
                  dt.View(table.max_num_keys),
                  indices.empty() ? nullptr : didx->as<int32_t>()),
        policy, scratch_, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<float> got = Download<float>(dout, out_n);
    EXPECT_TRUE(dout.GuardsIntact());
    EXPECT_TRUE(AllFinite(got)) << "NaN/Inf (or unwritten) outputs, run " << run;
    double max_diff = 0;
    size_t bad = 0;
    for (size_t i = 0; i < out_n; ++i) {
      const double d = std::fabs(double(got[i]) - want[i]);
      max_diff = std::max(max_diff, d);
      if (!(d <= 2e-5 + 1e-4 * std::fabs(want[i]))) ++bad;
    }
    EXPECT_EQ(bad, 0u) << "max diff " << max_diff << ", run " << run;
    if (run == 0) first = got;
    if (run == 1) {
      EXPECT_EQ(std::memcmp(first.data(), got.data(), out_n * sizeof(float)), 0)
          << "staged path not deterministic";
    }
    std::printf("[attention %s %s] max |gpu - cpu| = %.3g over %zu outputs\n", c.name.c_str(),
                kRunNames[run], max_diff, out_n);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, AttentionTest,
    ::testing::Values(
        // GLM-5 absorbed decode: 64 heads share the latent (G = 16), 2048 selected, splits.
        AttnCase{"Large_absorbed_decode", 1, 64, 512, 64, 512, true, {3000}, 2048, 4096},
        // Split sizing of the staged path: 1 / 2 / 8 rows x 4K keys (2048 selected), fewer keys
        // than the index width, and a long causal row without indices (more splits than 64).
        AttnCase{"Large_absorbed_1x4k", 1, 64, 512, 64, 512, true, {4096}, 2048, 4096},
        AttnCase{"Large_absorbed_2x4k", 2, 64, 512, 64, 512, true, {4096, 4000}, 2048, 4096},
        AttnCase{"Large_absorbed_8x4k", 8, 64, 512, 64, 512, true, Keys(8, 4096, -7), 2048,
                 4096},
        AttnCase{"absorbed_keys_below_width", 2, 64, 512, 64, 512, true, {700, 33}, 2048, 800},
        AttnCase{"absorbed_1row_causal_long", 1, 16, 64, 16, 64, true, {9000}, 0, 9100},
        AttnCase{"absorbed_3rows_dv96", 3, 32, 96, 12, 96, true, {40, 200, 1}, 0, 300},
        AttnCase{"Large_expanded_prefill", 6, 64, 192, 64, 256, false, Keys(6, 300, 57), 0, 700},
        AttnCase{"absorbed_20heads_idx", 3, 20, 32, 8, 32, true, {50, 0, 130}, 100, 200},
        AttnCase{"absorbed_4heads_causal", 5, 4, 16, 8, 16, true, Keys(5, 0, 40), 0, 300},
        AttnCase{"expanded_1row_idx", 1, 4, 192, 64, 256, false, {700}, 512, 900},
        AttnCase{"expanded_small_causal", 7, 3, 16, 8, 20, false, Keys(7, 1, 23), 0, 200},
        AttnCase{"expanded_long_splits", 2, 2, 32, 16, 64, false, {3001, 4099}, 0, 5000},
        AttnCase{"absorbed_no_keys", 2, 16, 64, 8, 64, true, {0, 0}, 0, 10},
        AttnCase{"absorbed_all_padding", 2, 32, 64, 8, 64, true, {100, 3}, 8, 150}),
    [](const ::testing::TestParamInfo<AttnCase>& p) { return p.param.name; });

TEST_F(CudaOpsTest, AttentionRejectsUnalignedDims) {
  AttentionArgs a;
  std::vector<float> dummy(64);
  auto buf = Upload(dummy);
  a.q_a = HeadsView{buf->as<float>(), 1, 1, 6, 6, 6};
  a.k_a = HeadsView{buf->as<float>(), 1, 1, 6, 6, 0};
  a.q_b = a.k_b = HeadsView{buf->as<float>(), 1, 1, 0, 6, 0};
  a.v = a.out = HeadsView{buf->as<float>(), 1, 1, 4, 4, 4};
  const absl::Status st = Attention(a, kernels::KernelPolicy(), scratch_, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

// ---- IndexerTopK -----------------------------------------------------------------------------

struct IndexerCase {
  std::string name;
  int heads, dim, top_k;
  std::vector<int> num_keys;
  int num_key_rows;
  float zero_key_fraction;  // keys that are all zeros: score exactly 0 (ties)
  bool mixed_sign_weights;
};

class IndexerTest : public CudaOpsTest, public ::testing::WithParamInterface<IndexerCase> {};

TEST_P(IndexerTest, MatchesCpu) {
  const IndexerCase& c = GetParam();
  const int rows = static_cast<int>(c.num_keys.size());
  std::vector<float> q = RandomFloats(rng_, size_t(rows) * c.heads * c.dim);
  std::vector<float> w = RandomFloats(rng_, size_t(rows) * c.heads, c.mixed_sign_weights ? -1.f : 0.f,
                                      1.f);
  std::vector<float> keys = RandomFloats(rng_, size_t(c.num_key_rows) * c.dim);
  std::bernoulli_distribution zero(c.zero_key_fraction);
  for (int r = 0; r < c.num_key_rows; ++r) {
    if (zero(rng_)) std::fill_n(keys.begin() + size_t(r) * c.dim, c.dim, 0.f);
  }
  // Slots repeat key rows (num_key_rows < keys per row in some cases): exact duplicate scores.
  HostTable table = MakeTable(rng_, c.num_keys, c.num_key_rows);
  const float weight_scale = 1.0f / std::sqrt(float(c.heads));
  const float score_scale = 1.0f / std::sqrt(float(c.dim));

  auto make_args = [&](float* qp, float* wp, float* kp, KeyTable kt, int32_t* out) {
    IndexerTopKArgs a;
    a.q = HeadsView{qp, rows, c.heads, c.dim, int64_t{c.heads} * c.dim, c.dim};
    a.weights = MatView{wp, rows, c.heads, c.heads};
    a.keys = MatView{kp, c.num_key_rows, c.dim, c.dim};
    a.table = kt;
    a.weight_scale = weight_scale;
    a.score_scale = score_scale;
    a.top_k = c.top_k;
    a.out = out;
    return a;
  };
  const size_t out_n = size_t(rows) * c.top_k;
  std::vector<int32_t> want(out_n, -9);
  KeyTable host_kt{table.slots.data(), table.row_offset.data(), table.row_num_keys.data(),
                   table.max_num_keys};
  cpu_->IndexerTopK(make_args(q.data(), w.data(), keys.data(), host_kt, want.data()));

  auto dqb = Upload(q), dw = Upload(w), dk = Upload(keys);
  DeviceTable dt{Upload(table.slots), Upload(table.row_offset), Upload(table.row_num_keys)};
  // The single-CTA radix passes first, then the multi-CTA passes, the short-row select (row in
  // shared memory) wherever it fits, then the choice by shape: all exact, so bitwise the same.
  using Select = kernels::IndexerPolicy::Select;
  std::vector<int32_t> got;
  for (const Select select :
       {Select::kSingleCta, Select::kMultiCta, Select::kShortRow, Select::kByShape}) {
    kernels::KernelPolicy policy;
    policy.indexer.select = select;
    GuardedBuffer dout(out_n * sizeof(int32_t));
    ASSERT_EQ(dout.Poison(0x7B), cudaSuccess);
    const absl::Status st =
        IndexerTopK(make_args(dqb->as<float>(), dw->as<float>(), dk->as<float>(),
                              dt.View(table.max_num_keys), dout.as<int32_t>()),
                    policy, scratch_, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<int32_t> run = Download<int32_t>(dout, out_n);
    EXPECT_TRUE(dout.GuardsIntact());
    if (select != Select::kSingleCta) {
      EXPECT_TRUE(run == got) << "select path " << static_cast<int>(select)
                              << " differs from the single-CTA radix passes";
    }
    got = run;
  }

  // Exact equality with the CPU (same set, same ascending order), except that a pair of
  // positions whose scores differ by fp32 summation-order noise may swap at the threshold.
  int exact_rows = 0, near_tie_rows = 0;
  for (int t = 0; t < rows; ++t) {
    std::vector<int32_t> g(got.begin() + size_t(t) * c.top_k, got.begin() + size_t(t + 1) * c.top_k);
    std::vector<int32_t> e(want.begin() + size_t(t) * c.top_k,
                           want.begin() + size_t(t + 1) * c.top_k);
    const int n = table.row_num_keys[t];
    const int sel = std::min(n, c.top_k);
    for (int i = 0; i < c.top_k; ++i) {
      if (i < sel) {
        ASSERT_TRUE(g[i] >= 0 && g[i] < n) << "row " << t << " slot " << i << " = " << g[i];
        if (i > 0) {
          ASSERT_LT(g[i - 1], g[i]) << "row " << t << " not ascending at " << i;
        }
      } else {
        ASSERT_EQ(g[i], -1) << "row " << t << " slot " << i << " not -1 padded";
      }
    }
    if (g == e) {
      ++exact_rows;
      continue;
    }
    // Reference scores in double.
    std::vector<double> score(n);
    for (int s = 0; s < n; ++s) {
      const float* k = keys.data() + size_t(table.slots[table.row_offset[t] + s]) * c.dim;
      double acc = 0;
      for (int h = 0; h < c.heads; ++h) {
        double d = 0;
        for (int i = 0; i < c.dim; ++i) d += double(q[(size_t(t) * c.heads + h) * c.dim + i]) * k[i];
        acc += std::max(d * score_scale, 0.0) * w[size_t(t) * c.heads + h] * weight_scale;
      }
      score[s] = acc;
    }
    std::vector<double> sorted = score;
    std::nth_element(sorted.begin(), sorted.begin() + (c.top_k - 1), sorted.end(),
                     std::greater<double>());
    const double kth = sorted[c.top_k - 1];
    std::vector<int32_t> diff;
    std::set_symmetric_difference(g.begin(), g.begin() + sel, e.begin(), e.begin() + sel,
                                  std::back_inserter(diff));
    for (int32_t s : diff) {
      EXPECT_LE(std::fabs(score[s] - kth), 1e-5 * (1 + std::fabs(kth)))
          << "row " << t << ": position " << s << " (score " << score[s]
          << ") differs from the CPU's set but is not a near-tie of the threshold " << kth;
    }
    ++near_tie_rows;
  }
  std::printf("[indexer %s] rows equal to cpu: %d/%d, near-tie swaps in %d rows\n",
              c.name.c_str(), exact_rows, rows, near_tie_rows);
  EXPECT_GE(exact_rows, rows - std::max(1, rows / 10));
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, IndexerTest,
    ::testing::Values(
        IndexerCase{"Large_glm5_decode", 32, 128, 2048, {70001}, 80000, 0.0f, false},
        // Multi-CTA radix pass sizing: 1 row x 4K / 128K, 2 and 8 rows, keys below top_k,
        // many exact ties (duplicated key rows and zero scores: every pass runs).
        IndexerCase{"Large_1x128k", 32, 128, 2048, {131072}, 140000, 0.0f, true},
        IndexerCase{"glm5_1x4k", 32, 128, 2048, {4096}, 5000, 0.0f, true},
        IndexerCase{"glm5_2x4k_ties", 32, 128, 2048, {4096, 4000}, 600, 0.3f, true},
        IndexerCase{"glm5_8rows_mixed", 32, 128, 2048, {4096, 2048, 100, 2049, 9000, 4097, 0,
                                                        3000},
                    7000, 0.05f, true},
        IndexerCase{"all_ties_1x5k", 8, 32, 2048, {5000}, 1, 0.0f, false},
        IndexerCase{"Large_glm5_prefill_ties", 32, 128, 2048, Keys(4, 1500, 1500), 3000, 0.5f,
                    false},
        IndexerCase{"glm5_rows_mixed", 32, 128, 64, {0, 10, 64, 65, 1000, 513, 4097}, 5000,
                    0.05f, true},
        IndexerCase{"all_zero_scores", 32, 128, 16, {100, 17, 16}, 50, 1.0f, false},
        IndexerCase{"many_zero_ties", 8, 64, 100, {1000, 300}, 1200, 0.9f, false},
        IndexerCase{"duplicate_keys", 4, 32, 50, {400, 399}, 37, 0.0f, true},
        IndexerCase{"tiny_config", 2, 16, 4, Keys(9, 0, 1), 20, 0.2f, false},
        IndexerCase{"heads40_dim20", 40, 20, 33, {1, 34, 333, 2000}, 2500, 0.1f, true},
        IndexerCase{"one_row_topk1", 32, 128, 1, {777}, 777, 0.0f, true}),
    [](const ::testing::TestParamInfo<IndexerCase>& p) { return p.param.name; });

// ---- MoeExperts ------------------------------------------------------------------------------

struct MoeCase {
  std::string name;
  int tokens, hidden, inter, num_experts, top_k;
  int used_experts;  // ids drawn from [0, used_experts): the rest stay empty
  bool hot_expert;   // expert 0 in every token (several row tiles for one expert)
};

class MoeTest : public CudaOpsTest, public ::testing::WithParamInterface<MoeCase> {};

TEST_P(MoeTest, MatchesCpu) {
  const MoeCase& c = GetParam();
  const size_t mat = size_t(c.hidden) * c.inter;
  const float ws = 1.0f / std::sqrt(float(c.hidden));
  std::vector<float> gate = RandomFloats(rng_, mat * c.num_experts, -ws, ws);
  std::vector<float> up = RandomFloats(rng_, mat * c.num_experts, -ws, ws);
  std::vector<float> down = RandomFloats(rng_, mat * c.num_experts, -ws, ws);
  std::vector<float> x = RandomFloats(rng_, size_t(c.tokens) * c.hidden);
  std::vector<float> out0 = RandomFloats(rng_, size_t(c.tokens) * c.hidden);
  std::vector<int32_t> ids;
  std::vector<float> weights = RandomFloats(rng_, size_t(c.tokens) * c.top_k, 0.f, 1.f);
  for (int t = 0; t < c.tokens; ++t) {
    std::vector<int32_t> perm(c.used_experts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    if (c.hot_expert) std::swap(*std::find(perm.begin(), perm.end(), 0), perm[0]);
    ids.insert(ids.end(), perm.begin(), perm.begin() + c.top_k);
  }

  auto views = [&](float* g, float* u, float* d, std::vector<MatView>* gv,
                   std::vector<MatView>* uv, std::vector<MatView>* dv) {
    for (int e = 0; e < c.num_experts; ++e) {
      gv->push_back({g + e * mat, c.inter, c.hidden, c.hidden});
      uv->push_back({u + e * mat, c.inter, c.hidden, c.hidden});
      dv->push_back({d + e * mat, c.hidden, c.inter, c.inter});
    }
    return ExpertWeights{gv->data(), uv->data(), dv->data(), c.num_experts};
  };
  std::vector<MatView> hg, hu, hd;
  std::vector<float> want = out0;
  cpu_->MoeExperts(MatView{x.data(), c.tokens, c.hidden, c.hidden}, ids.data(), weights.data(),
                   c.top_k, views(gate.data(), up.data(), down.data(), &hg, &hu, &hd),
                   MatView{want.data(), c.tokens, c.hidden, c.hidden});

  auto dg = Upload(gate), du = Upload(up), dd = Upload(down), dx = Upload(x), dids = Upload(ids),
       dw = Upload(weights), dout = Upload(out0);
  std::vector<MatView> gg, gu, gd;
  const ExpertWeights ew = views(dg->as<float>(), du->as<float>(), dd->as<float>(), &gg, &gu, &gd);
  const absl::Status st =
      MoeExperts(MatView{dx->as<float>(), c.tokens, c.hidden, c.hidden}, dids->as<int32_t>(),
                 dw->as<float>(), c.top_k, ew,
                 MatView{dout->as<float>(), c.tokens, c.hidden, c.hidden}, scratch_, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  GLM_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = Download<float>(*dout, want.size());
  EXPECT_TRUE(dout->GuardsIntact());
  EXPECT_TRUE(AllFinite(got));
  double max_diff = 0;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    max_diff = std::max(max_diff, d);
    if (!(d <= 1e-5 + 1e-4 * std::fabs(want[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0u) << "max diff " << max_diff;
  std::printf("[moe %s] max |gpu - cpu| = %.3g over %zu outputs\n", c.name.c_str(), max_diff,
              want.size());

  // A second call on the same weights (cached expert table) accumulates again, deterministically.
  const std::vector<float> first = got;
  ASSERT_TRUE(MoeExperts(MatView{dx->as<float>(), c.tokens, c.hidden, c.hidden},
                         dids->as<int32_t>(), dw->as<float>(), c.top_k, ew,
                         MatView{dout->as<float>(), c.tokens, c.hidden, c.hidden}, scratch_,
                         nullptr)
                  .ok());
  GLM_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> second = Download<float>(*dout, want.size());
  ASSERT_EQ(dout->Upload(out0.data(), out0.size() * 4), cudaSuccess);
  for (size_t i = 0; i < second.size(); i += 97) {
    ASSERT_NEAR(second[i] - first[i], first[i] - out0[i], 1e-4 + 1e-4 * std::fabs(first[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, MoeTest,
    ::testing::Values(
        MoeCase{"Large_glm5_shape_batch4", 4, 6144, 2048, 8, 8, 8, false},
        MoeCase{"one_token_top1", 1, 64, 32, 8, 1, 8, false},
        MoeCase{"one_token_top8_256experts", 1, 128, 64, 256, 8, 256, false},
        MoeCase{"tiles_edges_empty_experts", 37, 132, 72, 16, 8, 10, false},
        MoeCase{"hot_expert_multi_tile", 200, 256, 64, 256, 8, 256, true},
        MoeCase{"top1_skewed", 150, 68, 36, 4, 1, 4, true},
        MoeCase{"top9_32experts", 9, 96, 40, 32, 9, 20, false},
        // Decode kernels (pairs <= 64): batch 3 / 8 at top_k 8 over 256 experts, a hidden past
        // one chunk iteration (512 fp32 values), every expert in every token (8 rows each).
        MoeCase{"gemv_batch3_top8_256experts", 3, 1044, 68, 256, 8, 256, false},
        MoeCase{"gemv_batch8_top8_256experts", 8, 256, 96, 256, 8, 256, false},
        MoeCase{"gemv_all_experts_every_token", 8, 132, 40, 8, 8, 8, false}),
    [](const ::testing::TestParamInfo<MoeCase>& p) { return p.param.name; });

}  // namespace
}  // namespace glm::engine::cuda
