// SiluMul on the GPU against a CPU reference: fp32 and bf16, shapes 1, non-multiples of the tile,
// GLM-5's widths, padded strides, out aliasing gate, guard bytes, finite outputs.
#include "kernels/silu_mul.h"

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

std::vector<unsigned char> Pack(const std::vector<float>& v, bool bf16) {
  std::vector<unsigned char> h(v.size() * (bf16 ? 2 : 4));
  for (size_t i = 0; i < v.size(); ++i) {
    if (bf16) {
      const uint16_t b = FloatToBf16(v[i]);
      std::memcpy(&h[i * 2], &b, 2);
    } else {
      std::memcpy(&h[i * 4], &v[i], 4);
    }
  }
  return h;
}

float Unpack(const std::vector<unsigned char>& h, size_t i, bool bf16) {
  if (bf16) {
    uint16_t b;
    std::memcpy(&b, &h[i * 2], 2);
    return Bf16ToFloat(b);
  }
  float f;
  std::memcpy(&f, &h[i * 4], 4);
  return f;
}

class SiluMulTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_P(SiluMulTest, MatchesReference) {
  const bool bf16 = GetParam() == DType::kBF16;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  struct Shape { int64_t rows, cols, pad; bool alias; };
  const Shape shapes[] = {{1, 1, 0, false},   {1, 255, 3, false},   {3, 257, 0, true},
                          {8, 2048, 0, false}, {64, 12288, 0, true}, {5, 100003, 1, false}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " cols=", s.cols, " pad=", s.pad,
                              " alias=", s.alias, " bf16=", bf16));
    const int64_t ld = s.cols + s.pad;
    const size_t n = static_cast<size_t>(s.rows * ld);
    std::vector<float> g(n), u(n), sentinel(n, 777.0f);
    for (float& v : g) v = nd(rng);
    for (float& v : u) v = nd(rng);
    g[0] = -100.0f;  // exp overflow side: silu -> -0
    if (n > 1) g[1] = 100.0f;
    if (bf16) {
      for (float& v : g) v = Bf16ToFloat(FloatToBf16(v));
      for (float& v : u) v = Bf16ToFloat(FloatToBf16(v));
    }
    const auto hg = Pack(g, bf16), hu = Pack(u, bf16), hs = Pack(sentinel, bf16);
    GuardedBuffer dg(hg.size()), du(hu.size()), dout(hs.size());
    ASSERT_TRUE(dg.ok() && du.ok() && dout.ok());
    GLM_CUDA_ASSERT(dg.Upload(hg.data(), hg.size()));
    GLM_CUDA_ASSERT(du.Upload(hu.data(), hu.size()));
    GLM_CUDA_ASSERT(dout.Upload(hs.data(), hs.size()));
    void* out = s.alias ? dg.data() : dout.data();
    ASSERT_TRUE(SiluMul(GetParam(), dg.data(), ld, du.data(), ld, out, ld, s.rows, s.cols,
                        nullptr).ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    ASSERT_TRUE(dg.GuardsIntact() && du.GuardsIntact() && dout.GuardsIntact());
    std::vector<unsigned char> ho(hs.size());
    GLM_CUDA_ASSERT((s.alias ? dg : dout).Download(ho.data(), ho.size()));
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        const float got = Unpack(ho, i, bf16);
        ASSERT_TRUE(std::isfinite(got)) << "r=" << r << " c=" << c;
        if (c >= s.cols) {
          ASSERT_EQ(got, s.alias ? g[i] : Unpack(hs, i, bf16)) << "padding written";
          continue;
        }
        const double ref = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
        const double tol = bf16 ? 8e-3 * std::abs(ref) + 1e-6 : 4e-6 * std::abs(ref) + 1e-7;
        ASSERT_LE(std::abs(got - ref), tol) << "r=" << r << " c=" << c << " got=" << got
                                            << " ref=" << ref;
      }
    }
  }
}

TEST_P(SiluMulTest, RejectsBadInputs) {
  GuardedBuffer d(4096);
  std::vector<float> host(64);
  EXPECT_FALSE(SiluMul(GetParam(), d.data(), 8, d.data(), 8, host.data(), 8, 2, 8, nullptr).ok());
  EXPECT_FALSE(SiluMul(GetParam(), d.data(), 4, d.data(), 8, d.data(), 8, 2, 8, nullptr).ok());
  EXPECT_FALSE(SiluMul(GetParam(), d.data(), 8, d.data(), 8, d.data(), 9, 2, 8, nullptr).ok());
  EXPECT_TRUE(SiluMul(GetParam(), d.data(), 8, d.data(), 8, d.data(), 8, 0, 8, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(DTypes, SiluMulTest, ::testing::Values(DType::kF32, DType::kBF16),
                         testing::DTypeName);

}  // namespace
}  // namespace glm::kernels
