// GemvNarrowPlan on the GPU against a host reference built from the same quantization:
// fp8: x rounded to bf16 and quantized with QuantizeFp8GroupHost (the bit-exact mirror of the
// device quantizer), ref[m,n] = Σ_g sx[m,g]·sw[n/128,g]·Σ_{k∈g} q[m,k]·w[n,k] in fp64;
// bf16: ref = Σ bf16(x)·w in fp64. L1 = the same sums over |terms|; tolerance
// |y - ref| <= 4e-5·L1 + 1e-6·(|ref| + |y0|) (fp32 accumulation of exact products; the final add
// into y when accumulating).
// Sweep: M 1/2/7/8/16, N 1/576/2048/16384/154880 (reference on sampled rows when large), K
// 128/6144/16384 and non-multiples (fp8: K % 16 == 0; bf16: any K, the row padding is NaN and must
// never be multiplied), accumulate on/off, strided x and y with guard bytes around y and the gap
// columns of y checked untouched. Exactness: with identity weights y equals the dequantized
// activation (fp8) / bf16(x) bit for bit. Non-finite inputs: a NaN/Inf in x poisons exactly its
// token's outputs. Determinism: repeated launches and a CUDA-graph replay give the same bits;
// overlapped (programmatic dependent) launches of dependent GEMVs keep stream order.
// Launch planning for GB10 and H200 limits runs without a GPU.
#include "kernels/gemv_narrow.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/gpu_test_util.h"
#include "kernels/quant_fp8_group.h"
#include "kernels/rmsnorm.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

using Rng = testing::XorShiftRng;

// A narrow weight on the host ([n, ldw] elements, fp8 also scales) and its device copy.
struct Weight {
  GemvWeight type;
  int64_t n = 0, k = 0, ldw = 0, scale_ld = 0;
  std::vector<uint8_t> q;        // fp8 [n, ldw]
  std::vector<uint16_t> b;       // bf16 [n, ldw]
  std::vector<float> scales;     // fp8 [ceil(n/128), scale_ld]
  std::unique_ptr<GuardedBuffer> dw, ds;

  float At(int64_t r, int64_t c) const {
    return type == GemvWeight::kBF16 ? Bf16ToFloat(b[r * ldw + c]) : E4m3ToFloat(q[r * ldw + c]);
  }
  float Scale(int64_t r, int64_t g) const {
    return type == GemvWeight::kBF16 ? 1.0f : scales[(r / 128) * scale_ld + g];
  }
};

Weight MakeWeight(GemvWeight type, int64_t n, int64_t k, uint64_t seed, bool identity = false) {
  Weight w;
  w.type = type;
  w.n = n;
  w.k = k;
  Rng rng(seed);
  if (type == GemvWeight::kBF16) {
    w.ldw = CeilDiv(k, 8) * 8;
    w.b.assign(n * w.ldw, 0x7fc0);  // padding: NaN (must never be multiplied)
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        w.b[r * w.ldw + c] = identity ? (r == c ? FloatToBf16(1.0f) : 0)
                                      : FloatToBf16(rng.Uniform() / std::sqrt(float(k)));
      }
    }
    w.dw = std::make_unique<GuardedBuffer>(w.b.size() * 2);
    EXPECT_EQ(w.dw->Upload(w.b.data(), w.b.size() * 2), cudaSuccess);
  } else {
    w.ldw = k;
    w.scale_ld = CeilDiv(CeilDiv(k, 128), 4) * 4;
    w.q.resize(n * k);
    for (size_t i = 0; i < w.q.size(); ++i) {
      uint8_t v = static_cast<uint8_t>(rng.Next());
      if ((v & 0x7f) == 0x7f) v = 0x38;  // no NaN encodings
      w.q[i] = v;
    }
    if (identity) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < k; ++c) w.q[r * k + c] = r == c ? 0x38 : 0;  // 1.0
      }
    }
    w.scales.assign(CeilDiv(n, 128) * w.scale_ld, 0.0f);
    for (float& s : w.scales) s = identity ? 1.0f : std::exp2(rng.Uniform() * 3.0f) / 448.0f;
    w.dw = std::make_unique<GuardedBuffer>(std::max<size_t>(w.q.size(), 16));
    w.ds = std::make_unique<GuardedBuffer>(w.scales.size() * 4);
    EXPECT_EQ(w.dw->Upload(w.q.data(), w.q.size()), cudaSuccess);
    EXPECT_EQ(w.ds->Upload(w.scales.data(), w.scales.size() * 4), cudaSuccess);
  }
  return w;
}

// x as the kernel multiplies it: per token, dequantized values and (fp8) the group scales.
struct EffectiveX {
  std::vector<float> v;      // [m, k]: bf16(x) or the e4m3 code's value (without the scale)
  std::vector<float> scale;  // fp8: [ceil(k/128), m] (QuantizeFp8GroupHost's layout)
};

EffectiveX MakeEffectiveX(GemvWeight type, const std::vector<float>& x, int64_t m, int64_t k,
                          int64_t ldx) {
  EffectiveX e;
  std::vector<float> xb(m * k);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) xb[r * k + c] = Bf16ToFloat(FloatToBf16(x[r * ldx + c]));
  }
  if (type == GemvWeight::kBF16) {
    e.v = std::move(xb);
    return e;
  }
  std::vector<uint8_t> q(m * k);
  e.scale.resize(CeilDiv(k, 128) * m);
  QuantizeFp8GroupHost(xb.data(), k, m, k, q.data(), k, e.scale.data(), m);
  e.v.resize(m * k);
  for (size_t i = 0; i < q.size(); ++i) e.v[i] = E4m3ToFloat(q[i]);
  return e;
}

// ref and L1 of output (token r, row n).
void Reference(const Weight& w, const EffectiveX& e, int64_t m, int64_t r, int64_t n, double* ref,
               double* l1) {
  double s = 0, a = 0;
  for (int64_t g = 0; g < CeilDiv(w.k, 128); ++g) {
    double bs = 0, ba = 0;
    for (int64_t c = g * 128; c < std::min(w.k, g * 128 + 128); ++c) {
      const double p = double(e.v[r * w.k + c]) * w.At(n, c);
      bs += p;
      ba += std::fabs(p);
    }
    const double f =
        w.type == GemvWeight::kBF16 ? 1.0 : double(e.scale[g * m + r]) * w.Scale(n, g);
    s += bs * f;
    a += ba * std::fabs(f);
  }
  *ref = s;
  *l1 = a;
}

