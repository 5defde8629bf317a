// Tests of the DSA indexer (kernels/dsa_indexer.h) through the CUDA backend's IndexerTopK
// (cuda_indexer.h): every select path (single-CTA radix passes, multi-CTA passes, short-row
// select, the choice by shape; forced through IndexerPolicy) against a host reference of the
// contract (ascending positions, ties to the lowest position, -0.0 == +0.0, NaN below -inf, rows
// with num_keys <= top_k: 0..n-1 then -1) on given scores (kernels::DsaIndexerSelect), over rows
// 1 / 3 / 8 / 64, num_keys 1 .. 128K, random, all-equal, few-distinct and special-value scores;
// then the whole IndexerTopK (fp32 and fp8 keys, exact integer data: identical to the CPU
// backend) through every select path and score kernel, and CUDA-graph replay == eager. GPU cases
// skip without a GPU (the launchers' argument checks: kernels/dsa_indexer_test.cc). Cases named
// *Large* are left out under compute-sanitizer.
#include "engine/backend/cuda/cuda_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "engine/backend/kv_fp8_layout.h"
#include "engine/weights/float_codec.h"
#include "kernels/dsa_indexer.h"
#include "kernels/gpu_test_util.h"
#include "kernels/testing/dsa_indexer_reference.h"
#include "kernels/kernel_policy.h"

namespace glm::engine::cuda {

namespace {

using kernels::testing::GuardedBuffer;
using Select = kernels::IndexerPolicy::Select;
using Score = kernels::IndexerPolicy::Score;

// The select paths, forced (kShortRow where the row fits shared memory), then the choice by shape.
constexpr Select kSelects[] = {Select::kSingleCta, Select::kMultiCta, Select::kShortRow,
                               Select::kByShape};

const char* Name(Select p) {
  switch (p) {
    case Select::kByShape: return "by shape";
    case Select::kSingleCta: return "single-CTA";
    case Select::kMultiCta: return "multi-CTA";
    case Select::kShortRow: return "short-row";
  }
  return "?";
}

const char* Name(Score s) {
  switch (s) {
    case Score::kByShape: return "by shape";
    case Score::kFp32: return "fp32";
    case Score::kTensorCore: return "tc {2,2,2}";
    case Score::kTensorCoreWide: return "tc {4,8,0}";
  }
  return "?";
}

kernels::KernelPolicy PolicyOf(Select select, Score score = Score::kByShape) {
  kernels::KernelPolicy policy;
  policy.indexer.select = select;
  policy.indexer.score = score;
  return policy;
}

// Keys per row of the IndexerTopK cases: every 4th row min(max_keys, top_k) (exactly full), the
// others max(1, max_keys - 53 t).
std::vector<int32_t> RowNumKeys(int rows, int max_keys, int top_k) {
  std::vector<int32_t> nkeys(rows);
  for (int t = 0; t < rows; ++t) {
    nkeys[t] = t % 4 == 3 ? std::min(max_keys, top_k) : std::max(1, max_keys - 53 * t);
  }
  return nkeys;
}

using ::glm::kernels::testing::RefTopK;

enum class Pattern { kRandom, kAllEqual, kFewDistinct, kSpecials, kSignedZeros };

const char* Name(Pattern p) {
  switch (p) {
    case Pattern::kRandom: return "random";
    case Pattern::kAllEqual: return "all_equal";
    case Pattern::kFewDistinct: return "few_distinct";
    case Pattern::kSpecials: return "specials";
    case Pattern::kSignedZeros: return "signed_zeros";
  }
  return "?";
}

float Draw(Pattern p, std::mt19937& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> pick(0, 11);
  switch (p) {
    case Pattern::kRandom:
      return u(rng);
    case Pattern::kAllEqual:
      return 0.5f;
    case Pattern::kFewDistinct: {
      const float v[] = {-1.f, 0.f, 0.25f, 1.f, 2.f};
      return v[pick(rng) % 5];
    }
    case Pattern::kSpecials: {
      // NaN (both signs), +-inf, +-0, extremes, a denormal, and random finite values.
      const float v[] = {nan, -nan, -inf, inf, -0.f, 0.f, 3e38f, -3e38f, 1e-45f, -1e-45f,
                         u(rng), u(rng)};
      return v[pick(rng)];
    }
    case Pattern::kSignedZeros: {
      const int k = pick(rng);
      return k < 5 ? -0.f : k < 10 ? 0.f : k == 10 ? -1.f : 1.f;
    }
  }
  return 0.f;
}

class IndexerSelectTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }

