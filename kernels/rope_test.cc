// RopeInterleaved on the GPU against the CPU backend's formula (fp32 angle, fp64 cos/sin):
// fp32 and bf16, 1 head / many heads, GLM-5's 64 rope dims inside a wider head (dims past the
// rope part untouched), odd frequency counts, large positions, guard bytes, finite outputs.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;

class RopeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_P(RopeTest, MatchesReference) {
  const bool bf16 = GetParam() == DType::kBF16;
  const size_t es = bf16 ? 2 : 4;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Shape { int64_t rows, heads, head_dim; int num_freqs; int64_t row_pad; };
  const Shape shapes[] = {{1, 1, 2, 1, 0},     {3, 1, 64, 32, 0},  {5, 64, 192, 32, 0},
                          {7, 3, 70, 33, 5},   {33, 128, 64, 32, 0}, {2, 1, 2048, 1024, 0},
                          // decode: MLA q_pe of 1..16 rows, one odd-strided row, many CTAs a row
                          {1, 64, 64, 32, 0},  {16, 64, 64, 32, 0}, {1, 64, 64, 32, 1},
                          {1, 700, 64, 32, 0},
                          // more rows than one launch's grid.y (65535)
                          {65537, 1, 2, 1, 0}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " heads=", s.heads, " head_dim=", s.head_dim,
                              " num_freqs=", s.num_freqs, " bf16=", bf16));
    const int64_t row_stride = s.heads * s.head_dim + s.row_pad;
    const size_t n = static_cast<size_t>(s.rows * row_stride);
    std::vector<float> x(n);
    for (float& v : x) v = bf16 ? Bf16ToFloat(FloatToBf16(nd(rng))) : nd(rng);
    std::vector<int32_t> pos(static_cast<size_t>(s.rows));
    std::uniform_int_distribution<int32_t> pd(0, 1 << 20);
    for (size_t r = 0; r < pos.size(); ++r) pos[r] = r == 0 ? 0 : pd(rng);
    std::vector<float> inv_freq(static_cast<size_t>(s.num_freqs));
    for (int i = 0; i < s.num_freqs; ++i) {
      inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / (2.0 * s.num_freqs)));
    }
    std::vector<unsigned char> hx(n * es);
    for (size_t i = 0; i < n; ++i) {
      if (bf16) {
        const uint16_t b = FloatToBf16(x[i]);
        std::memcpy(&hx[i * 2], &b, 2);
      } else {
        std::memcpy(&hx[i * 4], &x[i], 4);
      }
    }
    GuardedBuffer dx(hx.size()), dpos(pos.size() * 4), dfreq(inv_freq.size() * 4);
    ASSERT_TRUE(dx.ok() && dpos.ok() && dfreq.ok());
    GLM_CUDA_ASSERT(dx.Upload(hx.data(), hx.size()));
    GLM_CUDA_ASSERT(dpos.Upload(pos.data(), pos.size() * 4));
    GLM_CUDA_ASSERT(dfreq.Upload(inv_freq.data(), inv_freq.size() * 4));
    ASSERT_TRUE(RopeInterleaved(GetParam(), dx.data(), s.rows, s.heads, row_stride, s.head_dim,
                                dpos.as<int32_t>(), dfreq.as<float>(), s.num_freqs, nullptr)
                    .ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    ASSERT_TRUE(dx.GuardsIntact());
    std::vector<unsigned char> hy(hx.size());
    GLM_CUDA_ASSERT(dx.Download(hy.data(), hy.size()));
    auto got_at = [&](size_t i) {
      if (bf16) {
        uint16_t b;
        std::memcpy(&b, &hy[i * 2], 2);
        return Bf16ToFloat(b);
      }
      float f;
      std::memcpy(&f, &hy[i * 4], 4);
      return f;
    };
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const size_t base = static_cast<size_t>(r * row_stride + h * s.head_dim);
        for (int i = 0; i < s.num_freqs; ++i) {
          const float angle = static_cast<float>(pos[r]) * inv_freq[i];
          const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
          const float sn = static_cast<float>(std::sin(static_cast<double>(angle)));
          const float a = x[base + 2 * i], b = x[base + 2 * i + 1];
          const double ref0 = double(a) * c - double(b) * sn;
          const double ref1 = double(b) * c + double(a) * sn;
          const float g0 = got_at(base + 2 * i), g1 = got_at(base + 2 * i + 1);
          ASSERT_TRUE(std::isfinite(g0) && std::isfinite(g1));
          const double tol0 = bf16 ? 8e-3 * std::abs(ref0) + 2e-3 : 1e-5;
          const double tol1 = bf16 ? 8e-3 * std::abs(ref1) + 2e-3 : 1e-5;
          ASSERT_NEAR(g0, ref0, tol0) << "r=" << r << " h=" << h << " i=" << i;
          ASSERT_NEAR(g1, ref1, tol1) << "r=" << r << " h=" << h << " i=" << i;
        }
        for (int64_t d = 2 * s.num_freqs; d < s.head_dim; ++d) {
          ASSERT_EQ(got_at(base + d), x[base + d]) << "non-rope dim changed, d=" << d;
        }
      }
      for (int64_t d = s.heads * s.head_dim; d < row_stride; ++d) {
        ASSERT_EQ(got_at(r * row_stride + d), x[r * row_stride + d]) << "row padding changed";
      }
    }
  }
}

