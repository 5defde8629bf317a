// RmsNorm on the GPU against an fp64 CPU reference: fp32 and bf16, rows 1..many, widths 1, non-
// multiples of the 256-thread tile, GLM-5's 6144, large; padded strides, in place, guard bytes,
// finite outputs. Skips without a GPU.
#include "kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;

class RmsNormTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_P(RmsNormTest, MatchesReference) {
  const DType dtype = GetParam();
  const bool bf16 = dtype == DType::kBF16;
  const size_t es = bf16 ? 2 : 4;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  struct Shape { int64_t rows, cols, pad; bool in_place; };
  const Shape shapes[] = {{1, 1, 0, false},    {1, 255, 1, false}, {3, 257, 0, false},
                          {7, 1000, 24, true}, {64, 6144, 0, false}, {5, 6144, 8, true},
                          {2, 100003, 0, false},
                          // decode widths, 1..16 rows, aligned and not (pad 1: scalar path)
                          {1, 6144, 0, false}, {16, 6144, 0, true}, {1, 2048, 0, false},
                          {8, 512, 0, true},   {1, 6144, 1, false}, {3, 4096, 1, false},
                          {1, 12, 0, false},   {2, 16384, 0, false}, {2, 16388, 0, false},
                          {1, 8200, 4, true}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " cols=", s.cols, " pad=", s.pad,
                              " in_place=", s.in_place, " bf16=", bf16));
    const int64_t ld = s.cols + s.pad;
    std::vector<float> x(static_cast<size_t>(s.rows * ld)), w(static_cast<size_t>(s.cols));
    for (float& v : x) v = nd(rng);
    for (float& v : w) v = 1.0f + 0.1f * nd(rng);
    if (bf16) {  // the reference sees the values the kernel sees
      for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
      for (float& v : w) v = Bf16ToFloat(FloatToBf16(v));
    }
    std::vector<unsigned char> hx(x.size() * es), hw(w.size() * es);
    for (size_t i = 0; i < x.size(); ++i) {
      if (bf16) {
        const uint16_t b = FloatToBf16(x[i]);
        std::memcpy(&hx[i * 2], &b, 2);
      } else {
        std::memcpy(&hx[i * 4], &x[i], 4);
      }
    }
    for (size_t i = 0; i < w.size(); ++i) {
      if (bf16) {
        const uint16_t b = FloatToBf16(w[i]);
        std::memcpy(&hw[i * 2], &b, 2);
      } else {
        std::memcpy(&hw[i * 4], &w[i], 4);
      }
    }
    GuardedBuffer dx(hx.size()), dw(hw.size()), dy(hx.size());
    ASSERT_TRUE(dx.ok() && dw.ok() && dy.ok());
    GLM_CUDA_ASSERT(dx.Upload(hx.data(), hx.size()));
    GLM_CUDA_ASSERT(dw.Upload(hw.data(), hw.size()));
    GLM_CUDA_ASSERT(dy.Upload(hx.data(), hx.size()));  // padding columns keep x's values
    void* y = s.in_place ? dx.data() : dy.data();
    const float eps = 1e-5f;
    ASSERT_TRUE(RmsNorm(dtype, dx.data(), ld, dw.data(), eps, y, ld, s.rows, s.cols, nullptr).ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    ASSERT_TRUE(dx.GuardsIntact() && dy.GuardsIntact() && dw.GuardsIntact());
    std::vector<unsigned char> hy(hx.size());
    GLM_CUDA_ASSERT((s.in_place ? dx : dy).Download(hy.data(), hy.size()));
    double max_err = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < s.cols; ++c) ss += double(x[r * ld + c]) * x[r * ld + c];
      const double scale = 1.0 / std::sqrt(ss / s.cols + eps);
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        float got;
        if (bf16) {
          uint16_t b;
          std::memcpy(&b, &hy[i * 2], 2);
          got = Bf16ToFloat(b);
        } else {
          std::memcpy(&got, &hy[i * 4], 4);
        }
        ASSERT_TRUE(std::isfinite(got)) << "r=" << r << " c=" << c;
        if (c >= s.cols) {
          ASSERT_EQ(got, x[i]) << "padding column written, r=" << r << " c=" << c;
          continue;
        }
        const double ref = w[c] * x[i] * scale;
        const double err = std::abs(got - ref);
        const double tol = bf16 ? 8e-3 * std::abs(ref) + 1e-6 : 2e-6 * std::abs(ref) + 1e-7;
        max_err = std::max(max_err, err);
        ASSERT_LE(err, tol) << "r=" << r << " c=" << c << " got=" << got << " ref=" << ref;
      }
    }
  }
}

TEST_P(RmsNormTest, RejectsBadInputs) {
  GuardedBuffer d(1024);
  std::vector<float> host(16);
  EXPECT_FALSE(RmsNorm(GetParam(), d.data(), 4, d.data(), 1e-5f, d.data(), 4, 1, 8, nullptr).ok());
  EXPECT_FALSE(RmsNorm(GetParam(), host.data(), 8, d.data(), 1e-5f, d.data(), 8, 1, 8, nullptr).ok());
  EXPECT_FALSE(RmsNorm(GetParam(), d.data(), 8, nullptr, 1e-5f, d.data(), 8, 1, 8, nullptr).ok());
  EXPECT_FALSE(RmsNorm(GetParam(), d.data(), 8, d.data(), 1e-5f, d.data(), 9, 1, 8, nullptr).ok());
  EXPECT_TRUE(RmsNorm(GetParam(), d.data(), 8, d.data(), 1e-5f, d.data(), 8, 0, 8, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(DTypes, RmsNormTest, ::testing::Values(DType::kF32, DType::kBF16),
                         testing::DTypeName);

}  // namespace
}  // namespace glm::kernels