  // Scores [rows, ld] of `pattern`, row t with num_keys n_t <= max_keys (row 0: max_keys; every
  // 4th row <= top_k when max_keys allows); every select path's output must equal the reference.
  void Check(int rows, int max_keys, int top_k, Pattern pattern) {
    SCOPED_TRACE(testing::Message() << "rows " << rows << " max_keys " << max_keys << " top_k "
                                    << top_k << " " << Name(pattern));
    const int64_t ld = (max_keys + 3) / 4 * 4 + 4;
    std::vector<float> s(static_cast<size_t>(rows) * ld, std::numeric_limits<float>::quiet_NaN());
    std::vector<int32_t> nk(rows);
    for (int t = 0; t < rows; ++t) {
      nk[t] = t == 0 ? max_keys
                     : (t % 4 == 3 ? std::min(max_keys, top_k) : std::max(1, max_keys - 97 * t));
      for (int i = 0; i < nk[t]; ++i) s[size_t(t) * ld + i] = Draw(pattern, rng_);
    }
    std::vector<int32_t> want;
    for (int t = 0; t < rows; ++t) {
      const std::vector<int32_t> r = RefTopK(s.data() + size_t(t) * ld, nk[t], top_k);
      want.insert(want.end(), r.begin(), r.end());
    }
    GuardedBuffer ds(s.size() * 4), dnk(nk.size() * 4), dout(want.size() * 4);
    ASSERT_EQ(ds.Upload(s.data(), s.size() * 4), cudaSuccess);
    ASSERT_EQ(dnk.Upload(nk.data(), nk.size() * 4), cudaSuccess);
    for (const Select path : kSelects) {
      kernels::IndexerPolicy policy;
      policy.select = path;
      ASSERT_EQ(dout.Poison(0x7B), cudaSuccess);
      const absl::Status st = kernels::DsaIndexerSelect(
          ds.as<float>(), ld, rows, dnk.as<int32_t>(), max_keys, top_k, dout.as<int32_t>(), policy,
          /*smem_cap_bytes=*/0,
          [this](int slot, size_t bytes) { return scratch_.Get(slot, bytes); }, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      GLM_CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<int32_t> got(want.size());
      ASSERT_EQ(dout.Download(got.data(), got.size() * 4), cudaSuccess);
      EXPECT_TRUE(dout.GuardsIntact()) << Name(path);
      for (int t = 0; t < rows; ++t) {
        const size_t b = size_t(t) * top_k;
        if (!std::equal(got.begin() + b, got.begin() + b + top_k, want.begin() + b)) {
          size_t i = b;
          while (got[i] == want[i]) ++i;
          ADD_FAILURE() << Name(path) << " row " << t << " (num_keys " << nk[t] << ") slot "
                        << i - b << ": got " << got[i] << ", want " << want[i];
          break;
        }
      }
    }
  }

  TestScratch scratch_;
  std::mt19937 rng_{77};
};

TEST_F(IndexerSelectTest, Sweep) {
  for (const int rows : {1, 3, 8, 64}) {
    for (const int keys : {1, 2047, 2048, 2049, 4096, 16385}) {
      for (const Pattern p : {Pattern::kRandom, Pattern::kAllEqual, Pattern::kFewDistinct,
                              Pattern::kSpecials, Pattern::kSignedZeros}) {
        Check(rows, keys, 2048, p);
      }
    }
  }
}

TEST_F(IndexerSelectTest, Long1x128k) {
  for (const int rows : {1, 3}) {
    for (const Pattern p : {Pattern::kRandom, Pattern::kAllEqual, Pattern::kSpecials}) {
      Check(rows, 131072, 2048, p);
    }
  }
}

TEST_F(IndexerSelectTest, Large8And64x128k) {
  for (const int rows : {8, 64}) {
    for (const Pattern p : {Pattern::kRandom, Pattern::kFewDistinct}) Check(rows, 131072, 2048, p);
  }
}

// The short-row select on rows up to (and past) the shared-memory limit, and other top_k values.
TEST_F(IndexerSelectTest, ShortRowsAndTopK) {
  for (const int keys : {300, 4096, 16385, 50000, 70000}) {
    for (const Pattern p : {Pattern::kRandom, Pattern::kFewDistinct, Pattern::kSpecials}) {
      Check(3, keys, 2048, p);
    }
  }
  for (const int top_k : {1, 100, 4095}) {
    Check(3, 4096, top_k, Pattern::kRandom);
    Check(3, 4096, top_k, Pattern::kFewDistinct);
  }
}

// A small subset for compute-sanitizer runs (memcheck / racecheck): every path, odd sizes,
// ties and special values.
TEST_F(IndexerSelectTest, SanitizerSubset) {
  Check(3, 2049, 2048, Pattern::kSpecials);
  Check(3, 4096, 2048, Pattern::kAllEqual);
  Check(2, 16385, 2048, Pattern::kFewDistinct);
  Check(1, 40000, 100, Pattern::kRandom);
}

// ---- The whole IndexerTopK: every path, fp32 and fp8 keys, exact data (identical to the CPU).

class IndexerTopKPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_SKIP_WITHOUT_GPU();
    cpu_ = CreateCpuBackend(0);
  }
  template <typename T>
  T* Dev(const std::vector<T>& v) {
    bufs_.push_back(std::make_unique<GuardedBuffer>(std::max<size_t>(v.size(), 1) * sizeof(T)));
    EXPECT_TRUE(bufs_.back()->ok());
    if (!v.empty()) {
      EXPECT_EQ(bufs_.back()->Upload(v.data(), v.size() * sizeof(T)), cudaSuccess);
    }
    return bufs_.back()->as<T>();
  }

  // Keys from {0, +-1, +-2, +-3, +-4, +-6, +-8} with 8 in every row (exact in e4m3 at scale
  // 2^-5), q and weights in [-3, 3], scales powers of two: every score is exact in any order.
  // scores: the score kernels to run (forced tensor-core kernels where they apply, else the fp32
  // kernel: dim != 128 and block_size 2 test that).
  // block_size: the fp8 cache's (not a multiple of 4: the tensor-core kernel falls back).
  void Run(int rows, int max_keys, bool fp8, int heads = 32, int dim = 128,
           const std::vector<Score>& scores = {Score::kByShape}, int block_size = 64) {
    SCOPED_TRACE(testing::Message() << "rows " << rows << " max_keys " << max_keys << " fp8 "
                                    << fp8 << " heads " << heads << " dim " << dim
                                    << " block_size " << block_size);
    const int kHeads = heads, kDim = dim, kBs = block_size;
    constexpr int kTopK = 2048;
    const int64_t n_slots = (int64_t{max_keys} + 100 + kBs - 1) / kBs * kBs;
    std::vector<float> keys(n_slots * kDim);
    const float vals[] = {0, 1, -1, 2, -2, 3, -3, 4, -4, 6, -6, 8, -8};
    std::uniform_int_distribution<int> pick(0, 12), small(-3, 3);
    for (int64_t r = 0; r < n_slots; ++r) {
      for (int d = 0; d < kDim; ++d) keys[r * kDim + d] = vals[pick(rng_)];
      keys[r * kDim] = 8.0f;
    }
    std::vector<int32_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    std::vector<uint8_t> cache(n_slots * (kDim + 4), 0);
    const Fp8IndexCache cc{cache.data(), n_slots, kDim, kBs};
    if (fp8) cpu_->WriteIndexKeysFp8(MatView{keys.data(), n_slots, kDim, kDim}, all.data(), cc);
    std::vector<int32_t> table, offset;
    const std::vector<int32_t> nkeys = RowNumKeys(rows, max_keys, kTopK);
    ShuffledKeyTable(all, nkeys, rng_, &table, &offset);
    std::vector<float> q(size_t(rows) * kHeads * kDim), w(size_t(rows) * kHeads);
    for (float& v : q) v = static_cast<float>(small(rng_));
    for (float& v : w) v = static_cast<float>(small(rng_));
    IndexerTopKArgs a;
    a.q = HeadsView{q.data(), rows, kHeads, kDim, int64_t{kHeads} * kDim, kDim};
    a.weights = MatView{w.data(), rows, kHeads, kHeads};
    a.keys = MatView{fp8 ? nullptr : keys.data(), n_slots, kDim, kDim};
    if (fp8) a.keys_fp8 = cc;
    a.table = {table.data(), offset.data(), nkeys.data(), max_keys};
    a.weight_scale = 0.25f;
    a.score_scale = 0.125f;
    a.top_k = kTopK;
    std::vector<int32_t> want(size_t(rows) * kTopK);
    a.out = want.data();
    cpu_->IndexerTopK(a);

    IndexerTopKArgs g = a;
    g.q.data = Dev(q);
    g.weights.data = Dev(w);
    if (fp8) {
      g.keys_fp8 = Fp8IndexCache{Dev(cache), n_slots, kDim, kBs};
    } else {
      g.keys.data = Dev(keys);
    }
    g.table = {Dev(table), Dev(offset), Dev(nkeys), max_keys};
    GuardedBuffer dout(want.size() * 4);
    g.out = dout.as<int32_t>();
    cudaStream_t stream;
    GLM_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (const Score score : scores) {
    for (const Select select : kSelects) {
      SCOPED_TRACE(testing::Message() << "score " << Name(score) << ", select " << Name(select));
      const kernels::KernelPolicy policy = PolicyOf(select, score);
      ASSERT_EQ(dout.Poison(0x7B), cudaSuccess);
      const absl::Status st = IndexerTopK(g, policy, scratch_, stream);
      ASSERT_TRUE(st.ok()) << st;
      GLM_CUDA_ASSERT(cudaStreamSynchronize(stream));
      std::vector<int32_t> got(want.size());
      ASSERT_EQ(dout.Download(got.data(), got.size() * 4), cudaSuccess);
      EXPECT_TRUE(dout.GuardsIntact());
      EXPECT_TRUE(got == want) << "differs from the CPU backend";
      // Graph replay == eager (scratch already grown by the eager call).
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(dout.Poison(0x3C), cudaSuccess);
      GLM_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const absl::Status cst = IndexerTopK(g, policy, scratch_, stream);
      GLM_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
      ASSERT_TRUE(cst.ok()) << cst;
      GLM_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
      GLM_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      GLM_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      GLM_CUDA_ASSERT(cudaStreamSynchronize(stream));
      std::vector<int32_t> replay(want.size());
      ASSERT_EQ(dout.Download(replay.data(), replay.size() * 4), cudaSuccess);
      EXPECT_TRUE(replay == got) << "graph replay != eager";
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    }
    cudaStreamDestroy(stream);
  }

  std::unique_ptr<Backend> cpu_;
  TestScratch scratch_;
  std::mt19937 rng_{2026};
  std::vector<std::unique_ptr<GuardedBuffer>> bufs_;
};