// A second head set in the same launch (RopeHeads; the query's rope dims and the indexer
// query's, both in q_b's output rows) gives the bits of two separate launches, and touches
// nothing else of the rows. Shapes: GLM-5's (64 heads of stride 256, rope at dims 192..255;
// then 32 heads of 128, rope at 0..63) at 1 / 3 / 16 rows, an odd offset of the second set
// (element accesses instead of pairs), a second set of 1 head, and more rows than grid.y.
TEST_P(RopeTest, SecondHeadSetEqualsASeparateLaunch) {
  const bool bf16 = GetParam() == DType::kBF16;
  const size_t es = bf16 ? 2 : 4;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  struct Shape {
    int64_t rows, heads, head_stride, off, heads2, head_stride2, off2, row_stride;
    int num_freqs;
  };
  const Shape shapes[] = {{1, 64, 256, 192, 32, 128, 16384, 20480, 32},
                          {3, 64, 256, 192, 32, 128, 16384, 20480, 32},
                          {16, 64, 256, 192, 32, 128, 16384, 20480, 32},
                          {2, 4, 16, 8, 3, 10, 65, 96, 4},
                          {5, 2, 8, 0, 1, 8, 16, 40, 3},
                          {65537, 1, 4, 0, 1, 4, 4, 8, 2}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " heads=", s.heads, "+", s.heads2, " off2=", s.off2,
                              " bf16=", bf16));
    const size_t bytes = static_cast<size_t>(s.rows * s.row_stride) * es;
    std::vector<unsigned char> hx(bytes);
    // Finite values: random bf16 / fp32 bit patterns with a small exponent.
    for (size_t i = 0; i < bytes / es; ++i) {
      const float v = std::ldexp(static_cast<float>(byte(rng) - 128), -6);
      if (bf16) {
        const uint16_t b = FloatToBf16(v);
        std::memcpy(&hx[i * 2], &b, 2);
      } else {
        std::memcpy(&hx[i * 4], &v, 4);
      }
    }
    std::vector<int32_t> pos(static_cast<size_t>(s.rows));
    for (size_t r = 0; r < pos.size(); ++r) pos[r] = static_cast<int32_t>((r + 1) * 977 % 200000);
    std::vector<float> inv_freq(static_cast<size_t>(s.num_freqs));
    for (int i = 0; i < s.num_freqs; ++i) inv_freq[i] = std::pow(10000.0f, -float(i) / s.num_freqs);
    GuardedBuffer one(bytes), two(bytes), dpos(pos.size() * 4), dfreq(inv_freq.size() * 4);
    ASSERT_TRUE(one.ok() && two.ok() && dpos.ok() && dfreq.ok());
    GLM_CUDA_ASSERT(one.Upload(hx.data(), bytes));
    GLM_CUDA_ASSERT(two.Upload(hx.data(), bytes));
    GLM_CUDA_ASSERT(dpos.Upload(pos.data(), pos.size() * 4));
    GLM_CUDA_ASSERT(dfreq.Upload(inv_freq.data(), inv_freq.size() * 4));
    auto at = [&](GuardedBuffer& b, int64_t off) {
      return static_cast<void*>(static_cast<unsigned char*>(b.data()) + off * es);
    };
    const RopeHeads second{at(one, s.off2), s.heads2, s.head_stride2};
    ASSERT_TRUE(RopeInterleaved(GetParam(), at(one, s.off), s.rows, s.heads, s.row_stride,
                                s.head_stride, dpos.as<int32_t>(), dfreq.as<float>(), s.num_freqs,
                                nullptr, &second)
                    .ok());
    ASSERT_TRUE(RopeInterleaved(GetParam(), at(two, s.off), s.rows, s.heads, s.row_stride,
                                s.head_stride, dpos.as<int32_t>(), dfreq.as<float>(), s.num_freqs,
                                nullptr)
                    .ok());
    ASSERT_TRUE(RopeInterleaved(GetParam(), at(two, s.off2), s.rows, s.heads2, s.row_stride,
                                s.head_stride2, dpos.as<int32_t>(), dfreq.as<float>(), s.num_freqs,
                                nullptr)
                    .ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    ASSERT_TRUE(one.GuardsIntact() && two.GuardsIntact());
    std::vector<unsigned char> h1(bytes), h2(bytes);
    GLM_CUDA_ASSERT(one.Download(h1.data(), bytes));
    GLM_CUDA_ASSERT(two.Download(h2.data(), bytes));
    ASSERT_EQ(std::memcmp(h1.data(), h2.data(), bytes), 0);
    ASSERT_NE(std::memcmp(h1.data(), hx.data(), bytes), 0) << "nothing was rotated";
  }
}

TEST_P(RopeTest, RejectsBadInputs) {
  GuardedBuffer d(4096);
  std::vector<float> host(64);
  // Overlapping heads, too many frequencies, host memory.
  EXPECT_FALSE(RopeInterleaved(GetParam(), d.data(), 1, 2, 64, 8, d.as<int32_t>(), d.as<float>(),
                               8, nullptr).ok());
  EXPECT_FALSE(RopeInterleaved(GetParam(), d.data(), 1, 1, 4096, 2048, d.as<int32_t>(),
                               d.as<float>(), 2048, nullptr).ok());
  EXPECT_FALSE(RopeInterleaved(GetParam(), host.data(), 1, 1, 8, 8, d.as<int32_t>(),
                               d.as<float>(), 4, nullptr).ok());
  // A second set with overlapping heads, none, or in host memory.
  const RopeHeads overlap{d.data(), 2, 4}, none{d.data(), 0, 8}, on_host{host.data(), 1, 8};
  for (const RopeHeads* second : {&overlap, &none, &on_host}) {
    EXPECT_FALSE(RopeInterleaved(GetParam(), d.data(), 1, 1, 64, 8, d.as<int32_t>(), d.as<float>(),
                                 4, nullptr, second)
                     .ok());
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, RopeTest, ::testing::Values(DType::kF32, DType::kBF16),
                         testing::DTypeName);

}  // namespace
}  // namespace glm::kernels
