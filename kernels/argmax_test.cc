// ArgmaxRows on the GPU against engine/sample's rule (largest, ties to the lowest index): fp32
// and bf16, vocab 1, non-multiples of the tile, GLM-5's 154,880, ties, -inf rows, NaN entries,
// padded strides, guard bytes around the ids.
#include "kernels/argmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;

class ArgmaxTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_P(ArgmaxTest, MatchesReference) {
  const bool bf16 = GetParam() == DType::kBF16;
  const size_t es = bf16 ? 2 : 4;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  struct Shape { int64_t rows, vocab, pad; };
  const Shape shapes[] = {{1, 1, 0}, {3, 511, 1}, {9, 513, 0}, {64, 154880, 0}, {4, 200003, 7}};
  const float inf = std::numeric_limits<float>::infinity();
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("rows=", s.rows, " vocab=", s.vocab, " bf16=", bf16));
    const int64_t ld = s.vocab + s.pad;
    std::vector<float> x(static_cast<size_t>(s.rows * ld));
    for (int64_t r = 0; r < s.rows; ++r) {
      float* row = x.data() + r * ld;
      for (int64_t c = 0; c < ld; ++c) row[c] = nd(rng);
      if (bf16) {
        for (int64_t c = 0; c < ld; ++c) row[c] = Bf16ToFloat(FloatToBf16(row[c]));
      }
      for (int64_t c = s.vocab; c < ld; ++c) row[c] = 1e30f;  // padding: never chosen
      switch (r % 4) {
        case 1: {  // tie of the maximum at two places: lower index wins
          const int64_t a = (r * 7919) % s.vocab, b = (r * 104729) % s.vocab;
          row[a] = 1000.0f;
          row[b] = 1000.0f;
          break;
        }
        case 2:  // all -inf
          for (int64_t c = 0; c < s.vocab; ++c) row[c] = -inf;
          break;
        case 3:  // NaN entries (not at index 0) are never chosen
          for (int64_t c = 1; c < s.vocab; c += 3) row[c] = std::numeric_limits<float>::quiet_NaN();
          break;
        default:
          break;
      }
    }
    std::vector<unsigned char> hx(x.size() * es);
    for (size_t i = 0; i < x.size(); ++i) {
      if (bf16) {
        const uint16_t b = FloatToBf16(x[i]);
        std::memcpy(&hx[i * 2], &b, 2);
      } else {
        std::memcpy(&hx[i * 4], &x[i], 4);
      }
    }
    GuardedBuffer dx(hx.size()), dout(static_cast<size_t>(s.rows) * 4);
    ASSERT_TRUE(dx.ok() && dout.ok());
    GLM_CUDA_ASSERT(dx.Upload(hx.data(), hx.size()));
    GLM_CUDA_ASSERT(dout.Poison(0x5A));
    ASSERT_TRUE(ArgmaxRows(GetParam(), dx.data(), ld, s.rows, s.vocab, dout.as<int32_t>(),
                           nullptr).ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    ASSERT_TRUE(dout.GuardsIntact());
    std::vector<int32_t> got(static_cast<size_t>(s.rows));
    GLM_CUDA_ASSERT(dout.Download(got.data(), got.size() * 4));
    for (int64_t r = 0; r < s.rows; ++r) {
      const float* row = x.data() + r * ld;
      int32_t best = 0;  // engine/sample ArgMax (row[0] is never NaN here)
      for (int64_t c = 1; c < s.vocab; ++c) {
        if (row[c] > row[best]) best = static_cast<int32_t>(c);
      }
      ASSERT_EQ(got[r], best) << "row " << r;
    }
  }
}

TEST_P(ArgmaxTest, RejectsBadInputs) {
  GuardedBuffer d(4096);
  std::vector<int32_t> host(4);
  EXPECT_FALSE(ArgmaxRows(GetParam(), d.data(), 8, 2, 8, host.data(), nullptr).ok());
  EXPECT_FALSE(ArgmaxRows(GetParam(), d.data(), 4, 2, 8, d.as<int32_t>(), nullptr).ok());
  EXPECT_FALSE(ArgmaxRows(GetParam(), d.data(), 8, 2, 0, d.as<int32_t>(), nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(DTypes, ArgmaxTest, ::testing::Values(DType::kF32, DType::kBF16),
                         testing::DTypeName);

}  // namespace
}  // namespace glm::kernels