TEST_F(IndexerTopKPathsTest, Fp32KeysMatchCpu) {
  for (const int rows : {1, 8}) {
    for (const int keys : {2049, 4096, 16385}) Run(rows, keys, false);
  }
}

TEST_F(IndexerTopKPathsTest, Fp8KeysMatchCpu) {
  for (const int rows : {1, 8}) {
    for (const int keys : {2049, 4096, 16385}) Run(rows, keys, true);
  }
}

TEST_F(IndexerTopKPathsTest, SanitizerSubset) {
  Run(3, 2500, false);
  Run(3, 2500, true);
}

TEST_F(IndexerTopKPathsTest, Large1x128kBothKeyTypes) {
  Run(1, 131072, false);
  Run(1, 131072, true);
}

// Exact integer data through both tensor-core score kernels, the fp32 kernel and the choice by
// shape: identical to the CPU backend over rows 1 / 3 / 8 / 64 and num_keys 1, 2047, 2048, 2049,
// 4096, 16K + 1; 8 and 48 heads (padded to 32 / 64 in the kernel); dim 64 (the tensor-core
// kernels take dim 128 only: they fall back to the fp32 kernel).
TEST_F(IndexerTopKPathsTest, Fp8TensorCoreSweepMatchesCpu) {
  const std::vector<Score> all = {Score::kByShape, Score::kFp32, Score::kTensorCore,
                                  Score::kTensorCoreWide};
  for (const int rows : {1, 3, 8, 64}) {
    for (const int keys : {1, 2047, 2048, 2049, 4096, 16385}) {
      if (rows == 64 && keys > 4096) continue;  // host reference time; 64 x 16K in *Large*
      Run(rows, keys, true, 32, 128, all);
    }
  }
  for (const int heads : {8, 48}) Run(3, 4096, true, heads, 128, all);
  Run(3, 4096, true, 32, 64, {Score::kByShape, Score::kTensorCore});
  Run(3, 4096, true, 32, 128, {Score::kByShape, Score::kTensorCore}, /*block_size=*/4);
  // fp32-kernel fallback
  Run(3, 4096, true, 32, 128, {Score::kByShape, Score::kTensorCore}, /*block_size=*/2);
}