// Whether the current device can launch thread-block clusters (the kCluster reduction).
bool DeviceHasClusters() {
  int dev = 0, major = 0, cl = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev);
  return major >= 9 && cl != 0;
}

class GemvNarrowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_SKIP_WITHOUT_GPU();
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (major * 10 + minor < 80) GTEST_SKIP() << "the kernels need compute capability 8.0+";
    counters_ = std::make_unique<GuardedBuffer>(kCounters * 4);
    ASSERT_TRUE(counters_->ok());
    ASSERT_EQ(cudaMemset(counters_->data(), 0, kCounters * 4), cudaSuccess);
  }
  void TearDown() override {
    if (counters_ == nullptr) return;
    // Every launch must leave the counters zero, and nothing may write around them.
    std::vector<int32_t> c(kCounters);
    ASSERT_EQ(counters_->Download(c.data(), kCounters * 4), cudaSuccess);
    for (int64_t i = 0; i < kCounters; ++i) ASSERT_EQ(c[i], 0) << "counter " << i;
    EXPECT_TRUE(counters_->GuardsIntact());
  }

  // Runs the plan; y (device) already holds y0.
  absl::Status Launch(const GemvNarrowPlan& plan, const Weight& w, const float* x, int64_t ldx,
                      float* y, int64_t ldy, bool acc, cudaStream_t stream = nullptr,
                      bool overlap = false) {
    if (workspace_bytes_ < plan.workspace_bytes()) {
      workspace_ = std::make_unique<GuardedBuffer>(plan.workspace_bytes());
      workspace_bytes_ = plan.workspace_bytes();
    }
    GemvNarrowArgs a;
    a.x = x;
    a.ldx = ldx;
    a.w = w.dw->data();
    a.ldw = w.ldw;
    a.w_scales = w.ds ? w.ds->as<float>() : nullptr;
    a.w_scale_ld = w.scale_ld;
    a.y = y;
    a.ldy = ldy;
    a.accumulate = acc;
    a.overlap_previous = overlap;
    return plan.Run(a, workspace_ ? workspace_->data() : nullptr, workspace_bytes_,
                    counters_->as<int32_t>(), kCounters, stream);
  }

  // One case: random x (groups of different magnitudes, some all-zero), strided x and y.
  void Check(GemvWeight type, int64_t m, int64_t n, int64_t k, bool acc, uint64_t seed) {
    const std::string what = absl::StrCat(type == GemvWeight::kBF16 ? "bf16" : "fp8", " m=", m,
                                          " n=", n, " k=", k, " acc=", acc,
                                          seed % 2 ? " x:4B" : " x:16B");
    SCOPED_TRACE(what);
    const Weight w = MakeWeight(type, n, k, seed);
    // Odd seeds: x rows not 16-byte aligned (4-byte loads); even: 16-byte loads of x.
    const int64_t ldx = seed % 2 ? k + 3 : (k + 3) / 4 * 4 + 4, ldy = n + 5;
    Rng rng(seed + 1);
    std::vector<float> x(m * ldx);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t g = 0; g < CeilDiv(ldx, 128); ++g) {
        const float mag = (r + g) % 7 == 3 ? 0.0f : std::exp2(rng.Uniform() * 6.0f);
        for (int64_t c = g * 128; c < std::min(ldx, g * 128 + 128); ++c) {
          x[r * ldx + c] = rng.Uniform() * mag;
        }
      }
    }
    std::vector<float> y0(m * ldy);
    for (float& v : y0) v = rng.Uniform();
    GuardedBuffer dx(x.size() * 4), dy(y0.size() * 4);
    ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
    const EffectiveX e = MakeEffectiveX(type, x, m, k, ldx);
    // Rows checked: all when small, else a stride plus both ends (each 128-row block's edges).
    std::vector<int64_t> rows;
    const int64_t work = m * n * k;
    const int64_t stride = work <= (int64_t{1} << 25) ? 1 : std::max<int64_t>(1, work >> 25);
    for (int64_t i = 0; i < n; i += stride) rows.push_back(i);
    for (int64_t i = std::max<int64_t>(0, n - 130); i < n; ++i) rows.push_back(i);
    std::vector<double> refs(m * rows.size()), l1s(m * rows.size());
    for (int64_t r = 0; r < m; ++r) {
      for (size_t j = 0; j < rows.size(); ++j) {
        Reference(w, e, m, r, rows[j], &refs[r * rows.size() + j], &l1s[r * rows.size() + j]);
      }
    }
    // Every split-K reduction: the global one (the previous kernel), the cluster one (forced:
    // capped to the cluster size) and the default; the same split partition gives the same bits.
    // Also the cluster reduction of a grid sized to one CTA per SM.
    // Variants 4-6 vary the latency knobs (GemvNarrowTuning), which must not change a bit:
    // 4: the previous kernel's (one staging item at a time, no L2 prefetch, serial reduction
    // loads) against the default plan (variant 2); 5: the global reduction with 8 staging items
    // and a 2-step prefetch against variant 0; 6: 4 items, 1-step prefetch, default reduction,
    // K split to fill one CTA per SM.
    std::vector<float> y_global, y_auto;
    GemvNarrowTiling t_global, t_auto;
    for (int variant = 0; variant < 7; ++variant) {
      const GemvSplitReduce reduce =
          variant == 0 || variant == 5 ? GemvSplitReduce::kGlobal
          : variant == 2 || variant == 4 || variant == 6 ? GemvSplitReduce::kAuto
                                                         : GemvSplitReduce::kCluster;
      GemvNarrowTuning tuning;
      if (variant == 4) tuning = GemvNarrowTuning::Previous();
      if (variant == 5) tuning = {8, 2, 1};
      if (variant == 6) tuning = {4, 1, 1};
      auto plan = GemvNarrowPlan::Create({m, n, k, type}, reduce,
                                         variant == 3 || variant == 6 ? 1 : 0, tuning);
      ASSERT_TRUE(plan.ok()) << plan.status();
      if (variant == 4) {
        EXPECT_EQ(plan->tiling().stage_batch, 1);
        EXPECT_EQ(plan->tiling().prefetch_steps, 0);
        EXPECT_FALSE(plan->tiling().batched_reduce);
      } else if (variant == 5) {
        EXPECT_EQ(plan->tiling().stage_batch, 8);
        EXPECT_EQ(plan->tiling().prefetch_steps, 2);
      }
      const GemvNarrowTiling& t = plan->tiling();
      SCOPED_TRACE(plan->DebugString());
      if (reduce == GemvSplitReduce::kGlobal) {
        EXPECT_EQ(t.cluster, 1);
        t_global = t;
      } else if (variant == 1 && t_global.splits > 1 && DeviceHasClusters()) {
        EXPECT_GT(t.cluster, 1) << "kCluster planned no cluster on a cluster-capable device";
      }
      if (t.cluster > 1) {
        EXPECT_EQ(t.cluster, t.splits);
        EXPECT_EQ(t.partial_bytes, 0u);
        EXPECT_EQ(t.counters, 0);
      }
      ASSERT_EQ(dy.Upload(y0.data(), y0.size() * 4), cudaSuccess);
      ASSERT_TRUE(Launch(*plan, w, dx.as<float>(), ldx, dy.as<float>(), ldy, acc).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> y(y0.size());
      ASSERT_EQ(dy.Download(y.data(), y.size() * 4), cudaSuccess);
      EXPECT_TRUE(dy.GuardsIntact());
      if (variant == 0) {
        y_global = y;
      } else if (t.splits == t_global.splits && t.groups_per_split == t_global.groups_per_split) {
        ASSERT_EQ(std::memcmp(y.data(), y_global.data(), y.size() * 4), 0)
            << "same splits as the global reduction, different bits";
      }
      if (variant == 2) {
        y_auto = y;
        t_auto = t;
      } else if (variant >= 4 && t.splits == t_auto.splits &&
                 t.groups_per_split == t_auto.groups_per_split) {
        ASSERT_EQ(std::memcmp(y.data(), y_auto.data(), y.size() * 4), 0)
            << "same splits as the default plan, other latency knobs, different bits";
      }
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = n; c < ldy; ++c) {
          ASSERT_EQ(y[r * ldy + c], y0[r * ldy + c]) << "gap column written at " << r << "," << c;
        }
      }
      double worst = 0;
      for (int64_t r = 0; r < m; ++r) {
        for (size_t j = 0; j < rows.size(); ++j) {
          const int64_t nn = rows[j];
          const double ref = refs[r * rows.size() + j], l1 = l1s[r * rows.size() + j];
          const double base = acc ? y0[r * ldy + nn] : 0.0;
          const double got = y[r * ldy + nn];
          ASSERT_TRUE(std::isfinite(got)) << "token " << r << " row " << nn;
          const double err = std::fabs(got - (base + ref));
          const double tol = 4e-5 * l1 + 1e-6 * (std::fabs(ref) + std::fabs(base)) + 1e-30;
          ASSERT_LE(err, tol) << "token " << r << " row " << nn << " got " << got << " ref "
                              << base + ref << " L1 " << l1;
          if (l1 > 0) worst = std::max(worst, err / l1);
        }
      }
      std::printf("[%s] %s: max err/L1 %.3g over %zu rows\n", what.c_str(),
                  plan->DebugString().c_str(), worst, rows.size());
    }
  }

  static constexpr int64_t kCounters = 4096;
  std::unique_ptr<GuardedBuffer> counters_, workspace_;
  size_t workspace_bytes_ = 0;
};

