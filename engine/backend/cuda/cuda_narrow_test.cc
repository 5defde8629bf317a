// bf16 and fp8 block-scaled weights on the CUDA backend (backend.h WeightDType) against the CPU
// backend on the dequantized weights: Linear (cuda_linear.h) and MoeExperts (widened tiles).
// The CPU reference gets the inputs the GPU path actually multiplies: for Linear, x rounded to
// bf16 (bf16 weights) or rounded to bf16 and quantized per row per 128 columns to e4m3
// (QuantizeFp8GroupHost, the bit-exact mirror of the device quantizer) and dequantized again
// (fp8 weights); MoeExperts keeps x in fp32. So the tolerances are accumulation-order ones.
// Guards around every output, non-finite checks, staging for unaligned outputs, accumulate.
// GPU tests skip (printing why) without a usable GPU; the dtype-support test runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/narrow_test_util.h"
#include "kernels/quant_fp8_group.h"

namespace glm::engine {
namespace {

using narrow_test::kGuard;
using narrow_test::kGuardValue;
using narrow_test::MakeNarrowExperts;
using narrow_test::MakeNarrowWeight;
using narrow_test::NarrowExperts;
using narrow_test::NarrowWeight;
using narrow_test::Random;
using narrow_test::RoundBf16;

// fp32 buffer with guards on both ends, host and device copies of the payload.
class Guarded {
 public:
  Guarded(Backend& gpu, const std::vector<float>& payload) : gpu_(&gpu), n_(payload.size()) {
    host_.assign(n_ + 2 * kGuard, kGuardValue);
    std::copy(payload.begin(), payload.end(), host_.begin() + kGuard);
    dev_ = gpu.Allocate(host_.size() * 4);
    gpu.CopyToDevice(dev_->data(), host_.data(), host_.size() * 4);
  }
  float* h() { return host_.data() + kGuard; }
  float* d() { return dev_->f32() + kGuard; }
  // max |gpu - host| <= tol * max(1, max |host|); guards intact; finite.
  void Expect(double tol, const std::string& what) {
    std::vector<float> got(host_.size());
    gpu_->CopyToHost(got.data(), dev_->data(), got.size() * 4);
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    double max_ref = 1.0, max_diff = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (i < kGuard || i >= kGuard + n_) {
        ASSERT_EQ(got[i], kGuardValue) << what << ": wrote outside the buffer at " << i;
        continue;
      }
      ASSERT_TRUE(std::isfinite(got[i])) << what << ": non-finite at " << i - kGuard;
      max_ref = std::max(max_ref, std::abs(double(host_[i])));
      max_diff = std::max(max_diff, std::abs(double(got[i]) - host_[i]));
    }
    EXPECT_LE(max_diff, tol * max_ref) << what << " max_diff=" << max_diff;
    std::printf("[%s] max |gpu - cpu| = %.3g (max |ref| %.3g)\n", what.c_str(), max_diff,
                max_ref);
  }

