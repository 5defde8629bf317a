// LayerNorm on the GPU against an fp64 CPU reference: rows 1..many, widths 1, non-multiples of
// the 256-thread tile, the indexer's 128, GLM-5's 6144, large; padded strides, in place, an
// offset mean (cancellation), guard bytes, finite outputs. Skips without a GPU.
#include "kernels/layernorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;

class LayerNormTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_F(LayerNormTest, MatchesReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Shape { int64_t rows, cols, pad; bool in_place; float offset; };
  const Shape shapes[] = {{1, 1, 0, false, 0.0f},  {1, 255, 1, false, 0.0f},
                          {3, 257, 0, true, 3.0f}, {7, 128, 24, true, 0.0f},
                          {64, 6144, 0, false, 10.0f}, {2, 100003, 3, false, 0.5f}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " cols=", s.cols, " pad=", s.pad,
                              " in_place=", s.in_place));
    const int64_t ld = s.cols + s.pad;
    std::vector<float> x(static_cast<size_t>(s.rows * ld)), w(s.cols), b(s.cols);
    for (float& v : x) v = s.offset + 2.0f * nd(rng);
    for (float& v : w) v = 1.0f + 0.1f * nd(rng);
    for (float& v : b) v = 0.1f * nd(rng);
    GuardedBuffer dx(x.size() * 4), dw(w.size() * 4), db(b.size() * 4), dy(x.size() * 4);
    ASSERT_TRUE(dx.ok() && dw.ok() && db.ok() && dy.ok());
    GLM_CUDA_ASSERT(dx.Upload(x.data(), x.size() * 4));
    GLM_CUDA_ASSERT(dw.Upload(w.data(), w.size() * 4));
    GLM_CUDA_ASSERT(db.Upload(b.data(), b.size() * 4));
    GLM_CUDA_ASSERT(dy.Upload(x.data(), x.size() * 4));  // padding keeps x's values
    float* y = s.in_place ? dx.as<float>() : dy.as<float>();
    const float eps = 1e-6f;
    ASSERT_TRUE(LayerNorm(dx.as<float>(), ld, dw.as<float>(), db.as<float>(), eps, y, ld, s.rows,
                          s.cols, nullptr)
                    .ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    ASSERT_TRUE(dx.GuardsIntact() && dy.GuardsIntact() && dw.GuardsIntact() && db.GuardsIntact());
    std::vector<float> got(x.size());
    GLM_CUDA_ASSERT((s.in_place ? dx : dy).Download(got.data(), got.size() * 4));
    for (int64_t r = 0; r < s.rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < s.cols; ++c) mean += x[r * ld + c];
      mean /= s.cols;
      for (int64_t c = 0; c < s.cols; ++c) var += (x[r * ld + c] - mean) * (x[r * ld + c] - mean);
      var /= s.cols;
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        ASSERT_TRUE(std::isfinite(got[i])) << r << " " << c;
        if (c >= s.cols) {
          ASSERT_EQ(got[i], x[i]) << "padding column written, r=" << r << " c=" << c;
          continue;
        }
        const double ref = (x[i] - mean) * inv * w[c] + b[c];
        ASSERT_NEAR(got[i], ref, 2e-5 * (1.0 + std::abs(ref)) + 1e-5 * std::abs(s.offset))
            << r << " " << c;
      }
    }
  }
}

TEST_F(LayerNormTest, RejectsBadInputs) {
  GuardedBuffer d(1024);
  std::vector<float> host(16);
  float* p = d.as<float>();
  EXPECT_FALSE(LayerNorm(p, 4, p, p, 1e-5f, p, 4, 1, 8, nullptr).ok());
  EXPECT_FALSE(LayerNorm(host.data(), 8, p, p, 1e-5f, p, 8, 1, 8, nullptr).ok());
  EXPECT_FALSE(LayerNorm(p, 8, p, nullptr, 1e-5f, p, 8, 1, 8, nullptr).ok());
  EXPECT_FALSE(LayerNorm(p, 8, p, p, 1e-5f, p, 9, 1, 8, nullptr).ok());
  EXPECT_FALSE(LayerNorm(p, 8, p, p, -1.0f, p, 8, 1, 8, nullptr).ok());
  EXPECT_TRUE(LayerNorm(p, 8, p, p, 1e-5f, p, 8, 0, 8, nullptr).ok());
}

}  // namespace
}  // namespace glm::kernels