TEST_F(GemvNarrowTest, Fp8Sweep) {
  struct S { int64_t m, n, k; bool acc; };
  const S shapes[] = {
      {1, 1, 128, false},     {2, 1, 16, true},        {7, 3, 144, false},
      {8, 576, 6144, false},  {1, 576, 6144, true},    {16, 576, 6144, true},
      {1, 2048, 6144, false}, {2, 2048, 6144, true},   {8, 2048, 6144, false},
      {16, 2048, 6144, false}, {7, 2048, 2064, true},  {9, 130, 16384, false},
      {1, 6144, 16384, false}, {8, 6144, 16384, true}, {1, 16384, 2048, false},
      {16, 16384, 2048, true}, {1, 154880, 1024, false}, {16, 154880, 128, true},
      {3, 257, 6160, false},
  };
  uint64_t seed = 100;
  for (const S& s : shapes) Check(GemvWeight::kF8E4M3Block128, s.m, s.n, s.k, s.acc, ++seed);
}

TEST_F(GemvNarrowTest, Bf16Sweep) {
  struct S { int64_t m, n, k; bool acc; };
  const S shapes[] = {
      {1, 1, 1, false},        {2, 5, 13, true},        {7, 33, 1000, false},
      {8, 576, 6144, false},   {1, 576, 6144, true},    {16, 576, 6144, false},
      {1, 2048, 6144, false},  {8, 2048, 6144, true},   {16, 2048, 6145, true},
      {1, 6144, 16384, false}, {16, 6144, 16384, false}, {1, 16384, 2048, true},
      {2, 154880, 512, false}, {9, 129, 200, true},
  };
  uint64_t seed = 200;
  for (const S& s : shapes) Check(GemvWeight::kBF16, s.m, s.n, s.k, s.acc, ++seed);
}