TEST_F(IndexerTopKPathsTest, LargeFp8TensorCore) {
  Run(64, 16385, true, 32, 128,
      {Score::kByShape, Score::kFp32, Score::kTensorCore, Score::kTensorCoreWide});
  Run(8, 131072, true, 32, 128, {Score::kTensorCore});
}

// ---- Random data: the tensor-core score kernel vs the fp32 CUDA-core kernel vs an fp64 host
// reference of the same fp8 keys. Bounds (per key s, M_s = sum_h |w_h ws| |ss k_scale|
// sum_d |q_hd k_sd|, the magnitude the fp32 roundings scale with):
//   |score - ref| <= kTol * M_s for every kernel (kTol = 1e-5: ~128 + 32 fp32 additions), and
//   each tensor-core variant's largest error at most 4x the fp32 kernel's + 1e-6 M (a lost split
//   term would be ~1e-3 (one bf16 term) or ~1e-5 (two) off); the errors are printed;
//   chosen sets: each differs from the reference's only at near-ties (|ref_s - T| <= 2 kTol M_s,
//   T = the reference's top_k-th score); the counts are printed.
// Repeated tensor-core calls and a CUDA-graph replay give bit-identical scores and indices; the
// choice by shape runs the kernel it should (DsaIndexerLaunch::score) with that kernel's scores.
class IndexerTcScoreTest : public IndexerTopKPathsTest {
 protected:
  static constexpr double kTol = 1e-5;

