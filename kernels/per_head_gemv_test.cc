// PerHeadGemv on the GPU against an fp64 host reference: rows 1/2/3/8/16, GLM-5's absorbed MLA
// shapes (64 heads, 192 -> 512 and 512 -> 256), the router shape (1 head, 6144 -> 256), odd
// shapes (in_dim not a multiple of 4 or of the 512-column block, odd out_dim, padded and odd
// strides: the scalar-load path), in_dim 0, accumulate; guard bytes, padding untouched, finite
// outputs, bitwise-equal repeat runs (deterministic). The fused RmsNorm (PerHeadGemvNorm) against
// RmsNorm then PerHeadGemv, bit for bit. Shape checks run without a GPU too.
#include "kernels/per_head_gemv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"
#include "kernels/rmsnorm.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;

TEST(PerHeadGemvShapes, SupportedSizes) {
  EXPECT_TRUE(PerHeadGemvSupported(1, 512));
  EXPECT_TRUE(PerHeadGemvSupported(16, 512));
  EXPECT_TRUE(PerHeadGemvSupported(1, 6144));
  EXPECT_FALSE(PerHeadGemvSupported(0, 512));
  EXPECT_FALSE(PerHeadGemvSupported(17, 512));
  EXPECT_FALSE(PerHeadGemvSupported(16, 6144));  // x stage would not fit
  EXPECT_FALSE(PerHeadGemvSupported(2, 6144));   // 48 KiB of x plus the partials
}

TEST(PerHeadGemvShapes, RejectsBadShapes) {
  EXPECT_FALSE(PerHeadGemv(nullptr, 8, 8, nullptr, 64, 8, nullptr, 8, 8, 17, 1, 8, 8, false,
                           nullptr).ok());
  EXPECT_FALSE(PerHeadGemv(nullptr, 8, 8, nullptr, 64, 4, nullptr, 8, 8, 1, 1, 8, 8, false,
                           nullptr).ok());  // w_ld < in_dim
  EXPECT_TRUE(PerHeadGemv(nullptr, 8, 8, nullptr, 64, 8, nullptr, 8, 8, 0, 1, 8, 8, false,
                          nullptr).ok());  // no rows: no-op
  EXPECT_FALSE(PerHeadGemv(nullptr, 16, 8, nullptr, 64, 8, nullptr, 16, 4, 1, 2, 8, 8, false,
                           nullptr).ok());  // heads' outputs overlap
  EXPECT_FALSE(PerHeadGemv(nullptr, 16, 8, nullptr, 64, 8, nullptr, 8, 8, 2, 2, 8, 8, false,
                           nullptr).ok());  // rows' outputs overlap
}

class PerHeadGemvTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_F(PerHeadGemvTest, MatchesReference) {
  struct S { int64_t rows, heads, in_dim, out_dim, x_extra, w_extra, y_extra; bool acc; };
  std::vector<S> shapes;
  for (int64_t rows : {1, 2, 3, 8, 16}) {
    shapes.push_back({rows, 64, 192, 512, 64, 0, 0, false});  // W_UK^T (q_nope in a 256 slot)
    shapes.push_back({rows, 64, 512, 256, 0, 0, 0, false});   // W_UV
  }
  shapes.push_back({1, 1, 6144, 256, 0, 0, 0, false});  // router logits
  shapes.push_back({1, 1, 6144, 256, 0, 0, 0, true});
  shapes.push_back({1, 1, 1, 1, 0, 0, 0, false});
  shapes.push_back({2, 3, 7, 5, 1, 1, 1, false});       // scalar path
  shapes.push_back({5, 4, 132, 33, 3, 4, 2, true});     // vec4, partial chunk, odd out_dim
  shapes.push_back({16, 2, 700, 17, 0, 0, 5, false});   // in_dim % 4 == 0, not of 512
  shapes.push_back({9, 5, 513, 19, 2, 3, 1, false});    // scalar, K split
  shapes.push_back({4, 1, 2048, 100, 0, 4, 0, true});   // one head: K split
  shapes.push_back({3, 2, 0, 9, 0, 0, 0, false});       // in_dim 0: zeros
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const S& s : shapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " heads=", s.heads, " in=", s.in_dim,
                              " out=", s.out_dim, " acc=", s.acc));
    const int64_t x_hs = s.in_dim + s.x_extra, x_rs = s.heads * x_hs + s.x_extra;
    const int64_t w_ld = s.in_dim + s.w_extra, w_hs = s.out_dim * w_ld + s.w_extra;
    const int64_t y_hs = s.out_dim + s.y_extra, y_rs = s.heads * y_hs + 2 * s.y_extra;
    std::vector<float> x(std::max<int64_t>(1, s.rows * x_rs)), w(std::max<int64_t>(1, s.heads * w_hs)),
        y(s.rows * y_rs);
    for (float& v : x) v = nd(rng);
    for (float& v : w) v = nd(rng);
    for (float& v : y) v = nd(rng);
    std::vector<double> ref(y.begin(), y.end());
    for (int64_t m = 0; m < s.rows; ++m) {
      for (int64_t h = 0; h < s.heads; ++h) {
        for (int64_t n = 0; n < s.out_dim; ++n) {
          double d = 0;
          for (int64_t k = 0; k < s.in_dim; ++k) {
            d += double(x[m * x_rs + h * x_hs + k]) * w[h * w_hs + n * w_ld + k];
          }
          double& o = ref[m * y_rs + h * y_hs + n];
          o = s.acc ? o + d : d;
        }
      }
    }
    GuardedBuffer dx(x.size() * 4), dw(w.size() * 4), dy(y.size() * 4);
    ASSERT_TRUE(dx.ok() && dw.ok() && dy.ok());
    GLM_CUDA_ASSERT(dx.Upload(x.data(), x.size() * 4));
    GLM_CUDA_ASSERT(dw.Upload(w.data(), w.size() * 4));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      GLM_CUDA_ASSERT(dy.Upload(y.data(), y.size() * 4));
      const absl::Status st = PerHeadGemv(dx.as<float>(), x_rs, x_hs, dw.as<float>(), w_hs, w_ld,
                                          dy.as<float>(), y_rs, y_hs, s.rows, s.heads, s.in_dim,
                                          s.out_dim, s.acc, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      GLM_CUDA_ASSERT(cudaDeviceSynchronize());
      ASSERT_TRUE(dx.GuardsIntact() && dw.GuardsIntact() && dy.GuardsIntact());
      std::vector<float> got(y.size());
      GLM_CUDA_ASSERT(dy.Download(got.data(), got.size() * 4));
      double max_err = 0, max_ref = 1;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << "at " << i;
        max_ref = std::max(max_ref, std::abs(ref[i]));
        max_err = std::max(max_err, std::abs(got[i] - ref[i]));
      }
      // fp32 accumulation over in_dim terms of unit-variance products.
      EXPECT_LE(max_err, 1e-5 * max_ref + 2e-6 * std::sqrt(double(s.in_dim + 1)) * 8)
          << "max_ref=" << max_ref;
      if (run == 0) {
        first = got;
      } else {
        ASSERT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * 4)) << "not deterministic";
      }
    }
  }
}