// Identity weights: y[m, n] = the activation the kernel multiplied, which must be today's
// quantization bit for bit (fp8: E4m3ToFloat(q) · scale of QuantizeFp8GroupHost; bf16: bf16(x)).
TEST_F(GemvNarrowTest, ActivationNumericsAreExact) {
  for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16}) {
    for (int64_t m : {1, 8, 16}) {
      for (int64_t k : {int64_t{2048}, int64_t{1040}, int64_t{144}}) {
        SCOPED_TRACE(absl::StrCat(type == GemvWeight::kBF16 ? "bf16" : "fp8", " m=", m, " k=", k));
        const Weight w = MakeWeight(type, k, k, 7, /*identity=*/true);
        auto plan = GemvNarrowPlan::Create({m, k, k, type});
        ASSERT_TRUE(plan.ok()) << plan.status();
        Rng rng(m * 1000 + k);
        std::vector<float> x(m * k);
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = rng.Uniform() * std::exp2(rng.Uniform() * 20.0f);
        }
        GuardedBuffer dx(x.size() * 4), dy(x.size() * 4);
        ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
        ASSERT_TRUE(Launch(*plan, w, dx.as<float>(), k, dy.as<float>(), k, false).ok());
        std::vector<float> y(x.size());
        ASSERT_EQ(dy.Download(y.data(), y.size() * 4), cudaSuccess);
        const EffectiveX e = MakeEffectiveX(type, x, m, k, k);
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t c = 0; c < k; ++c) {
            const float want = type == GemvWeight::kBF16
                                   ? e.v[r * k + c]
                                   : e.v[r * k + c] * e.scale[(c / 128) * m + r];
            ASSERT_EQ(y[r * k + c], want) << "token " << r << " column " << c;
          }
        }
      }
    }
  }
}

TEST_F(GemvNarrowTest, NonFiniteInputPoisonsOnlyItsToken) {
  for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16}) {
    for (float bad : {std::nanf(""), INFINITY}) {
      const int64_t m = 4, n = 300, k = 6144;
      SCOPED_TRACE(absl::StrCat(type == GemvWeight::kBF16 ? "bf16" : "fp8", " bad=", bad));
      const Weight w = MakeWeight(type, n, k, 11);
      auto plan = GemvNarrowPlan::Create({m, n, k, type});
      ASSERT_TRUE(plan.ok()) << plan.status();
      Rng rng(5);
      std::vector<float> x(m * k);
      for (float& v : x) v = rng.Uniform();
      x[2 * k + 4000] = bad;
      GuardedBuffer dx(x.size() * 4), dy(m * n * 4);
      ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
      ASSERT_TRUE(Launch(*plan, w, dx.as<float>(), k, dy.as<float>(), n, false).ok());
      std::vector<float> y(m * n);
      ASSERT_EQ(dy.Download(y.data(), y.size() * 4), cudaSuccess);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          if (r == 2) {
            // fp8: the group's scale is NaN/Inf, so every output of the token is NaN. bf16: Inf
            // times a nonzero weight stays infinite (NaN where signs cancel).
            ASSERT_FALSE(std::isfinite(y[r * n + c])) << "row " << c;
          } else {
            ASSERT_TRUE(std::isfinite(y[r * n + c])) << "token " << r << " row " << c;
          }
        }
      }
    }
  }
}

