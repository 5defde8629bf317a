// The FP4-activation nvfp4 GEMV (GemvQuantPlan with LinearPolicy::Nvfp4Path::kFp4Mma,
// gemv_quant_fp4.h) on the GPU against GemvQuantFp4Host, on a compute capability 12.0 / 12.1
// device with this build's sm_120a / sm_121a code. Elsewhere it checks that Create refuses the
// path with a FailedPrecondition naming the op and the device's capability, and skips the sweep.
// Tolerance: the kernel and the reference multiply the same exact products (both quantize x with
// the same scalar rules); the host sums in double, the tensor cores in fp32 (order unspecified),
// then the split-K adds, so |y - ref| <= 2e-5 * L1 + 1e-6 * |y0| with L1 = global_scale * Σ |xq
// wq| (as gemv_quant_test). The largest |y - ref| / L1 seen is printed.
// Sweep: m 1/2/8/9/16, n 1/37/200/576, k 32/64/96/160/1024/4128 (partial windows and chunks),
// accumulate on/off, strided y with guard bytes and untouched gap columns, forced splits (a small
// SM count), repeated launches bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gemv_quant.h"
#include "kernels/gemv_quant_fp4.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;
using Rng = testing::XorShiftRng;

KernelPolicy Fp4Policy(int max_sms = 0) {
  KernelPolicy p;
  p.linear.nvfp4_path = LinearPolicy::Nvfp4Path::kFp4Mma;
  p.max_sms = max_sms;
  return p;
}

QuantWeightView Nvfp4Shape(int64_t n, int64_t k, int64_t pad_bytes = 0) {
  QuantWeightView v;
  v.format = QuantFormat::kNvfp4;
  v.rows = n;
  v.cols = k;
  v.group_size = 16;
  v.ld_bytes = k / 2 + pad_bytes;
  v.scale_ld = k / 16 + 3;
  v.global_scale = 0.3712f;
  return v;
}

int DeviceCapability() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return 0;
  }
  return 10 * major + minor;
}

class GemvQuantFp4MmaTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

// Off cc 12.x, or without the arch-specific code, the path is refused at Create with the op,
// the capability and the fix; a non-nvfp4 weight is an InvalidArgument everywhere.
TEST_F(GemvQuantFp4MmaTest, CreateRefusesWhereThereIsNoPath) {
  const int cc = DeviceCapability();
  auto plan = GemvQuantPlan::Create(1, Nvfp4Shape(256, 512), Fp4Policy());
  if (cc / 10 != 12) {
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(plan.status().message().find("GemvQuant"), std::string::npos) << plan.status();
    EXPECT_NE(plan.status().message().find(absl::StrCat("this device is ", cc / 10, ".", cc % 10)),
              std::string::npos)
        << plan.status();
  } else if (!plan.ok()) {
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(plan.status().message().find(absl::StrCat(cc, "a")), std::string::npos)
        << plan.status();
    std::printf("cc %d.%d: this build has no sm_%da code; the FP4 sweep will skip\n", cc / 10,
                cc % 10, cc);
  } else {
    EXPECT_TRUE(plan->tiling().fp4_mma) << plan->DebugString();
  }
  QuantWeightView int4 = Nvfp4Shape(256, 512);
  int4.format = QuantFormat::kInt4;
  int4.group_size = 128;
  int4.ld_bytes = 256;
  int4.scale_ld = 4;
  const auto bad = GemvQuantPlan::Create(1, int4, Fp4Policy());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  // The default policy keeps the weight-only path on every device.
  auto widen = GemvQuantPlan::Create(1, Nvfp4Shape(256, 512));
  ASSERT_TRUE(widen.ok()) << widen.status();
  EXPECT_FALSE(widen->tiling().fp4_mma);
}

struct Case {
  int64_t m, n, k;
  bool accumulate;
  int max_sms;
};

double g_max_err_ratio = 0.0;