// PerHeadGemvNorm: the same y and normalized rows, bit for bit, as RmsNorm into a buffer followed
// by PerHeadGemv on it (the router shape 6144 -> 256, 2 and 16 rows, K-split shapes, the largest
// row RmsNorm's vector kernel takes); refused where that kernel does not take the rows, with two
// heads, with out overlapping x, and where the stage would not fit.
TEST_F(PerHeadGemvTest, FusedRmsNormEqualsRmsNormThenGemv) {
  struct S {
    int64_t rows, in_dim, out_dim;
    bool acc;
  };
  const S shapes[] = {{1, 6144, 256, false}, {1, 6144, 256, true},  {2, 4096, 256, false},
                      {16, 512, 40, true},   {4, 2048, 100, false}, {1, 8192, 64, false},
                      {3, 16, 7, true}};
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const S& s : shapes) {
    SCOPED_TRACE(
        absl::StrCat("rows=", s.rows, " in=", s.in_dim, " out=", s.out_dim, " acc=", s.acc));
    const int64_t ldx = s.in_dim + 4, ldo = s.in_dim + 8, ldy = s.out_dim + 1;
    std::vector<float> x(s.rows * ldx), nw(s.in_dim), w(s.out_dim * s.in_dim), y(s.rows * ldy);
    for (float& v : x) v = 4.0f * nd(rng);
    for (float& v : nw) v = 1.0f + 0.3f * nd(rng);
    for (float& v : w) v = nd(rng);
    for (float& v : y) v = nd(rng);
    GuardedBuffer dx(x.size() * 4), dnw(nw.size() * 4), dw(w.size() * 4), dref(s.rows * ldo * 4),
        dout(s.rows * ldo * 4), dyref(y.size() * 4), dy(y.size() * 4);
    GLM_CUDA_ASSERT(dx.Upload(x.data(), x.size() * 4));
    GLM_CUDA_ASSERT(dnw.Upload(nw.data(), nw.size() * 4));
    GLM_CUDA_ASSERT(dw.Upload(w.data(), w.size() * 4));
    GLM_CUDA_ASSERT(dyref.Upload(y.data(), y.size() * 4));
    GLM_CUDA_ASSERT(dy.Upload(y.data(), y.size() * 4));
    GLM_CUDA_ASSERT(dref.Poison(0x3f));
    GLM_CUDA_ASSERT(dout.Poison(0x3f));
    const float eps = 1e-6f;
    ASSERT_TRUE(RmsNorm(DType::kF32, dx.data(), ldx, dnw.data(), eps, dref.data(), ldo, s.rows,
                        s.in_dim, nullptr)
                    .ok());
    ASSERT_TRUE(PerHeadGemv(dref.as<float>(), ldo, 0, dw.as<float>(), 0, s.in_dim,
                            dyref.as<float>(), ldy, 0, s.rows, 1, s.in_dim, s.out_dim, s.acc,
                            nullptr)
                    .ok());
    const PerHeadGemvNorm norm{dnw.as<float>(), eps, dout.as<float>(), ldo};
    ASSERT_TRUE(PerHeadGemvNormFusible(dx.as<float>(), ldx, s.rows, s.in_dim, norm));
    const absl::Status st =
        PerHeadGemv(dx.as<float>(), ldx, 0, dw.as<float>(), 0, s.in_dim, dy.as<float>(), ldy, 0,
                    s.rows, 1, s.in_dim, s.out_dim, s.acc, nullptr, &norm);
    ASSERT_TRUE(st.ok()) << st;
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> a(s.rows * ldo), b(s.rows * ldo), ya(y.size()), yb(y.size());
    GLM_CUDA_ASSERT(dref.Download(a.data(), a.size() * 4));
    GLM_CUDA_ASSERT(dout.Download(b.data(), b.size() * 4));
    GLM_CUDA_ASSERT(dyref.Download(ya.data(), ya.size() * 4));
    GLM_CUDA_ASSERT(dy.Download(yb.data(), yb.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "normalized rows differ";
    EXPECT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * 4)) << "y differs";
    EXPECT_TRUE(dout.GuardsIntact() && dy.GuardsIntact());
  }
  // Refused: rows past 8192 columns, unaligned strides, a stage past 48 KiB, two heads, out
  // overlapping x.
  GuardedBuffer dx(2 * 8200 * 4), dnw(8200 * 4), dout(2 * 8200 * 4), dw(8200 * 4), dy(64);
  PerHeadGemvNorm norm{dnw.as<float>(), 1e-6f, dout.as<float>(), 8196};
  EXPECT_FALSE(PerHeadGemvNormFusible(dx.as<float>(), 8196, 1, 8196, norm));
  norm.out_ld = 6146;
  EXPECT_FALSE(PerHeadGemvNormFusible(dx.as<float>(), 6144, 1, 6144, norm));
  norm.out_ld = 6144;
  EXPECT_TRUE(PerHeadGemvNormFusible(dx.as<float>(), 6144, 1, 6144, norm));
  EXPECT_FALSE(PerHeadGemvNormFusible(dx.as<float>(), 6144, 2, 6144, norm));  // 48 KiB of x
  EXPECT_EQ(PerHeadGemv(dx.as<float>(), 8, 8, dw.as<float>(), 0, 8, dy.as<float>(), 8, 4, 1, 2, 8,
                        4, false, nullptr, &norm)
                .code(),
            absl::StatusCode::kInvalidArgument);
  norm.out = dx.as<float>() + 8;
  EXPECT_FALSE(PerHeadGemvNormFusible(dx.as<float>(), 6144, 1, 6144, norm));
}

}  // namespace
}  // namespace glm::kernels