  struct Out {
    std::vector<float> scores;  // [rows, ld]
    std::vector<int32_t> idx;   // [rows, top_k]
  };

  Out Call(const IndexerTopKArgs& g, int rows, int64_t ld, Score score, GuardedBuffer& dout,
           cudaStream_t stream, bool graph, kernels::DsaIndexerLaunch* launched = nullptr) {
    const kernels::KernelPolicy policy = PolicyOf(Select::kByShape, score);
    Out o;
    EXPECT_EQ(dout.Poison(0x7B), cudaSuccess);
    if (graph) {
      cudaGraph_t gr = nullptr;
      cudaGraphExec_t ex = nullptr;
      EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const absl::Status st = IndexerTopK(g, policy, scratch_, stream, launched);
      EXPECT_EQ(cudaStreamEndCapture(stream, &gr), cudaSuccess);
      EXPECT_TRUE(st.ok()) << st;
      EXPECT_EQ(cudaGraphInstantiate(&ex, gr, 0), cudaSuccess);
      // Poison the scores so the replay must rewrite them.
      EXPECT_EQ(cudaMemsetAsync(scratch_.Peek(0), 0xFF, size_t(rows) * ld * 4, stream),
                cudaSuccess);
      EXPECT_EQ(cudaGraphLaunch(ex, stream), cudaSuccess);
      cudaGraphExecDestroy(ex);
      cudaGraphDestroy(gr);
    } else {
      const absl::Status st = IndexerTopK(g, policy, scratch_, stream, launched);
      EXPECT_TRUE(st.ok()) << st;
    }
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    o.scores.resize(size_t(rows) * ld);
    o.idx.resize(size_t(rows) * g.top_k);
    EXPECT_EQ(cudaMemcpy(o.scores.data(), scratch_.Peek(0), o.scores.size() * 4,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(dout.Download(o.idx.data(), o.idx.size() * 4), cudaSuccess);
    EXPECT_TRUE(dout.GuardsIntact());
    return o;
  }

  // specials: NaN / +-inf in a few query values and NaN key values (quantized as 0x7F); then
  // only the class (NaN, +inf, -inf, finite) must agree between the kernels, and finite scores
  // the bound above.
  void Compare(int rows, int max_keys, int heads, bool specials) {
    SCOPED_TRACE(testing::Message() << "rows " << rows << " max_keys " << max_keys << " heads "
                                    << heads << (specials ? " specials" : " random"));
    constexpr int kDim = 128, kBs = 64, kTopK = 2048;
    const int64_t n_slots = (int64_t{max_keys} + 100 + kBs - 1) / kBs * kBs;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::uniform_int_distribution<int> ex(-12, 12);
    std::vector<float> keys(n_slots * kDim);
    for (int64_t r = 0; r < n_slots; ++r) {
      const float mag = std::ldexp(1.0f, ex(rng_));  // per-token scales 2^-21 .. 2^3
      for (int d = 0; d < kDim; ++d) keys[r * kDim + d] = u(rng_) * mag;
      if (specials && r % 7 == 3) keys[r * kDim + (r % kDim)] = std::nanf("");
    }
    std::vector<int32_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    std::vector<uint8_t> cache(n_slots * (kDim + 4), 0);
    const Fp8IndexCache cc{cache.data(), n_slots, kDim, kBs};
    cpu_->WriteIndexKeysFp8(MatView{keys.data(), n_slots, kDim, kDim}, all.data(), cc);
    // Dequantized keys (host): e4m3 value * the token's scale.
    std::vector<double> kd(n_slots * kDim);
    for (int64_t r = 0; r < n_slots; ++r) {
      float scale;
      std::memcpy(&scale, cache.data() + kv_fp8::IndexScaleOffset(r, kBs, kDim), 4);
      const uint8_t* v = cache.data() + kv_fp8::IndexValueOffset(r, kBs, kDim);
      for (int d = 0; d < kDim; ++d) kd[r * kDim + d] = double(Fp8E4M3ToFloat(v[d])) * scale;
    }
    std::vector<int32_t> table, offset;
    const std::vector<int32_t> nkeys = RowNumKeys(rows, max_keys, kTopK);
    ShuffledKeyTable(all, nkeys, rng_, &table, &offset);
    std::vector<float> q(size_t(rows) * heads * kDim), w(size_t(rows) * heads);
    for (float& v : q) v = u(rng_);
    for (float& v : w) v = u(rng_);
    if (specials) {
      const float inf = std::numeric_limits<float>::infinity();
      q[0 * kDim + 5] = std::nanf("");                        // row 0 head 0
      if (rows > 1) q[(size_t(1) * heads + 1) * kDim + 9] = inf;  // row 1 head 1
      if (rows > 2) q[(size_t(2) * heads + 2) * kDim + 17] = -inf;
    }
    IndexerTopKArgs g;
    g.q = HeadsView{Dev(q), rows, heads, kDim, int64_t{heads} * kDim, kDim};
    g.weights = MatView{Dev(w), rows, heads, heads};
    g.keys = MatView{nullptr, n_slots, kDim, kDim};
    g.keys_fp8 = Fp8IndexCache{Dev(cache), n_slots, kDim, kBs};
    g.table = {Dev(table), Dev(offset), Dev(nkeys), max_keys};
    g.weight_scale = 0.17f;
    g.score_scale = 0.088f;
    g.top_k = kTopK;
    GuardedBuffer dout(size_t(rows) * kTopK * 4);
    g.out = dout.as<int32_t>();
    const int64_t ld = (max_keys + 3) / 4 * 4;
    cudaStream_t stream;
    GLM_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    kernels::DsaIndexerLaunch ran;
    const Out f32 = Call(g, rows, ld, Score::kFp32, dout, stream, false, &ran);
    EXPECT_EQ(ran.score, Score::kFp32);
    const Out tc = Call(g, rows, ld, Score::kTensorCore, dout, stream, false, &ran);
    EXPECT_EQ(ran.score, Score::kTensorCore);
    const Out tc2 = Call(g, rows, ld, Score::kTensorCore, dout, stream, false);
    const Out tcg = Call(g, rows, ld, Score::kTensorCore, dout, stream, true);
    const Out wide_out = Call(g, rows, ld, Score::kTensorCoreWide, dout, stream, false, &ran);
    EXPECT_EQ(ran.score, Score::kTensorCoreWide);
    // By shape: {4,8,0} for >= 8 rows or rows of > 16K keys, else {2,2,2}; bitwise the same as
    // that kernel forced.
    const Out by_shape = Call(g, rows, ld, Score::kByShape, dout, stream, false, &ran);
    const bool wide = rows >= 8 || max_keys > 16384;
    EXPECT_EQ(ran.score, wide ? Score::kTensorCoreWide : Score::kTensorCore);
    EXPECT_EQ(ran.scores_ld, ld);
    const Out& same_kernel = wide ? wide_out : tc;
    EXPECT_TRUE(by_shape.idx == same_kernel.idx) << "by-shape indices differ from its kernel's";
    cudaStreamDestroy(stream);
    EXPECT_TRUE(tc.idx == tc2.idx && tc.idx == tcg.idx) << "tensor-core indices not repeatable";
    constexpr int kKernels = 3;
    const Out* outs[kKernels] = {&f32, &tc, &wide_out};
    const char* kNames[kKernels] = {Name(Score::kFp32), Name(Score::kTensorCore),
                                    Name(Score::kTensorCoreWide)};
    double err[kKernels] = {}, err_sum[kKernels] = {}, rel[kKernels] = {};
    int64_t flips[kKernels] = {}, scored = 0, class_bad = 0;
    for (int t = 0; t < rows; ++t) {
      const int n = nkeys[t];
      if (n <= kTopK) continue;  // no scores: 0..n-1 (checked against the CPU elsewhere)
      const size_t b = size_t(t) * ld;
      ASSERT_EQ(std::memcmp(tc.scores.data() + b, tc2.scores.data() + b, n * 4), 0)
          << "row " << t << ": tensor-core scores not bit-identical between calls";
      ASSERT_EQ(std::memcmp(tc.scores.data() + b, tcg.scores.data() + b, n * 4), 0)
          << "row " << t << ": graph replay scores != eager";
      ASSERT_EQ(std::memcmp(by_shape.scores.data() + b, same_kernel.scores.data() + b, n * 4), 0)
          << "row " << t << ": by-shape scores differ from its kernel's";
      std::vector<double> ref(n), mag(n);
      for (int i = 0; i < n; ++i) {
        const int64_t r = table[offset[t] + i];
        double sc = 0, m = 0;
        for (int h = 0; h < heads; ++h) {
          const float* qh = q.data() + (size_t(t) * heads + h) * kDim;
          const double* kr = kd.data() + r * kDim;
          double dot = 0, adot = 0;
          for (int d = 0; d < kDim; ++d) {
            const double pr = double(qh[d]) * kr[d];
            dot += pr;
            if (std::isfinite(pr)) adot += std::fabs(pr);
          }
          const double wh = double(w[size_t(t) * heads + h]) * double(g.weight_scale);
          const double z = dot * double(g.score_scale);
          sc += (z > 0 ? z : 0.0) * wh;  // relu; a NaN dot gives 0 (the kernels' fmaxf)
          m += std::fabs(wh) * adot * double(g.score_scale);
        }
        ref[i] = sc, mag[i] = m + 1e-30;
      }
      for (int i = 0; i < n; ++i) {
        const float a = f32.scores[b + i];
        ++scored;
        for (int k = 0; k < kKernels; ++k) {
          const float c = outs[k]->scores[b + i];
          if (!std::isfinite(a) || !std::isfinite(c) || !std::isfinite(ref[i])) {
            const bool same = (std::isnan(a) && std::isnan(c)) || a == c;
            if (!same) ++class_bad;
            if (!specials) {
              ADD_FAILURE() << "row " << t << " key " << i << ": non-finite score (fp32 " << a
                            << ", " << kNames[k] << " " << c << ") from finite data";
              return;
            }
            continue;
          }
          const double e = std::fabs(c - ref[i]) / mag[i];
          err[k] = std::max(err[k], e);
          err_sum[k] += e;
          if (std::fabs(a) > 1e-3 * mag[i]) {
            rel[k] = std::max(rel[k], std::fabs(double(c) - a) / std::fabs(a));
          }
        }
      }
      if (specials) continue;  // sets: random data only
      // Reference set and threshold.
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::nth_element(order.begin(), order.begin() + (kTopK - 1), order.end(),
                       [&](int32_t x, int32_t y) {
                         return ref[x] != ref[y] ? ref[x] > ref[y] : x < y;
                       });
      const double thr = ref[order[kTopK - 1]];
      std::vector<char> in_ref(n, 0);
      for (int i = 0; i < kTopK; ++i) in_ref[order[i]] = 1;
      for (int k = 0; k < kKernels; ++k) {
        std::vector<char> in(n, 0);
        for (int i = 0; i < kTopK; ++i) {
          const int32_t pos = outs[k]->idx[size_t(t) * kTopK + i];
          ASSERT_TRUE(pos >= 0 && pos < n) << "row " << t << " slot " << i << ": " << pos;
          in[pos] = 1;
        }
        for (int i = 0; i < n; ++i) {
          if (in[i] == in_ref[i]) continue;
          ++flips[k];
          EXPECT_LE(std::fabs(ref[i] - thr), 2 * kTol * mag[i])
              << kNames[k] << " row " << t << " key " << i
              << ": chosen differently from the reference without a near-tie";
        }
      }
    }
    std::printf("  [tc-score] rows %d keys %d heads %d %s: %lld scores; max (mean) |err|/M, max "
                "|x - fp32|/|fp32|, set flips vs the fp64 reference%s:\n",
                rows, max_keys, heads, specials ? "specials" : "random",
                static_cast<long long>(scored), specials ? " (not compared)" : "");
    for (int k = 0; k < kKernels; ++k) {
      std::printf("  [tc-score]   %-14s %.3g (%.3g)  %.3g  %lld\n", kNames[k], err[k],
                  err_sum[k] / std::max<int64_t>(scored, 1), rel[k],
                  static_cast<long long>(flips[k]));
    }
    EXPECT_EQ(class_bad, 0) << "NaN / inf classes differ between the kernels";
    for (int k = 0; k < kKernels; ++k) {
      EXPECT_LE(err[k], kTol) << kNames[k];
      // A lost split term would be ~1e-3 (one bf16 term) or ~1e-5 (two) off.
      EXPECT_LE(err[k], 4 * err[0] + 1e-6) << kNames[k] << ": less accurate than the fp32 kernel";
    }
  }
};

TEST_F(IndexerTcScoreTest, RandomVsFp32AndReference) {
  for (const int rows : {1, 3, 8}) {
    for (const int keys : {2049, 4096, 16385}) Compare(rows, keys, 32, false);
  }
  Compare(64, 4096, 32, false);
  Compare(3, 4096, 48, false);
  Compare(3, 4096, 8, false);
  Compare(8, 4096, 48, false);  // the wide variant at 64 padded heads (49 KiB of fragments)
}

TEST_F(IndexerTcScoreTest, SpecialValues) {
  Compare(3, 4096, 32, true);
  Compare(4, 2500, 48, true);
  Compare(8, 2500, 32, true);  // by shape: the wide variant
}

TEST_F(IndexerTcScoreTest, SanitizerSubset) {
  Compare(3, 2500, 32, false);
  Compare(3, 2500, 48, true);
}

TEST_F(IndexerTcScoreTest, Large1x128k) { Compare(1, 131072, 32, false); }

}  // namespace
}  // namespace glm::engine::cuda