// Split-K shapes: repeated eager launches and a graph replay agree bit for bit.
// Every reduction (global, cluster, default) at M = 1 and 8.
TEST_F(GemvNarrowTest, DeterministicAndGraphReplayEqualsEager) {
  for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16})
  for (int variant = 0; variant < 5; ++variant)
  for (int64_t m : {1, 8}) {
    // Variant 4: the global reduction with 8 staging items and a 2-step L2 prefetch.
    const GemvSplitReduce reduce =
        variant == 0 || variant == 4 ? GemvSplitReduce::kGlobal
        : variant == 2               ? GemvSplitReduce::kAuto
                                     : GemvSplitReduce::kCluster;
    const int64_t n = 2048, k = 6144;
    const Weight w = MakeWeight(type, n, k, 21);
    auto plan = GemvNarrowPlan::Create({m, n, k, type}, reduce, variant == 3 ? 1 : 0,
                                       variant == 4 ? GemvNarrowTuning{8, 2, 1}
                                                    : GemvNarrowTuning{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    SCOPED_TRACE(plan->DebugString());
    EXPECT_GT(plan->tiling().splits, 1) << plan->DebugString();
    Rng rng(3);
    std::vector<float> x(m * k);
    for (float& v : x) v = rng.Uniform() * 3.0f;
    GuardedBuffer dx(x.size() * 4), dy(m * n * 4);
    ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
    std::vector<float> first(m * n), again(m * n);
    ASSERT_TRUE(Launch(*plan, w, dx.as<float>(), k, dy.as<float>(), n, false).ok());
    ASSERT_EQ(dy.Download(first.data(), first.size() * 4), cudaSuccess);
    for (int i = 0; i < 5; ++i) {
      ASSERT_EQ(dy.Poison(0xFF), cudaSuccess);
      ASSERT_TRUE(Launch(*plan, w, dx.as<float>(), k, dy.as<float>(), n, false).ok());
      ASSERT_EQ(dy.Download(again.data(), again.size() * 4), cudaSuccess);
      ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << "eager " << i;
    }
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const absl::Status st = Launch(*plan, w, dx.as<float>(), k, dy.as<float>(), n, false, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(dy.Poison(0xFF), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ASSERT_EQ(dy.Download(again.data(), again.size() * 4), cudaSuccess);
      ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << "replay " << i;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// Back-to-back dependent launches with programmatic dependent launch (each GEMV reads the
// previous one's output, or accumulates into it) give the same bits as plain stream order,
// eager and replayed from a graph.
TEST_F(GemvNarrowTest, OverlappedLaunchesKeepStreamOrder) {
  for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16})
  for (int variant = 0; variant < 5; ++variant) {
    // Variant 4: the global reduction with 8 staging items and a 2-step L2 prefetch.
    const GemvSplitReduce reduce =
        variant == 0 || variant == 4 ? GemvSplitReduce::kGlobal
        : variant == 2               ? GemvSplitReduce::kAuto
                                     : GemvSplitReduce::kCluster;
    const GemvNarrowTuning tuning =
        variant == 4 ? GemvNarrowTuning{8, 2, 1} : GemvNarrowTuning{};
    SCOPED_TRACE(absl::StrCat(type == GemvWeight::kBF16 ? "bf16" : "fp8", " variant ", variant));
    const int64_t m = 4, n1 = 2048, k = 6144, n2 = 576;
    const Weight w1 = MakeWeight(type, n1, k, 31), w2 = MakeWeight(type, n2, n1, 32);
    auto p1 = GemvNarrowPlan::Create({m, n1, k, type}, reduce, variant == 3 ? 1 : 0, tuning);
    auto p2 = GemvNarrowPlan::Create({m, n2, n1, type}, reduce, variant == 3 ? 1 : 0, tuning);
    ASSERT_TRUE(p1.ok() && p2.ok());
    Rng rng(9);
    std::vector<float> x(m * k);
    for (float& v : x) v = rng.Uniform();
    GuardedBuffer dx(x.size() * 4), d1(m * n1 * 4), d2(m * n2 * 4);
    ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    auto chain = [&](bool overlap) -> absl::Status {
      for (int i = 0; i < 3; ++i) {
        GLM_RETURN_IF_ERROR(Launch(*p1, w1, dx.as<float>(), k, d1.as<float>(), n1, i > 0,
                                   stream, overlap));
        GLM_RETURN_IF_ERROR(Launch(*p2, w2, d1.as<float>(), n1, d2.as<float>(), n2, i > 0,
                                   stream, overlap));
      }
      return absl::OkStatus();
    };
    std::vector<float> want(m * n2), got(m * n2);
    ASSERT_TRUE(chain(false).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(d2.Download(want.data(), want.size() * 4), cudaSuccess);
    ASSERT_EQ(d2.Poison(0xFF), cudaSuccess);
    ASSERT_TRUE(chain(true).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(d2.Download(got.data(), got.size() * 4), cudaSuccess);
    ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "eager, overlapped";
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const absl::Status st = chain(true);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(d2.Poison(0xFF), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ASSERT_EQ(d2.Download(got.data(), got.size() * 4), cudaSuccess);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "replay " << i;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST_F(GemvNarrowTest, RejectsBadInputs) {
  EXPECT_FALSE(GemvNarrowPlan::Create({17, 64, 128, GemvWeight::kBF16}).ok());
  EXPECT_FALSE(GemvNarrowPlan::Create({1, 64, 24, GemvWeight::kF8E4M3Block128}).ok());
  EXPECT_FALSE(GemvNarrowPlan::Create({1, 0, 128, GemvWeight::kBF16}).ok());
  const Weight w = MakeWeight(GemvWeight::kBF16, 64, 128, 1);
  auto plan = GemvNarrowPlan::Create({1, 64, 128, GemvWeight::kBF16});
  ASSERT_TRUE(plan.ok());
  GuardedBuffer dx(128 * 4), dy(64 * 4);
  GemvNarrowArgs a;
  a.x = dx.as<float>();
  a.ldx = 128;
  a.w = static_cast<const char*>(w.dw->data()) + 2;  // misaligned
  a.ldw = 128;
  a.y = dy.as<float>();
  a.ldy = 64;
  EXPECT_EQ(plan->Run(a, nullptr, 0, counters_->as<int32_t>(), kCounters, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  a.w = w.dw->data();
  a.ldw = 132;  // not a multiple of 8
  EXPECT_EQ(plan->Run(a, nullptr, 0, counters_->as<int32_t>(), kCounters, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  a.ldw = 128;
  a.ldy = 63;
  EXPECT_EQ(plan->Run(a, nullptr, 0, counters_->as<int32_t>(), kCounters, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// The fused RmsNorm (GemvNarrowArgs::norm_w) against RmsNorm into a buffer and then the GEMV on
// it: the normalized rows and y bit for bit, for every split-K reduction and both weight types,
// M 1..16, K of GLM-5's two fused norms (6144: the layer input; 2048: the query latent), the
// largest row RmsNorm's vector kernel takes (8192) and short ones; accumulate on odd cases. The
// gap columns of the normalized rows stay untouched. Rows that kernel does not take are refused.
TEST_F(GemvNarrowTest, FusedRmsNormEqualsRmsNormThenGemv) {
  struct S {
    int64_t m, n, k;
  };
  const S shapes[] = {{1, 2848, 6144}, {1, 20480, 2048}, {2, 2048, 6144}, {8, 2848, 6144},
                      {16, 576, 6144}, {3, 300, 8192},   {1, 130, 16},    {5, 257, 2064}};
  int case_index = 0;
  for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16})
    for (const S& sh : shapes)
      for (GemvSplitReduce reduce :
           {GemvSplitReduce::kGlobal, GemvSplitReduce::kCluster, GemvSplitReduce::kAuto}) {
        const int64_t m = sh.m, n = sh.n, k = sh.k, ldx = k + 4, ldo = k + 8, ldy = n + 3;
        const bool acc = ++case_index % 2 == 1;
        const Weight w = MakeWeight(type, n, k, 40 + case_index);
        auto plan = GemvNarrowPlan::Create({m, n, k, type}, reduce);
        ASSERT_TRUE(plan.ok()) << plan.status();
        SCOPED_TRACE(plan->DebugString());
        Rng rng(70 + case_index);
        std::vector<float> x(m * ldx), nw(k), y0(m * ldy);
        for (int64_t r = 0; r < m; ++r) {
          const float mag = std::exp2(rng.Uniform() * 8.0f - 4.0f);
          for (int64_t c = 0; c < ldx; ++c) x[r * ldx + c] = rng.Uniform() * mag;
        }
        for (float& v : nw) v = 1.0f + 0.5f * rng.Uniform();
        for (float& v : y0) v = rng.Uniform();
        const float eps = 1e-6f;
        GuardedBuffer dx(x.size() * 4), dnw(nw.size() * 4), dref(m * ldo * 4), dnormed(m * ldo * 4),
            dyref(y0.size() * 4), dy(y0.size() * 4);
        ASSERT_EQ(dx.Upload(x.data(), x.size() * 4), cudaSuccess);
        ASSERT_EQ(dnw.Upload(nw.data(), nw.size() * 4), cudaSuccess);
        ASSERT_EQ(dref.Poison(0x7f), cudaSuccess);
        ASSERT_EQ(dnormed.Poison(0x7f), cudaSuccess);
        ASSERT_EQ(dyref.Upload(y0.data(), y0.size() * 4), cudaSuccess);
        ASSERT_EQ(dy.Upload(y0.data(), y0.size() * 4), cudaSuccess);
        ASSERT_GT(
            RmsNormF32VecThreads(k, dx.as<float>(), ldx, dnw.as<float>(), dref.as<float>(), ldo),
            0);
        ASSERT_TRUE(
            RmsNorm(DType::kF32, dx.data(), ldx, dnw.data(), eps, dref.data(), ldo, m, k, nullptr)
                .ok());
        ASSERT_TRUE(Launch(*plan, w, dref.as<float>(), ldo, dyref.as<float>(), ldy, acc).ok());
        // The fused launch, through the same helper's arguments plus the norm.
        if (workspace_bytes_ < plan->workspace_bytes()) {
          workspace_ = std::make_unique<GuardedBuffer>(plan->workspace_bytes());
          workspace_bytes_ = plan->workspace_bytes();
        }
        GemvNarrowArgs a;
        a.x = dx.as<float>();
        a.ldx = ldx;
        a.w = w.dw->data();
        a.ldw = w.ldw;
        a.w_scales = w.ds ? w.ds->as<float>() : nullptr;
        a.w_scale_ld = w.scale_ld;
        a.y = dy.as<float>();
        a.ldy = ldy;
        a.accumulate = acc;
        a.norm_w = dnw.as<float>();
        a.norm_eps = eps;
        a.norm_out = dnormed.as<float>();
        a.norm_out_ld = ldo;
        ASSERT_TRUE(GemvNormFusible(a, m, k));
        ASSERT_TRUE(plan->Run(a, workspace_ ? workspace_->data() : nullptr, workspace_bytes_,
                              counters_->as<int32_t>(), kCounters, nullptr)
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> normed_ref(m * ldo), normed(m * ldo), y_ref(y0.size()), y(y0.size());
        ASSERT_EQ(dref.Download(normed_ref.data(), normed_ref.size() * 4), cudaSuccess);
        ASSERT_EQ(dnormed.Download(normed.data(), normed.size() * 4), cudaSuccess);
        ASSERT_EQ(dyref.Download(y_ref.data(), y_ref.size() * 4), cudaSuccess);
        ASSERT_EQ(dy.Download(y.data(), y.size() * 4), cudaSuccess);
        ASSERT_EQ(std::memcmp(normed.data(), normed_ref.data(), normed.size() * 4), 0)
            << "normalized rows (or their gap columns) differ from RmsNorm's";
        ASSERT_EQ(std::memcmp(y.data(), y_ref.data(), y.size() * 4), 0)
            << "y differs from RmsNorm, then the GEMV";
        EXPECT_TRUE(dnormed.GuardsIntact());
        EXPECT_TRUE(dy.GuardsIntact());
      }
}

TEST_F(GemvNarrowTest, FusedRmsNormRefusesRowsRmsNormsVectorKernelDoesNotTake) {
  GuardedBuffer dx(2 * 8200 * 4), dnw(8200 * 4), dout(2 * 8200 * 4), dy(64 * 4);
  GemvNarrowArgs a;
  a.x = dx.as<float>();
  a.w = dx.data();  // not read: every call below is refused first
  a.y = dy.as<float>();
  a.norm_w = dnw.as<float>();
  a.norm_out = dout.as<float>();
  const auto check = [&](int64_t k, int64_t ldx, int64_t ldo, bool want) {
    a.ldx = ldx;
    a.norm_out_ld = ldo;
    EXPECT_EQ(GemvNormFusible(a, 2, k), want) << "k=" << k << " ldx=" << ldx << " ldo=" << ldo;
  };
  a.ldy = 64;
  check(8192, 8192, 8192, true);
  check(8196, 8196, 8196, false);   // 1025 threads: RmsNorm's two-pass kernel
  check(6142, 6144, 6144, false);   // k % 4 != 0
  check(6144, 6146, 6144, false);   // ldx % 4 != 0
  check(6144, 6144, 6146, false);   // norm_out_ld % 4 != 0
  a.norm_out = dx.as<float>() + 4;  // overlaps x
  check(6144, 6144, 6144, false);
  a.norm_out = dout.as<float>() + 1;  // not 16-byte aligned
  check(6144, 6144, 6144, false);
  a.norm_out = nullptr;
  check(6144, 6144, 6144, false);
  // Run refuses what GemvNormFusible refuses (and never launches).
  auto plan = GemvNarrowPlan::Create({2, 64, 8196, GemvWeight::kBF16});
  ASSERT_TRUE(plan.ok()) << plan.status();
  GuardedBuffer dw(64 * 8200 * 2);
  a.w = dw.data();
  a.ldw = 8200;
  a.ldx = 8196;
  a.norm_out = dout.as<float>();
  a.norm_out_ld = 8196;
  EXPECT_EQ(plan->Run(a, nullptr, 0, counters_->as<int32_t>(), kCounters, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// Planning only (no GPU): GLM-5 shapes on GB10 and H200 limits.
TEST(GemvNarrowPlanTest, FitsSharedMemoryAndCoversK) {
  for (const DeviceLimits& lim : {Gb10Limits(), H200Limits()}) {
    const int64_t budget = std::min<int64_t>(
        lim.smem_optin_per_block,
        std::max<int64_t>(lim.smem_per_sm / 2 - lim.reserved_smem_per_block, 48 * 1024));
    for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16}) {
      for (int64_t m : {1, 8, 16}) {
        for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 6144}, {16384, 2048}, {576, 6144},
                            {6144, 16384}, {154880, 6144}, {1, 16}}) {
          auto t = PlanGemvNarrow({m, n, k, type}, lim);
          ASSERT_TRUE(t.ok()) << t.status();
          const int64_t groups = CeilDiv(k, 128);
          EXPECT_LE(static_cast<int64_t>(t->smem_bytes), budget);
          EXPECT_GE(int64_t{t->splits} * t->groups_per_split, groups);
          EXPECT_LT(int64_t{t->splits - 1} * t->groups_per_split, groups);
          EXPECT_EQ(t->row_blocks, CeilDiv(n, 128));
          EXPECT_EQ(t->partial_bytes,
                    t->splits > 1 ? static_cast<size_t>(t->splits) * m * n * 4 : size_t{0});
          if (m == 1 && type == GemvWeight::kF8E4M3Block128) {
            // The grid fills the device's resident CTAs (2 per SM) without a second wave.
            EXPECT_TRUE(t->splits == 1 || t->row_blocks * t->splits <= 2 * lim.num_sms)
                << n << "x" << k << " " << t->DebugString();
          }
        }
      }
    }
  }
  EXPECT_FALSE(PlanGemvNarrow({17, 64, 128, GemvWeight::kBF16}, H200Limits()).ok());
}

// Planning only (no GPU): the cluster reduction. kAuto keeps the global plan's split count and
// only changes the reduction (when it fits a cluster); kCluster caps the splits to the cluster;
// kGlobal or max_cluster 1 is the plan without options; the smem budget holds throughout.
TEST(GemvNarrowPlanTest, ClusterReduction) {
  for (const DeviceLimits& lim : {Gb10Limits(), H200Limits()}) {
    const int64_t budget = std::min<int64_t>(
        lim.smem_optin_per_block,
        std::max<int64_t>(lim.smem_per_sm / 2 - lim.reserved_smem_per_block, 48 * 1024));
    for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16}) {
      for (int64_t m : {1, 2, 8, 16}) {
        for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 6144}, {16384, 2048}, {576, 6144},
                            {6144, 16384}, {154880, 6144}, {6144, 2048}, {1, 16}}) {
          SCOPED_TRACE(absl::StrCat(n, "x", k, " m=", m));
          auto base = PlanGemvNarrow({m, n, k, type}, lim);
          ASSERT_TRUE(base.ok());
          for (int max_cluster : {1, 8, 16}) {
            auto g = PlanGemvNarrow({m, n, k, type}, lim, {GemvSplitReduce::kGlobal, max_cluster});
            ASSERT_TRUE(g.ok());
            EXPECT_EQ(g->DebugString(), base->DebugString());
            EXPECT_EQ(g->cluster, 1);
            auto a = PlanGemvNarrow({m, n, k, type}, lim, {GemvSplitReduce::kAuto, max_cluster});
            auto c =
                PlanGemvNarrow({m, n, k, type}, lim, {GemvSplitReduce::kCluster, max_cluster});
            ASSERT_TRUE(a.ok() && c.ok());
            for (const GemvNarrowTiling* t : {&*a, &*c}) {
              EXPECT_LE(static_cast<int64_t>(t->smem_bytes), budget);
              const int64_t groups = CeilDiv(k, 128);
              EXPECT_GE(int64_t{t->splits} * t->groups_per_split, groups);
              EXPECT_LT(int64_t{t->splits - 1} * t->groups_per_split, groups);
              if (t->cluster > 1) {
                EXPECT_EQ(t->cluster, t->splits);
                EXPECT_LE(t->cluster, max_cluster);
                EXPECT_EQ(t->partial_bytes, 0u);
                EXPECT_EQ(t->counters, 0);
                EXPECT_GE(t->reduce_offset,
                          static_cast<size_t>(m) * t->x_stride_bytes);
                EXPECT_EQ(t->smem_bytes, t->reduce_offset + static_cast<size_t>(m) * 128 * 4);
              } else {
                EXPECT_EQ(t->DebugString(), base->DebugString());
              }
            }
            const bool fits_smem = base->smem_bytes + static_cast<size_t>(m) * 128 * 4 <=
                                   static_cast<size_t>(budget);
            if (a->cluster > 1) {
              EXPECT_TRUE(a->cluster >= 4 || m >= 8) << a->DebugString();
              if (base->splits > 2 * max_cluster) {
                EXPECT_LE(a->splits, max_cluster);
                EXPECT_LT(a->splits, base->splits);
              } else if (fits_smem) {
                EXPECT_EQ(a->splits, base->splits);
                EXPECT_EQ(a->groups_per_split, base->groups_per_split);
              } else {
                EXPECT_GE(a->splits, base->splits);
              }
            } else if (max_cluster > 1 && base->splits > 1 && base->splits <= max_cluster &&
                       fits_smem && (base->splits >= 4 || m >= 8)) {
              ADD_FAILURE() << "kAuto kept the global reduction where the splits fit a cluster "
                            << base->DebugString();
            }
            if (max_cluster == 1 || base->splits == 1) {
              EXPECT_EQ(c->cluster, 1);
            }
            // One CTA per SM: never more splits than filling every resident slot.
            GemvNarrowOptions one{GemvSplitReduce::kCluster, max_cluster};
            one.ctas_per_sm = 1;
            auto o = PlanGemvNarrow({m, n, k, type}, lim, one);
            ASSERT_TRUE(o.ok());
            EXPECT_LE(o->splits, std::max(c->splits, base->splits));
            EXPECT_LE(static_cast<int64_t>(o->smem_bytes), budget);
            EXPECT_GE(int64_t{o->splits} * o->groups_per_split, CeilDiv(k, 128));
          }
        }
      }
    }
  }
  // GLM-5 q_a at M = 1 on H200 with clusters of 16: the cluster reduction of the same grid.
  auto t = PlanGemvNarrow({1, 2048, 6144, GemvWeight::kF8E4M3Block128}, H200Limits(),
                          {GemvSplitReduce::kAuto, 16});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->cluster, t->splits);
  EXPECT_GT(t->cluster, 1);
  // kv_a 576x6144: the global plan's 48 splits are capped to a cluster of 16.
  for (int64_t m : {1, 16}) {
    auto kv = PlanGemvNarrow({m, 576, 6144, GemvWeight::kF8E4M3Block128}, H200Limits(),
                             {GemvSplitReduce::kAuto, 16});
    ASSERT_TRUE(kv.ok());
    EXPECT_EQ(kv->cluster, 16) << kv->DebugString();
    EXPECT_EQ(kv->splits, 16);
  }
  // q_b 16384x2048 (2 splits): global at m = 1, a cluster of 2 at m = 8.
  auto qb1 = PlanGemvNarrow({1, 16384, 2048, GemvWeight::kF8E4M3Block128}, H200Limits(),
                            {GemvSplitReduce::kAuto, 16});
  auto qb8 = PlanGemvNarrow({8, 16384, 2048, GemvWeight::kF8E4M3Block128}, H200Limits(),
                            {GemvSplitReduce::kAuto, 16});
  ASSERT_TRUE(qb1.ok() && qb8.ok());
  EXPECT_EQ(qb1->splits, 2);
  EXPECT_EQ(qb1->cluster, 1);
  EXPECT_EQ(qb8->cluster, 2);
}

// The latency knobs (GemvNarrowTuning) resolved by the planner: never a different split
// partition, the prefetch window within the steps past the register ring and within half the L2
// over the resident CTAs, explicit values kept.
TEST(GemvNarrowPlanTest, TuningKnobs) {
  const DeviceLimits lim = H200Limits();
  constexpr int64_t kL2 = int64_t{50} << 20;
  for (GemvWeight type : {GemvWeight::kF8E4M3Block128, GemvWeight::kBF16}) {
    const bool fp8 = type == GemvWeight::kF8E4M3Block128;
    for (int64_t m : {1, 2, 8, 9, 16}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 6144}, {16384, 2048}, {576, 6144},
                          {6144, 16384}, {154880, 6144}, {1, 16}, {32, 6144}, {128, 6144}}) {
        SCOPED_TRACE(absl::StrCat(fp8 ? "fp8" : "bf16", " m=", m, " ", n, "x", k));
        GemvNarrowOptions opt;
        opt.l2_bytes = kL2;
        auto a = PlanGemvNarrow({m, n, k, type}, lim, opt);
        opt.tuning = GemvNarrowTuning::Previous();
        auto prev = PlanGemvNarrow({m, n, k, type}, lim, opt);
        opt.tuning = {8, 3, 1};
        auto forced = PlanGemvNarrow({m, n, k, type}, lim, opt);
        opt.tuning = {};
        opt.l2_bytes = 0;
        auto no_l2 = PlanGemvNarrow({m, n, k, type}, lim, opt);
        ASSERT_TRUE(a.ok() && prev.ok() && forced.ok() && no_l2.ok());
        for (const GemvNarrowTiling* t : {&*prev, &*forced, &*no_l2}) {
          EXPECT_EQ(t->splits, a->splits);
          EXPECT_EQ(t->groups_per_split, a->groups_per_split);
          EXPECT_EQ(t->smem_bytes, a->smem_bytes);
        }
        EXPECT_EQ(prev->stage_batch, 1);
        EXPECT_EQ(prev->prefetch_steps, 0);
        EXPECT_FALSE(prev->batched_reduce);
        EXPECT_EQ(forced->stage_batch, 8);
        EXPECT_EQ(forced->prefetch_steps, 3);
        EXPECT_EQ(no_l2->prefetch_steps, 0);
        EXPECT_TRUE(forced->batched_reduce);
        const int64_t items = CeilDiv(m * a->groups_per_split, 8);
        EXPECT_TRUE(a->stage_batch == 1 || a->stage_batch == 8);
        EXPECT_EQ(a->batched_reduce, a->stage_batch == 8);
        if (items <= 1) {
          EXPECT_EQ(a->stage_batch, 1);
        }
        if (items >= 24) {
          EXPECT_EQ(a->stage_batch, 8);
        }
        if (items < 32) {
          EXPECT_EQ(a->prefetch_steps, 0);
        }
        const int64_t steps =
            CeilDiv(std::min<int64_t>(k, int64_t{a->groups_per_split} * 128), fp8 ? 128 : 64);
        const int64_t depth = m > 8 ? 3 : 4;
        EXPECT_GE(a->prefetch_steps, 0);
        EXPECT_LE(a->prefetch_steps, std::max<int64_t>(0, steps - depth));
        const int64_t resident = std::min<int64_t>(a->row_blocks * a->splits, 2 * lim.num_sms);
        EXPECT_LE(a->prefetch_steps * resident * 8 * 16 * 128, kL2 / 2);
      }
    }
  }
  // GLM-5 fp8 on H200: o_proj 6144 x 16384 at M = 1 (26 groups per CTA, 4 items per warp)
  // keeps the previous behaviour; at M = 16 (52 items) 8 items and the L2 window; lm_head at
  // M = 1 (1210 row blocks: several waves) 8 items without prefetch, at M = 8 both.
  GemvNarrowOptions opt;
  opt.l2_bytes = kL2;
  const GemvWeight f8 = GemvWeight::kF8E4M3Block128;
  auto o1 = PlanGemvNarrow({1, 6144, 16384, f8}, lim, opt);
  auto o16 = PlanGemvNarrow({16, 6144, 16384, f8}, lim, opt);
  auto l1 = PlanGemvNarrow({1, 154880, 6144, f8}, lim, opt);
  auto l8 = PlanGemvNarrow({8, 154880, 6144, f8}, lim, opt);
  ASSERT_TRUE(o1.ok() && o16.ok() && l1.ok() && l8.ok());
  EXPECT_EQ(o1->stage_batch, 1) << o1->DebugString();
  EXPECT_EQ(o1->prefetch_steps, 0) << o1->DebugString();
  EXPECT_FALSE(o1->batched_reduce) << o1->DebugString();
  EXPECT_EQ(o16->stage_batch, 8) << o16->DebugString();
  EXPECT_GT(o16->prefetch_steps, 0) << o16->DebugString();
  EXPECT_EQ(l1->stage_batch, 8) << l1->DebugString();
  EXPECT_EQ(l1->prefetch_steps, 0) << l1->DebugString();
  EXPECT_EQ(l8->stage_batch, 8) << l8->DebugString();
  EXPECT_GT(l8->prefetch_steps, 0) << l8->DebugString();
}

}  // namespace
}  // namespace glm::kernels