 private:
  Backend* gpu_;
  size_t n_;
  std::vector<float> host_;
  std::unique_ptr<Buffer> dev_;
};

TEST(NarrowWeightsTest, DTypeSupport) {
  CpuBackend cpu(1);
  EXPECT_TRUE(cpu.SupportsWeightDType(WeightDType::kF32));
  // The cpu backend runs narrow weights too (cpu_narrow.h, the same numerics).
  EXPECT_TRUE(cpu.SupportsWeightDType(WeightDType::kBF16));
  EXPECT_TRUE(cpu.SupportsWeightDType(WeightDType::kF8E4M3Block128));
  if (CudaDeviceAvailable().ok()) {
    auto gpu = CreateCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_TRUE((*gpu)->SupportsWeightDType(WeightDType::kBF16));
    EXPECT_TRUE((*gpu)->SupportsWeightDType(WeightDType::kF8E4M3Block128));
  }
}

class CudaNarrowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << avail.message();
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<CpuBackend>(4);
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
    }
  }
  // x as the GPU path multiplies it (see the file comment).
  static std::vector<float> EffectiveX(WeightDType dtype, const std::vector<float>& x, int64_t m,
                                       int64_t k, int64_t ldx) {
    std::vector<float> xb(m * k);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < k; ++c) xb[r * k + c] = RoundBf16(x[r * ldx + c]);
    }
    if (dtype == WeightDType::kBF16) return xb;
    const int64_t groups = (k + 127) / 128;
    std::vector<uint8_t> q(m * k);
    std::vector<float> s(groups * m);
    kernels::QuantizeFp8GroupHost(xb.data(), k, m, k, q.data(), k, s.data(), m);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        xb[r * k + c] = kernels::E4m3ToFloat(q[r * k + c]) * s[(c / 128) * m + r];
      }
    }
    return xb;
  }

  void CheckLinear(WeightDType dtype, int64_t m, int64_t n, int64_t k, int64_t y_off, bool acc,
                   double tol) {
    const std::string what =
        absl::StrCat(dtype == WeightDType::kBF16 ? "bf16" : "fp8", " Linear m=", m, " n=", n,
                     " k=", k, " y_off=", y_off, " acc=", acc);
    NarrowWeight w = MakeNarrowWeight(*gpu_, dtype, n, k, rng_);
    const int64_t ldx = k + 3, ldy = n + y_off + 1;
    std::vector<float> x = Random(m * ldx, rng_);
    Guarded dx(*gpu_, x);
    Guarded y(*gpu_, Random(m * ldy, rng_));
    const std::vector<float> xe = EffectiveX(dtype, x, m, k, ldx);
    cpu_->Linear(MatView{const_cast<float*>(xe.data()), m, k, k},
                 MatView{w.deq.data(), n, k, k}, MatView{y.h() + y_off, m, n, ldy}, acc);
    gpu_->Linear(MatView{dx.d(), m, k, ldx}, w.view, MatView{y.d() + y_off, m, n, ldy}, acc);
    y.Expect(tol, what);
    dx.Expect(0, what + " (x untouched)");
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<CpuBackend> cpu_;
  std::mt19937 rng_{7};
};

TEST_F(CudaNarrowTest, LinearBf16MatchesCpuOnDequantizedWeights) {
  struct S { int64_t m, n, k, y_off; bool acc; };
  const S shapes[] = {{1, 1, 8, 0, false},     {3, 5, 40, 1, true},     {17, 33, 160, 0, true},
                      {64, 257, 96, 3, false},  {129, 300, 1000, 0, false}, {7, 129, 13, 1, true},
                      {1, 4096, 512, 0, false}, {300, 1024, 1536, 0, true}};
  for (const S& s : shapes) CheckLinear(WeightDType::kBF16, s.m, s.n, s.k, s.y_off, s.acc, 5e-5);
}

TEST_F(CudaNarrowTest, LinearFp8MatchesCpuOnDequantizedWeights) {
  struct S { int64_t m, n, k, y_off; bool acc; };
  const S shapes[] = {{1, 1, 16, 0, false},    {2, 7, 160, 1, true},     {17, 130, 256, 0, false},
                      {64, 300, 1024, 0, true}, {5, 257, 528, 2, false},  {1, 4096, 512, 0, false},
                      {256, 512, 2048, 0, false}};
  for (const S& s : shapes) CheckLinear(WeightDType::kF8E4M3Block128, s.m, s.n, s.k, s.y_off,
                                        s.acc, 1e-4);
}