void RunCase(const Case& c) {
  SCOPED_TRACE(absl::StrCat("m=", c.m, " n=", c.n, " k=", c.k, c.accumulate ? " acc" : "",
                            " max_sms=", c.max_sms));
  Rng rng(c.m * 131 + c.n * 7 + c.k);
  QuantWeightView w = Nvfp4Shape(c.n, c.k, c.n % 2 ? 16 : 0);
  std::vector<uint8_t> data(static_cast<size_t>(c.n * w.ld_bytes));
  std::vector<uint8_t> scales(static_cast<size_t>(c.n * w.scale_ld));
  for (auto& b : data) b = static_cast<uint8_t>(rng.Next());
  // ue4m3 scales (bit 7 clear), around 2^-4 .. 2^3 so no product is tiny.
  for (auto& b : scales) b = static_cast<uint8_t>(0x18 + rng.Next() % 0x38);
  const int64_t ldx = c.k + 3, ldy = c.n + 5;
  std::vector<float> x(static_cast<size_t>(c.m * ldx));
  for (auto& v : x) v = rng.Uniform() * 4.0f;
  // Some blocks of zeros and one of very large values (scale saturation) in token 0.
  for (int64_t kk = 0; kk < std::min<int64_t>(16, c.k); ++kk) x[kk] = 0.0f;
  if (c.k >= 64) {
    for (int64_t kk = 32; kk < 48; ++kk) x[kk] = 3000.0f * rng.Uniform();
  }
  std::vector<float> y0(static_cast<size_t>(c.m * ldy));
  for (auto& v : y0) v = rng.Uniform();
  std::vector<float> ref = y0;
  ASSERT_TRUE(GemvQuantFp4Host(c.m, x.data(), ldx, data.data(), w.ld_bytes, scales.data(),
                               w.scale_ld, w.global_scale, c.n, c.k, ref.data(), ldy, c.accumulate)
                  .ok());
  // L1 = global_scale * Σ |xq wq| per output, from the reference with |x| and |w| codes.
  std::vector<float> l1(static_cast<size_t>(c.m * ldy), 0.0f);
  {
    std::vector<float> xa(x.size());
    for (size_t i = 0; i < x.size(); ++i) xa[i] = std::fabs(x[i]);
    std::vector<uint8_t> da(data.size());
    for (size_t i = 0; i < data.size(); ++i) da[i] = data[i] & 0x77;  // sign bits cleared
    ASSERT_TRUE(GemvQuantFp4Host(c.m, xa.data(), ldx, da.data(), w.ld_bytes, scales.data(),
                                 w.scale_ld, w.global_scale, c.n, c.k, l1.data(), ldy, false)
                    .ok());
  }
  auto plan = GemvQuantPlan::Create(c.m, w, Fp4Policy(c.max_sms));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->tiling().fp4_mma);
  GuardedBuffer dd(data.size()), ds(scales.size()), dx(x.size() * 4), dy(y0.size() * 4);
  GuardedBuffer ws(std::max<size_t>(plan->workspace_bytes(), 16));
  GuardedBuffer cnt(std::max<size_t>(plan->num_counters(), 1) * 4);
  ASSERT_TRUE(dd.ok() && ds.ok() && dx.ok() && dy.ok() && ws.ok() && cnt.ok());
  GLM_CUDA_ASSERT(dd.Upload(data.data(), data.size()));
  GLM_CUDA_ASSERT(ds.Upload(scales.data(), scales.size()));
  GLM_CUDA_ASSERT(dx.Upload(x.data(), x.size() * 4));
  GLM_CUDA_ASSERT(dy.Upload(y0.data(), y0.size() * 4));
  GLM_CUDA_ASSERT(cudaMemset(cnt.data(), 0, cnt.bytes()));
  GemvQuantArgs a;
  a.x = dx.as<float>();
  a.ldx = ldx;
  a.w = w;
  a.w.data = dd.data();
  a.w.scales = ds.data();
  a.y = dy.as<float>();
  a.ldy = ldy;
  a.accumulate = c.accumulate;
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    GLM_CUDA_ASSERT(dy.Upload(y0.data(), y0.size() * 4));
    ASSERT_TRUE(
        plan->Run(a, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> y(y0.size());
    GLM_CUDA_ASSERT(dy.Download(y.data(), y.size() * 4));
    EXPECT_TRUE(dy.GuardsIntact() && dd.GuardsIntact() && ds.GuardsIntact());
    if (rep == 1) {
      ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * 4)) << "not deterministic";
      break;
    }
    int bad = 0;
    for (int64_t tok = 0; tok < c.m; ++tok) {
      for (int64_t r = 0; r < ldy; ++r) {
        const size_t i = static_cast<size_t>(tok * ldy + r);
        if (r >= c.n) {
          ASSERT_EQ(y[i], y0[i]) << "gap column " << r << " of token " << tok << " written";
          continue;
        }
        ASSERT_TRUE(std::isfinite(y[i])) << tok << " " << r;
        const double err = std::fabs(static_cast<double>(y[i]) - ref[i]);
        if (!c.accumulate && l1[i] > 0) g_max_err_ratio = std::max(g_max_err_ratio, err / l1[i]);
        const double tol = 2e-5 * l1[i] + 1e-6 * std::fabs(y0[i]) + 1e-30;
        if (!(err <= tol) && bad++ < 5) {
          ADD_FAILURE() << "token " << tok << " row " << r << ": gpu " << y[i] << " host " << ref[i]
                        << " tol " << tol;
        }
      }
    }
    first = y;
  }
  std::vector<int32_t> counters(std::max<size_t>(plan->num_counters(), 1));
  GLM_CUDA_ASSERT(cnt.Download(counters.data(), counters.size() * 4));
  for (int32_t v : counters) EXPECT_EQ(v, 0) << "counters not left zero";
}

TEST_F(GemvQuantFp4MmaTest, SweepAgainstHostReference) {
  if (!GemvQuantPlan::Create(1, Nvfp4Shape(128, 128), Fp4Policy()).ok()) {
    GTEST_SKIP() << "no FP4 tensor-core path on this device / build (compute capability "
                 << DeviceCapability() / 10 << "." << DeviceCapability() % 10 << ")";
  }
  for (int64_t m : {1, 2, 8, 9, 16}) {
    for (int64_t n : {1, 37, 200, 576}) {
      for (int64_t k : {32, 64, 96, 160, 1024, 4128}) {
        RunCase({m, n, k, (m + n) % 2 == 1, 0});
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  // Forced K splits (few SMs: the grid fills them with splits) and the deterministic reduce.
  for (int64_t m : {1, 16}) {
    RunCase({m, 200, 6144, false, 2});
    RunCase({m, 576, 2048, true, 1});
  }
  std::printf("largest |y - ref| / L1: %.3g\n", g_max_err_ratio);
}

}  // namespace
}  // namespace glm::kernels
