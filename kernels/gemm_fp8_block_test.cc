// GemmFp8BlockPlan on the GPU against a host fp64 reference on the dequantized values, for both
// paths (cuBLASLt block scaling where the device and shape allow it, our kernel everywhere):
// M in {1, 7, 64, 300}, N and K including non-multiples of 128 (and odd N), bf16 and fp32 output,
// accumulate on and off, guard bytes around y, poisoned y (every element must be written),
// finite outputs. Plus input checks and the own kernel's launch planning for GB10 and H200.
//
// Reference: x is quantized on the host with QuantizeFp8GroupHost (bit-identical to the device,
// quant_fp8_group_test), ref[m,n] = Σ_b sx[m,b]·sw[n/128,b]·Σ_{k∈b} q[m,k]·w[n,k] in fp64, and
// L1[m,n] = the same sum over |terms|. Tolerance |y - ref| <= r·(|ref| + d) + a·L1 with
//   r = 2^-8 for bf16 output (round-to-nearest of the result), 1e-6 for fp32;
//   d = |x·w| + |y0| when accumulating into bf16 (a library may round twice), else 0;
//   a = 1e-4 for our kernel (fp32 accumulation of exact fp8 products: error <= K·2^-24·L1 and
//       K <= 1040 here), 2e-3 for cuBLASLt (Hopper's FP8 tensor-core accumulation keeps fewer
//       mantissa bits than fp32 inside a 128-block; DeepSeek-V3 report §3.3.2).
// The largest observed error / L1 per path is printed.
#include "kernels/gemm_fp8_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"
#include "kernels/quant_fp8_group.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A weight quantized the way the checkpoints are: per 128x128 block scale = amax / 448.
struct Fp8Weight {
  int64_t n = 0, k = 0, scale_ld = 0;
  std::vector<uint8_t> q;      // [n, k]
  std::vector<float> scales;   // [ceil(n/128), scale_ld]
};

Fp8Weight MakeWeight(int64_t n, int64_t k, int64_t scale_ld, std::mt19937& rng) {
  Fp8Weight w;
  w.n = n;
  w.k = k;
  w.scale_ld = scale_ld;
  w.q.resize(n * k);
  w.scales.assign(CeilDiv(n, 128) * scale_ld, 0.0f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-6.0f, 2.0f);
  std::vector<float> f(n * k);
  for (int64_t nb = 0; nb < CeilDiv(n, 128); ++nb) {
    for (int64_t kb = 0; kb < CeilDiv(k, 128); ++kb) {
      const float block_mag = std::exp2(mag(rng));  // blocks of different magnitudes
      float amax = 0.0f;
      for (int64_t r = nb * 128; r < std::min(n, nb * 128 + 128); ++r) {
        for (int64_t c = kb * 128; c < std::min(k, kb * 128 + 128); ++c) {
          f[r * k + c] = nd(rng) * block_mag;
          amax = std::max(amax, std::fabs(f[r * k + c]));
        }
      }
      const float scale = amax / kE4m3Max;
      w.scales[nb * scale_ld + kb] = scale;
      for (int64_t r = nb * 128; r < std::min(n, nb * 128 + 128); ++r) {
        for (int64_t c = kb * 128; c < std::min(k, kb * 128 + 128); ++c) {
          w.q[r * k + c] = FloatToE4m3Sat(f[r * k + c] / scale);
        }
      }
    }
  }
  return w;
}

// x as bf16 values (per-row magnitudes vary; row 0's first group is all zero when k >= 128).
std::vector<float> MakeX(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-4.0f, 4.0f);
  std::vector<float> x(m * k);
  for (int64_t r = 0; r < m; ++r) {
    const float row_mag = std::exp2(mag(rng));
    for (int64_t c = 0; c < k; ++c) x[r * k + c] = Bf16ToFloat(FloatToBf16(nd(rng) * row_mag));
  }
  if (k >= 128) std::fill(x.begin(), x.begin() + 128, 0.0f);
  if (m > 1) x[k + 5] = 3008.0f;  // one outlier (a bf16 value): its group quantizes coarsely
  return x;
}

