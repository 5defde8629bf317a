// Tests of the DSA indexer's top-k selection paths (cuda_ops_indexer.cu): the legacy single-CTA
// radix passes, the multi-CTA passes, the short-row select (row in shared memory) and the choice
// by shape, all against a host reference of the contract (ascending positions, ties to the lowest
// position, -0.0 == +0.0, NaN below -inf, rows with num_keys <= top_k: 0..n-1 then -1) on given
// scores (IndexerSelectForTest), over rows 1 / 3 / 8 / 64, num_keys 1 .. 128K, random, all-equal,
// few-distinct and special-value scores; then the whole IndexerTopK (fp32 and fp8 keys, exact
// integer data: identical to the CPU backend) through every path, and CUDA-graph replay == eager.
// GPU cases skip without a GPU; the argument checks run everywhere. Cases named *Large* are left
// out under compute-sanitizer.
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

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
#include "engine/backend/cuda/cuda_ops_hooks.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "engine/backend/kv_fp8_layout.h"
#include "engine/weights/float_codec.h"
#include "kernels/gpu_test_util.h"

namespace glm::engine::cuda {

namespace {

using kernels::testing::GuardedBuffer;

// Path modes of SetIndexerPathForBench: legacy, multi-CTA, short-row, before-short default,
// default; then kMultiSingleOutput: the multi-CTA passes with the single-CTA output pass
// (SetIndexerOutputForBench(1)) instead of the parallel one.
constexpr int kMultiSingleOutput = 102;
constexpr int kModes[] = {1, 2, 3, 4, 0, kMultiSingleOutput};

// Sets the path hooks for one of kModes.
void SetPathMode(int mode) {
  SetIndexerOutputForBench(mode == kMultiSingleOutput ? 1 : 0);
  SetIndexerPathForBench(mode == kMultiSingleOutput ? 2 : mode);
}

// Resets the path hooks at scope exit (a failed ASSERT must not leave a forced path behind).
struct PathReset {
  ~PathReset() {
    SetIndexerPathForBench(-1);
    SetIndexerOutputForBench(0);
    SetIndexerShortThreadsForBench(0);
    SetIndexerScorePathForBench(-1);
    SetIndexerScoreAheadForBench(-1);
    SetIndexerScoreCtasPerSmForBench(0);
  }
};

// Keys per row of the IndexerTopK cases: every 4th row min(max_keys, top_k) (exactly full), the
// others max(1, max_keys - 53 t).
std::vector<int32_t> RowNumKeys(int rows, int max_keys, int top_k) {
  std::vector<int32_t> nkeys(rows);
  for (int t = 0; t < rows; ++t) {
    nkeys[t] = t % 4 == 3 ? std::min(max_keys, top_k) : std::max(1, max_keys - 53 * t);
  }
  return nkeys;
}

uint32_t OrderedKeyHost(float f) {
  if (std::isnan(f)) return 0u;
  if (f == 0.f) f = 0.f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The contract on one row of n scores.
std::vector<int32_t> RefTopK(const float* s, int n, int top_k) {
  std::vector<int32_t> out(top_k, -1);
  if (n <= top_k) {
    for (int i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + (top_k - 1), order.end(),
                   [&](int32_t a, int32_t b) {
                     const uint32_t ka = OrderedKeyHost(s[a]), kb = OrderedKeyHost(s[b]);
                     return ka != kb ? ka > kb : a < b;
                   });
  std::sort(order.begin(), order.begin() + top_k);
  std::copy_n(order.begin(), top_k, out.begin());
  return out;
}

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

bool GpuPresent() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

class IndexerSelectTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }

  // Scores [rows, ld] of `pattern`, row t with num_keys n_t <= max_keys (row 0: max_keys; every
  // 4th row <= top_k when max_keys allows); every mode's output must equal the reference.
  void Check(int rows, int max_keys, int top_k, Pattern pattern,
             const std::vector<int>& short_threads = {0}) {
    SCOPED_TRACE(testing::Message() << "rows " << rows << " max_keys " << max_keys << " top_k "
                                    << top_k << " " << Name(pattern));
    PathReset reset;
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
    for (const int threads : short_threads) {
      SetIndexerShortThreadsForBench(threads);
      for (const int mode : kModes) {
        if (threads != 0 && mode != 3) continue;
        SetPathMode(mode);
        ASSERT_EQ(dout.Poison(0x7B), cudaSuccess);
        const absl::Status st = IndexerSelectForTest(ds.as<float>(), ld, rows, dnk.as<int32_t>(),
                                                     max_keys, top_k, dout.as<int32_t>(),
                                                     scratch_, nullptr);
        ASSERT_TRUE(st.ok()) << st;
        GLM_CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<int32_t> got(want.size());
        ASSERT_EQ(dout.Download(got.data(), got.size() * 4), cudaSuccess);
        EXPECT_TRUE(dout.GuardsIntact()) << "mode " << mode;
        for (int t = 0; t < rows; ++t) {
          const size_t b = size_t(t) * top_k;
          if (!std::equal(got.begin() + b, got.begin() + b + top_k, want.begin() + b)) {
            size_t i = b;
            while (got[i] == want[i]) ++i;
            ADD_FAILURE() << "mode " << mode << " threads " << threads << " row " << t
                          << " (num_keys " << nk[t] << ") slot " << i - b << ": got " << got[i]
                          << ", want " << want[i];
            break;
          }
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

// The short-row CTA at every thread count, rows up to (and past) the shared-memory limit, and
// other top_k values.
TEST_F(IndexerSelectTest, ShortThreadsAndTopK) {
  for (const int keys : {300, 4096, 16385, 50000, 70000}) {
    for (const Pattern p : {Pattern::kRandom, Pattern::kFewDistinct, Pattern::kSpecials}) {
      Check(3, keys, 2048, p, {0, 256, 512, 1024});
    }
  }
  for (const int top_k : {1, 100, 4095}) {
    Check(3, 4096, top_k, Pattern::kRandom);
    Check(3, 4096, top_k, Pattern::kFewDistinct);
  }
}

// A small subset for compute-sanitizer runs (memcheck / racecheck): every path, odd sizes,
// ties and special values, the short-row CTA at 256 and 1024 threads.
TEST_F(IndexerSelectTest, SanitizerSubset) {
  Check(3, 2049, 2048, Pattern::kSpecials, {0, 256, 1024});
  Check(3, 4096, 2048, Pattern::kAllEqual, {0, 256});
  Check(2, 16385, 2048, Pattern::kFewDistinct, {0, 1024});
  Check(1, 40000, 100, Pattern::kRandom, {0});
}

// Every indexer bench hook that changes a value moves IndexerSettingsGeneration (so the CUDA
// backend recaptures decode graphs); setting the same value again does not. No GPU needed.
TEST(IndexerSettings, HooksMoveTheGeneration) {
  PathReset reset;
  struct Hook {
    const char* name;
    void (*set)(int);
    int a, b;  // two different values
  };
  const Hook hooks[] = {{"output", SetIndexerOutputForBench, 0, 1},
                        {"path", SetIndexerPathForBench, 0, 2},
                        {"short threads", SetIndexerShortThreadsForBench, 0, 512},
                        {"score ctas", SetIndexerScoreCtasPerSmForBench, 2, 4},
                        {"score ahead", SetIndexerScoreAheadForBench, 2, 0},
                        {"score path", SetIndexerScorePathForBench, 0, 3}};
  for (const Hook& h : hooks) {
    SCOPED_TRACE(h.name);
    h.set(h.a);
    const int64_t g0 = IndexerSettingsGeneration();
    h.set(h.a);
    EXPECT_EQ(IndexerSettingsGeneration(), g0);
    h.set(h.b);
    EXPECT_EQ(IndexerSettingsGeneration(), g0 + 1);
    h.set(h.b);
    EXPECT_EQ(IndexerSettingsGeneration(), g0 + 1);
    h.set(h.a);
    EXPECT_EQ(IndexerSettingsGeneration(), g0 + 2);
  }
}

// Argument checks: no GPU needed (they come before any CUDA call).
TEST(IndexerSelectArgs, RejectsBadScoreLayout) {
  TestScratch scratch;
  const absl::Status st =
      IndexerSelectForTest(nullptr, /*ld=*/6, /*rows=*/1, nullptr, 6, 2, nullptr, scratch, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("multiple of 4"), absl::string_view::npos) << st;
  const absl::Status st2 =
      IndexerSelectForTest(nullptr, /*ld=*/8, /*rows=*/1, nullptr, 9, 2, nullptr, scratch, nullptr);
  EXPECT_EQ(st2.code(), absl::StatusCode::kInvalidArgument) << st2;
  if (!GpuPresent()) std::printf("(no GPU: the selection cases skip; argument checks ran)\n");
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
  // score_modes: SetIndexerScorePathForBench modes to run (0 by shape, 1 fp32 CUDA-core kernel,
  // 2 / 3 / 4 tensor-core kernel variants wherever they apply, else the fp32 kernel: dim != 128
  // and block_size 2 test that).
  // block_size: the fp8 cache's (not a multiple of 4: the tensor-core kernel falls back).
  void Run(int rows, int max_keys, bool fp8, int heads = 32, int dim = 128,
           const std::vector<int>& score_modes = {0}, int block_size = 64) {
    SCOPED_TRACE(testing::Message() << "rows " << rows << " max_keys " << max_keys << " fp8 "
                                    << fp8 << " heads " << heads << " dim " << dim
                                    << " block_size " << block_size);
    PathReset reset;
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
    for (const int score_mode : score_modes) {
    SetIndexerScorePathForBench(score_mode);
    for (const int mode : kModes) {
      SCOPED_TRACE(testing::Message() << "score mode " << score_mode << " path mode " << mode);
      SetPathMode(mode);
      ASSERT_EQ(dout.Poison(0x7B), cudaSuccess);
      const absl::Status st = IndexerTopK(g, scratch_, stream);
      ASSERT_TRUE(st.ok()) << st;
      GLM_CUDA_ASSERT(cudaStreamSynchronize(stream));
      std::vector<int32_t> got(want.size());
      ASSERT_EQ(dout.Download(got.data(), got.size() * 4), cudaSuccess);
      EXPECT_TRUE(dout.GuardsIntact());
      EXPECT_TRUE(got == want) << "mode " << mode << " differs from the CPU backend";
      // Graph replay == eager (scratch already grown by the eager call).
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(dout.Poison(0x3C), cudaSuccess);
      GLM_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const absl::Status cst = IndexerTopK(g, scratch_, stream);
      GLM_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
      ASSERT_TRUE(cst.ok()) << cst;
      GLM_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
      GLM_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      GLM_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      GLM_CUDA_ASSERT(cudaStreamSynchronize(stream));
      std::vector<int32_t> replay(want.size());
      ASSERT_EQ(dout.Download(replay.data(), replay.size() * 4), cudaSuccess);
      EXPECT_TRUE(replay == got) << "mode " << mode << ": graph replay != eager";
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

// Exact integer data through the tensor-core score kernel (score mode 2), the fp32 kernel (1) and
// the choice by shape (0): identical to the CPU backend over rows 1 / 3 / 8 / 64 and num_keys 1,
// 2047, 2048, 2049, 4096, 16K + 1; 8 and 48 heads (padded to 32 / 64 in the kernel); dim 64 (the
// tensor-core kernel takes dim 128 only: mode 2 falls back to the fp32 kernel).
TEST_F(IndexerTopKPathsTest, Fp8TensorCoreSweepMatchesCpu) {
  for (const int rows : {1, 3, 8, 64}) {
    for (const int keys : {1, 2047, 2048, 2049, 4096, 16385}) {
      if (rows == 64 && keys > 4096) continue;  // host reference time; 64 x 16K in *Large*
      Run(rows, keys, true, 32, 128, {0, 1, 2, 3, 4});
    }
  }
  for (const int heads : {8, 48}) Run(3, 4096, true, heads, 128, {0, 1, 2, 3, 4});
  Run(3, 4096, true, 32, 64, {0, 2});
  Run(3, 4096, true, 32, 128, {0, 2}, /*block_size=*/4);
  Run(3, 4096, true, 32, 128, {0, 2}, /*block_size=*/2);  // fp32-kernel fallback
}

TEST_F(IndexerTopKPathsTest, LargeFp8TensorCore) {
  Run(64, 16385, true, 32, 128, {0, 1, 2, 3});
  Run(8, 131072, true, 32, 128, {2});
}

// ---- Random data: the tensor-core score kernel vs the fp32 CUDA-core kernel vs an fp64 host
// reference of the same fp8 keys. Bounds (per key s, M_s = sum_h |w_h ws| |ss k_scale|
// sum_d |q_hd k_sd|, the magnitude the fp32 roundings scale with):
//   |score - ref| <= kTol * M_s for every kernel (kTol = 1e-5: ~128 + 32 fp32 additions), and
//   each tensor-core variant's largest error at most 4x the fp32 kernel's + 1e-6 M (a lost split
//   term would be ~1e-3 (one bf16 term) or ~1e-5 (two) off); the errors are printed;
//   chosen sets: each differs from the reference's only at near-ties (|ref_s - T| <= 2 kTol M_s,
//   T = the reference's top_k-th score); the counts are printed.
// Repeated tensor-core calls, a CUDA-graph replay, every look-ahead (0 / 1 / 2) and chunks for
// 1 or 2 CTAs per SM give bit-identical scores and indices; the choice by shape runs the kernel
// it should (LastIndexerScoreKernelForTest) with that kernel's scores.
class IndexerTcScoreTest : public IndexerTopKPathsTest {
 protected:
  static constexpr double kTol = 1e-5;

  struct Out {
    std::vector<float> scores;  // [rows, ld]
    std::vector<int32_t> idx;   // [rows, top_k]
  };

  Out Call(const IndexerTopKArgs& g, int rows, int64_t ld, int score_mode, GuardedBuffer& dout,
           cudaStream_t stream, bool graph) {
    SetIndexerScorePathForBench(score_mode);
    Out o;
    EXPECT_EQ(dout.Poison(0x7B), cudaSuccess);
    if (graph) {
      cudaGraph_t gr = nullptr;
      cudaGraphExec_t ex = nullptr;
      EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const absl::Status st = IndexerTopK(g, scratch_, stream);
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
      const absl::Status st = IndexerTopK(g, scratch_, stream);
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
    PathReset reset;
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
    const Out f32 = Call(g, rows, ld, 1, dout, stream, false);
    const Out tc = Call(g, rows, ld, 2, dout, stream, false);
    const Out tc2 = Call(g, rows, ld, 2, dout, stream, false);
    const Out tcg = Call(g, rows, ld, 2, dout, stream, true);
    // Variants: 3 and 4 differ in registers only (same arithmetic: bit-identical scores).
    const Out tc3 = Call(g, rows, ld, 3, dout, stream, false);
    const Out tc4 = Call(g, rows, ld, 4, dout, stream, false);
    // By shape (mode 0): the wide variant ({4,8}, mode 3's kernel on its own chunks) for >= 8
    // rows or rows of > 16K keys, else mode 2's kernel; bitwise the same as that mode.
    const Out by_shape = Call(g, rows, ld, 0, dout, stream, false);
    const bool wide = rows >= 8 || max_keys > 16384;
    EXPECT_EQ(LastIndexerScoreKernelForTest(), wide ? 480 : 222);
    const Out& same_kernel = wide ? tc3 : tc;
    EXPECT_TRUE(by_shape.idx == same_kernel.idx) << "by-shape indices differ from its kernel's";
    // The look-ahead (SetIndexerScoreAheadForBench; tc ran the default, 2) and the chunk sizing
    // (1 CTA per SM: longer chunks, more steps per warp) change no key's arithmetic.
    std::vector<Out> ahead;
    for (const int ctas : {2, 1}) {
      SetIndexerScoreCtasPerSmForBench(ctas);
      for (const int a : {0, 1, 2}) {
        SetIndexerScoreAheadForBench(a);
        ahead.push_back(Call(g, rows, ld, 2, dout, stream, false));
      }
    }
    SetIndexerScoreAheadForBench(-1);
    SetIndexerScoreCtasPerSmForBench(0);
    cudaStreamDestroy(stream);
    for (const Out& o : ahead) EXPECT_TRUE(o.idx == tc.idx) << "look-ahead / chunks moved indices";
    EXPECT_TRUE(tc.idx == tc2.idx && tc.idx == tcg.idx) << "tensor-core indices not repeatable";
    EXPECT_TRUE(tc3.idx == tc4.idx) << "variants 3 and 4 chose different indices";
    constexpr int kKernels = 3;
    const Out* outs[kKernels] = {&f32, &tc, &tc3};
    const char* kNames[kKernels] = {"fp32", "tc (mode 2)", "tc (mode 3/4)"};
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
      ASSERT_EQ(std::memcmp(tc3.scores.data() + b, tc4.scores.data() + b, n * 4), 0)
          << "row " << t << ": score modes 3 and 4 (same arithmetic) differ";
      ASSERT_EQ(std::memcmp(by_shape.scores.data() + b, same_kernel.scores.data() + b, n * 4), 0)
          << "row " << t << ": by-shape scores differ from its kernel's";
      for (size_t k = 0; k < ahead.size(); ++k) {
        ASSERT_EQ(std::memcmp(tc.scores.data() + b, ahead[k].scores.data() + b, n * 4), 0)
            << "row " << t << ": look-ahead " << k % 3 << " at " << (k < 3 ? 2 : 1)
            << " CTAs per SM differs from the default";
      }
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