// Backend::RmsNormLinear on the CUDA backend against its own RmsNorm then Linear: y and the
// normalized rows bit for bit, whether the call ran as one fused launch (decode sizes whose rows
// RmsNorm's vector kernel takes: narrow weights on the decode GEMV, fp32 weights of one row on
// kernels::PerHeadGemv; LastCudaNormLinearFused) or as the two ops (too many rows, unaligned or
// long rows, fp32 weights of two rows); accumulate on odd cases.
TEST_F(CudaNarrowTest, RmsNormLinearEqualsRmsNormThenLinear) {
  struct S {
    WeightDType dtype;
    int64_t m, n, k, ldx;
    bool fused;
  };
  const S cases[] = {
      {WeightDType::kF8E4M3Block128, 1, 2848, 6144, 6144, true},
      {WeightDType::kF8E4M3Block128, 1, 20480, 2048, 2048 + 8, true},
      {WeightDType::kF8E4M3Block128, 8, 576, 6144, 6144, true},
      {WeightDType::kF8E4M3Block128, 16, 300, 2048, 2048, true},
      {WeightDType::kBF16, 2, 1000, 6144, 6144, true},
      {WeightDType::kF8E4M3Block128, 64, 256, 2048, 2048, false},  // past the GEMV's 16 rows
      {WeightDType::kF8E4M3Block128, 1, 64, 8320, 8320, false},    // longer than 8192
      {WeightDType::kF8E4M3Block128, 1, 64, 6144, 6145, false},    // rows not 16-byte aligned
      {WeightDType::kBF16, 1, 64, 6146, 6146, false},              // k % 4 != 0
      {WeightDType::kF32, 1, 256, 6144, 6144, true},  // the router: kernels::PerHeadGemv
      {WeightDType::kF32, 1, 256, 6144, 6148, true},
      {WeightDType::kF32, 2, 256, 6144, 6144, false},  // cuBLASLt: not fused
      {WeightDType::kF32, 1, 64, 6146, 6146, false},   // k % 4 != 0
  };
  int index = 0;
  for (const S& c : cases) {
    for (int repeat = 0; repeat < 2; ++repeat) {  // without and with accumulation
      const bool acc = ++index % 2 == 1;
      const std::string what = absl::StrCat(narrow_test::DTypeName(c.dtype), " m=", c.m,
                                            " n=", c.n, " k=", c.k, " ldx=", c.ldx, " acc=", acc);
      SCOPED_TRACE(what);
      NarrowWeight w = MakeNarrowWeight(*gpu_, c.dtype, c.n, c.k, rng_);
      const std::vector<float> x = Random(c.m * c.ldx, rng_, 3.0f);
      std::vector<float> nw = Random(c.k, rng_, 0.3f);
      for (float& v : nw) v += 1.0f;
      const std::vector<float> y0 = Random(c.m * c.n, rng_);
      auto dx = gpu_->Allocate(x.size() * 4), dnw = gpu_->Allocate(nw.size() * 4);
      auto d1 = gpu_->Allocate(c.m * c.k * 4), d2 = gpu_->Allocate(c.m * c.k * 4);
      auto y1 = gpu_->Allocate(y0.size() * 4), y2 = gpu_->Allocate(y0.size() * 4);
      gpu_->CopyToDevice(dx->data(), x.data(), x.size() * 4);
      gpu_->CopyToDevice(dnw->data(), nw.data(), nw.size() * 4);
      gpu_->CopyToDevice(y1->data(), y0.data(), y0.size() * 4);
      gpu_->CopyToDevice(y2->data(), y0.data(), y0.size() * 4);
      const MatView xv{dx->f32(), c.m, c.k, c.ldx};
      const MatView n1{d1->f32(), c.m, c.k, c.k}, n2{d2->f32(), c.m, c.k, c.k};
      const float eps = 1e-5f;
      gpu_->RmsNormLinear(xv, dnw->f32(), eps, n1, w.view, {y1->f32(), c.m, c.n, c.n}, acc);
      EXPECT_EQ(LastCudaNormLinearFused(), c.fused);
      gpu_->RmsNorm(xv, dnw->f32(), eps, n2);
      gpu_->Linear(n2, w.view, {y2->f32(), c.m, c.n, c.n}, acc);
      std::vector<float> h1(c.m * c.k), h2(c.m * c.k), g1(y0.size()), g2(y0.size());
      gpu_->CopyToHost(h1.data(), d1->data(), h1.size() * 4);
      gpu_->CopyToHost(h2.data(), d2->data(), h2.size() * 4);
      gpu_->CopyToHost(g1.data(), y1->data(), g1.size() * 4);
      gpu_->CopyToHost(g2.data(), y2->data(), g2.size() * 4);
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      EXPECT_EQ(std::memcmp(h1.data(), h2.data(), h1.size() * 4), 0) << "normalized rows differ";
      EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * 4), 0) << "y differs";
      for (float v : g1) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

TEST_F(CudaNarrowTest, MoeExpertsNarrowMatchCpuOnDequantizedWeights) {
  struct S { int tokens, hidden, inter, experts, top_k; };
  // kAuto (kernels/moe.h): pairs <= 64 with 16-byte rows take the decode kernels (fp8) or the
  // token-group kernels (bf16), 70 x 4 pairs the token-group kernels: batch 1 / 3 / 8 at top_k 8
  // over 256 experts, a hidden with a partial 128-column scale block, every expert in every
  // token (8 rows per expert: two token groups); hidden 132 (bf16: rows not 16-byte multiples)
  // takes the tiled GEMM.
  const S shapes[] = {{1, 160, 48, 8, 2},     {5, 160, 48, 8, 2},      {70, 256, 384, 16, 4},
                      {3, 132, 260, 4, 4},    {1, 256, 128, 256, 8},   {3, 256, 128, 256, 8},
                      {8, 256, 128, 256, 8},  {3, 2064, 272, 16, 8},   {8, 256, 144, 8, 8}};
  for (WeightDType dtype : {WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    for (const S& s : shapes) {
      if (dtype == WeightDType::kF8E4M3Block128 && (s.hidden % 16 || s.inter % 16)) continue;
      const std::string what = absl::StrCat(dtype == WeightDType::kBF16 ? "bf16" : "fp8",
                                            " MoeExperts tokens=", s.tokens, " hidden=", s.hidden,
                                            " inter=", s.inter, " experts=", s.experts);
      NarrowExperts ex = MakeNarrowExperts(*gpu_, dtype, s.experts, s.inter, s.hidden, rng_);
      std::vector<int32_t> ids;
      for (int t = 0; t < s.tokens; ++t) {
        std::vector<int32_t> perm(s.experts);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng_);
        ids.insert(ids.end(), perm.begin(), perm.begin() + s.top_k);
      }
      std::vector<float> wts(s.tokens * s.top_k);
      std::uniform_real_distribution<float> ud(0.f, 1.f);
      for (float& v : wts) v = ud(rng_);
      Guarded x(*gpu_, Random(size_t(s.tokens) * s.hidden, rng_));
      Guarded out(*gpu_, Random(size_t(s.tokens) * s.hidden, rng_));
      auto dids = gpu_->Allocate(ids.size() * 4);
      gpu_->CopyToDevice(dids->data(), ids.data(), ids.size() * 4);
      auto dw = gpu_->Allocate(wts.size() * 4);
      gpu_->CopyToDevice(dw->data(), wts.data(), wts.size() * 4);
      cpu_->MoeExperts(MatView{x.h(), s.tokens, s.hidden, s.hidden}, ids.data(), wts.data(),
                       s.top_k, ex.Host(),
                       MatView{out.h(), s.tokens, s.hidden, s.hidden});
      gpu_->MoeExperts(MatView{x.d(), s.tokens, s.hidden, s.hidden}, dids->i32(), dw->f32(),
                       s.top_k, ex.Device(),
                       MatView{out.d(), s.tokens, s.hidden, s.hidden});
      out.Expect(1e-4, what);
    }
  }
}

}  // namespace
}  // namespace glm::engine