struct Reference {
  std::vector<double> y, l1;  // [m, n]
};

Reference ComputeReference(const std::vector<float>& x, int64_t m, int64_t k,
                           const Fp8Weight& w) {
  const int64_t kb_n = CeilDiv(k, 128);
  std::vector<uint8_t> q(m * k);
  std::vector<float> xs(kb_n * m);
  QuantizeFp8GroupHost(x.data(), k, m, k, q.data(), k, xs.data(), m);
  std::vector<double> qd(m * k), wd(w.n * k);
  for (int64_t i = 0; i < m * k; ++i) qd[i] = E4m3ToFloat(q[i]);
  for (int64_t i = 0; i < w.n * k; ++i) wd[i] = E4m3ToFloat(w.q[i]);
  Reference ref;
  ref.y.assign(m * w.n, 0.0);
  ref.l1.assign(m * w.n, 0.0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < w.n; ++c) {
      double sum = 0.0, l1 = 0.0;
      for (int64_t kb = 0; kb < kb_n; ++kb) {
        double dot = 0.0, adot = 0.0;
        for (int64_t i = kb * 128; i < std::min(k, kb * 128 + 128); ++i) {
          const double p = qd[r * k + i] * wd[c * k + i];
          dot += p;
          adot += std::fabs(p);
        }
        const double s = static_cast<double>(xs[kb * m + r]) *
                         static_cast<double>(w.scales[(c / 128) * w.scale_ld + kb]);
        sum += dot * s;
        l1 += adot * std::fabs(s);
      }
      ref.y[r * w.n + c] = sum;
      ref.l1[r * w.n + c] = l1;
    }
  }
  return ref;
}

class GemmFp8BlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_SKIP_WITHOUT_GPU();
    auto h = BlasLtHandle::Create();
    ASSERT_TRUE(h.ok()) << h.status();
    handle_ = std::move(*h);
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, dev);
    if (cc_major_ * 10 + cc_minor_ < 80) {
      GTEST_SKIP() << "the kernel needs compute capability 8.0+; device is " << cc_major_ << "."
                   << cc_minor_;
    }
  }
  std::unique_ptr<BlasLtHandle> handle_;
  int cc_major_ = 0, cc_minor_ = 0;
};

struct ErrStats {
  double max_norm_err = 0;  // max |y - ref| / L1
  int runs = 0;
};

// Runs one plan on (x, w) and checks y. Returns false (with gtest failures) on a mismatch.
void RunAndCheck(const GemmFp8BlockPlan& plan, const std::vector<float>& x, const Fp8Weight& w,
                 const Reference& ref, bool accumulate, ErrStats* stats) {
  const GemmFp8BlockShape& s = plan.shape();
  const bool f32 = s.out == DType::kF32;
  const size_t esz = f32 ? 4 : 2;
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]);
  GuardedBuffer dx(xb.size() * 2), dw(w.q.size()), dws(w.scales.size() * 4),
      dy(static_cast<size_t>(s.m * s.ldy) * esz),
      dwork(std::max<size_t>(plan.workspace_bytes(), 256));
  ASSERT_TRUE(dx.ok() && dw.ok() && dws.ok() && dy.ok() && dwork.ok());
  GLM_CUDA_ASSERT(dx.Upload(xb.data(), xb.size() * 2));
  GLM_CUDA_ASSERT(dw.Upload(w.q.data(), w.q.size()));
  GLM_CUDA_ASSERT(dws.Upload(w.scales.data(), w.scales.size() * 4));
  // y0: poison (0xFF = NaN in bf16 and fp32) without accumulate, small values with it.
  std::vector<float> y0(s.m * s.ldy, 0.0f);
  std::vector<unsigned char> hy(dy.bytes());
  if (accumulate) {
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < s.m * s.ldy; ++i) {
      float v = u(rng);
      if (!f32) v = Bf16ToFloat(FloatToBf16(v));
      y0[i] = v;
      if (f32) {
        std::memcpy(&hy[i * 4], &v, 4);
      } else {
        const uint16_t b = FloatToBf16(v);
        std::memcpy(&hy[i * 2], &b, 2);
      }
    }
    GLM_CUDA_ASSERT(dy.Upload(hy.data(), hy.size()));
  } else {
    GLM_CUDA_ASSERT(dy.Poison(0xFF));
  }
  const absl::Status st = plan.Run(dx.data(), dw.data(), dws.as<float>(), dy.data(), accumulate,
                                   dwork.data(), dwork.bytes(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  GLM_CUDA_ASSERT(cudaDeviceSynchronize());
  GLM_CUDA_ASSERT(dy.Download(hy.data(), hy.size()));
  EXPECT_TRUE(dy.GuardsIntact()) << "write outside y";
  const double r_tol = f32 ? 1e-6 : std::ldexp(1.0, -8);
  const double a_tol = plan.path() == GemmFp8Path::kCublasLt ? 2e-3 : 1e-4;
  int bad = 0;
  for (int64_t r = 0; r < s.m; ++r) {
    for (int64_t c = 0; c < s.ldy; ++c) {
      float got;
      if (f32) {
        std::memcpy(&got, &hy[(r * s.ldy + c) * 4], 4);
      } else {
        uint16_t b;
        std::memcpy(&b, &hy[(r * s.ldy + c) * 2], 2);
        got = Bf16ToFloat(b);
      }
      if (c >= s.n) {  // padding columns of y: untouched
        const bool untouched = accumulate ? got == y0[r * s.ldy + c] : std::isnan(got);
        if (!untouched && bad++ < 5) ADD_FAILURE() << "padding y[" << r << "," << c << "] written";
        continue;
      }
      const double want = (accumulate ? y0[r * s.ldy + c] : 0.0) + ref.y[r * s.n + c];
      const double l1 = ref.l1[r * s.n + c];
      const double err = std::fabs(got - want);
      // bf16 y with accumulate: cuBLASLt may round the product before adding y0 (see
      // gemm_bf16_test), a second rounding of up to 2^-9·(|product| + |y0|).
      const double second_rounding =
          accumulate && !f32 ? std::fabs(ref.y[r * s.n + c]) + std::fabs(y0[r * s.ldy + c]) : 0.0;
      if (!std::isfinite(got) || err > r_tol * (std::fabs(want) + second_rounding) + a_tol * l1) {
        if (bad++ < 5) {
          ADD_FAILURE() << plan.DebugString() << " acc=" << accumulate << " y[" << r << ","
                        << c << "]=" << got << " want " << want << " (L1 " << l1 << ")";
        }
      }
      if (l1 > 0 && std::isfinite(got)) {
        // the output rounding is not the kernel's error: take it out of the statistic
        const double rounding = f32 ? 0.0 : std::ldexp(std::fabs(want), -8);
        stats->max_norm_err = std::max(stats->max_norm_err, std::max(0.0, err - rounding) / l1);
      }
    }
  }
  ++stats->runs;
  EXPECT_EQ(bad, 0) << plan.DebugString();
}

TEST_F(GemmFp8BlockTest, SweepMatchesReference) {
  std::mt19937 rng(11);
  struct NK { int64_t n, k; };
  const NK nks[] = {{16, 16}, {136, 208}, {577, 384}, {256, 1040}};
  ErrStats own_stats, lt_stats;
  int lt_runs_expected = 0;
  for (int64_t m : {1, 7, 64, 300}) {
    for (const NK& nk : nks) {
      const int64_t l4 = CeilDiv(CeilDiv(nk.k, 128), 4) * 4;
      const Fp8Weight w = MakeWeight(nk.n, nk.k, l4, rng);
      const std::vector<float> x = MakeX(m, nk.k, rng);
      const Reference ref = ComputeReference(x, m, nk.k, w);
      for (DType out : {DType::kBF16, DType::kF32}) {
        for (GemmFp8Path path : {GemmFp8Path::kOwnKernel, GemmFp8Path::kCublasLt}) {
          GemmFp8BlockShape shape;
          shape.m = m;
          shape.n = nk.n;
          shape.k = nk.k;
          shape.w_scale_ld = l4;
          shape.out = out;
          shape.ldy = nk.n + (nk.n % 2 == 1 ? 3 : 0);  // odd N: padded y rows (pad untouched)
          SCOPED_TRACE(absl::StrCat(shape.DebugString(), " path=", GemmFp8PathName(path)));
          auto plan = GemmFp8BlockPlan::Create(*handle_, shape, path);
          const bool lt_applies = cc_major_ == 9 && cc_minor_ == 0 && m % 4 == 0 &&
                                  nk.n % 4 == 0;
          if (path == GemmFp8Path::kCublasLt && !lt_applies) {
            ASSERT_FALSE(plan.ok()) << "cuBLASLt path accepted a shape it cannot take";
            EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
            continue;
          }
          if (path == GemmFp8Path::kCublasLt && !plan.ok()) {
            // The documented rules hold but the heuristic may still decline a shape; that is
            // allowed only for K not a multiple of 128 (partial K blocks), and is reported.
            std::printf("cuBLASLt declined %s: %s\n", shape.DebugString().c_str(),
                        std::string(plan.status().message()).c_str());
            EXPECT_NE(nk.k % 128, 0) << plan.status();
            continue;
          }
          ASSERT_TRUE(plan.ok()) << plan.status();
          if (path == GemmFp8Path::kCublasLt) ++lt_runs_expected;
          for (bool acc : {false, true}) {
            RunAndCheck(**plan, x, w, ref, acc,
                        path == GemmFp8Path::kCublasLt ? &lt_stats : &own_stats);
          }
        }
      }
    }
  }
  std::printf("own kernel: %d runs, max |err|/L1 = %.3g\n", own_stats.runs,
              own_stats.max_norm_err);
  std::printf("cuBLASLt:   %d runs, max |err|/L1 = %.3g (device %d.%d)\n", lt_stats.runs,
              lt_stats.max_norm_err, cc_major_, cc_minor_);
  EXPECT_EQ(lt_stats.runs, 2 * lt_runs_expected);
}

TEST_F(GemmFp8BlockTest, AutoPicksCublasLtOnlyWhereItApplies) {
  GemmFp8BlockShape shape;
  shape.m = 64;
  shape.n = 256;
  shape.k = 512;
  auto plan = GemmFp8BlockPlan::Create(*handle_, shape);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const bool hopper = cc_major_ == 9 && cc_minor_ == 0;
  std::printf("auto for %s on %d.%d: %s\n", shape.DebugString().c_str(), cc_major_, cc_minor_,
              (*plan)->DebugString().c_str());
  EXPECT_EQ((*plan)->path(), hopper ? GemmFp8Path::kCublasLt : GemmFp8Path::kOwnKernel);
  shape.m = 1;  // M % 4 != 0: always ours
  plan = GemmFp8BlockPlan::Create(*handle_, shape);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ((*plan)->path(), GemmFp8Path::kOwnKernel);
}

TEST_F(GemmFp8BlockTest, UnpaddedScaleStrideUsesOwnKernel) {
  // K = 640: 5 K blocks; the checkpoint's [ceil(N/128), 5] scales are not the stride-8 layout
  // cuBLASLt reads, so kAuto must fall back and the result must still match.
  std::mt19937 rng(5);
  const Fp8Weight w = MakeWeight(200, 640, 5, rng);
  const std::vector<float> x = MakeX(64, 640, rng);
  const Reference ref = ComputeReference(x, 64, 640, w);
  GemmFp8BlockShape shape;
  shape.m = 64;
  shape.n = 200;
  shape.k = 640;
  shape.w_scale_ld = 5;
  auto plan = GemmFp8BlockPlan::Create(*handle_, shape);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ((*plan)->path(), GemmFp8Path::kOwnKernel);
  ErrStats stats;
  RunAndCheck(**plan, x, w, ref, false, &stats);
  auto lt = GemmFp8BlockPlan::Create(*handle_, shape, GemmFp8Path::kCublasLt);
  ASSERT_FALSE(lt.ok());
  EXPECT_NE(lt.status().message().find("w_scale_ld"), std::string::npos) << lt.status();
}

TEST_F(GemmFp8BlockTest, EmptyMIsNoOp) {
  GemmFp8BlockShape shape;
  shape.m = 0;
  shape.n = 128;
  shape.k = 128;
  auto plan = GemmFp8BlockPlan::Create(*handle_, shape);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE((*plan)->Run(nullptr, nullptr, nullptr, nullptr, false, nullptr, 0, nullptr).ok());
}

TEST_F(GemmFp8BlockTest, RejectsBadShapesAndArguments) {
  GemmFp8BlockShape shape;
  shape.m = 4;
  shape.n = 128;
  shape.k = 200;  // not a multiple of 16
  auto plan = GemmFp8BlockPlan::Create(*handle_, shape);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("multiple of 16"), std::string::npos);
  shape.k = 256;
  shape.w_scale_ld = 1;  // < ceil(256/128)
  EXPECT_EQ(GemmFp8BlockPlan::Create(*handle_, shape).status().code(),
            absl::StatusCode::kInvalidArgument);
  shape.w_scale_ld = 0;
  shape.ldx = 100;  // < k
  EXPECT_EQ(GemmFp8BlockPlan::Create(*handle_, shape).status().code(),
            absl::StatusCode::kInvalidArgument);
  shape.ldx = 0;
  plan = GemmFp8BlockPlan::Create(*handle_, shape, GemmFp8Path::kOwnKernel);
  ASSERT_TRUE(plan.ok()) << plan.status();
  GuardedBuffer buf(1 << 20);
  ASSERT_TRUE(buf.ok());
  char* p = static_cast<char*>(buf.data());
  // misaligned w
  absl::Status st = (*plan)->Run(p, p + 1, reinterpret_cast<float*>(p), p, false, p,
                                 (*plan)->workspace_bytes(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // workspace too small
  st = (*plan)->Run(p, p, reinterpret_cast<float*>(p), p, false, p, 1, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("workspace"), std::string::npos) << st;
}

// Launch planning is a pure function of the shape and the device limits.
TEST(GemmFp8OwnTilingTest, SplitsKToFillOneWave) {
  for (const DeviceLimits& lim : {Gb10Limits(), H200Limits()}) {
    // decode: q_a / expert gate-up (N=2048, K=6144) at M=1 -> 16 CTAs before splitting
    GemmFp8OwnTiling t = PlanGemmFp8Own(1, 2048, 6144, lim);
    EXPECT_EQ(t.m_tiles_per_warp, 1);
    EXPECT_GT(t.splits, 1);
    EXPECT_LE(t.splits * t.kblocks_per_split, 48 + t.kblocks_per_split - 1);
    EXPECT_GE(t.splits * t.kblocks_per_split, 48);
    EXPECT_GE(16 * t.splits, 2 * lim.num_sms) << lim.DebugString();
    EXPECT_LE(16 * t.splits, 4 * lim.num_sms) << "more than one wave of 4 CTAs per SM";
    DeviceLimits two_per_sm = lim;  // an occupancy of 2 CTAs per SM halves the wave
    two_per_sm.max_blocks_per_sm_cap = 2;
    EXPECT_LE(16 * PlanGemmFp8Own(1, 2048, 6144, two_per_sm).splits, 2 * lim.num_sms);
    // prefill: enough CTAs without splitting
    t = PlanGemmFp8Own(4096, 6144, 6144, lim);
    EXPECT_EQ(t.m_tiles_per_warp, 2);
    EXPECT_EQ(t.splits, 1);
    EXPECT_EQ(t.kblocks_per_split, 48);
    // K of one block: never split
    t = PlanGemmFp8Own(1, 128, 16, lim);
    EXPECT_EQ(t.splits, 1);
  }
}

}  // namespace
}  // namespace glm::kernels
