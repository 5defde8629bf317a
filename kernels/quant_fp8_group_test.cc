// QuantizeFp8Group on the GPU: bit-identical to QuantizeFp8GroupHost (scales and e4m3 bytes)
// over rows 1..300, k including partial last groups, padded strides, zero groups, outliers,
// values that saturate; guard bytes around q and the scales. Plus host e4m3 conversion facts.
#include "kernels/quant_fp8_group.h"

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

TEST(E4m3HostTest, KnownValues) {
  EXPECT_EQ(FloatToE4m3Sat(0.0f), 0x00);
  EXPECT_EQ(FloatToE4m3Sat(1.0f), 0x38);
  EXPECT_EQ(FloatToE4m3Sat(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4m3Sat(1e6f), 0x7E);     // saturates
  EXPECT_EQ(FloatToE4m3Sat(-1e6f), 0xFE);
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(FloatToE4m3Sat(E4m3ToFloat(static_cast<uint8_t>(b))), b == 0x80 ? 0x80 : b) << b;
  }
}

class QuantFp8GroupTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

TEST_F(QuantFp8GroupTest, BitExactWithHost) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-20.0f, 20.0f);
  struct Shape { int64_t m, k, ldx_pad, ldq_pad, scale_pad; };
  const Shape shapes[] = {{1, 4, 0, 0, 0},      {1, 128, 0, 0, 0},   {7, 132, 4, 12, 1},
                          {64, 6144, 0, 0, 0},  {300, 1040, 8, 0, 4}, {3, 16384, 0, 16, 0}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("m=", s.m, " k=", s.k));
    const int64_t ldx = s.k + s.ldx_pad, ldq = s.k + s.ldq_pad, groups = (s.k + 127) / 128;
    const int64_t scale_ld = s.m + s.scale_pad;
    std::vector<float> x(s.m * ldx, 0.0f);
    for (int64_t r = 0; r < s.m; ++r) {
      for (int64_t c = 0; c < s.k; ++c) {
        x[r * ldx + c] = Bf16ToFloat(FloatToBf16(nd(rng) * std::exp2(mag(rng))));
      }
    }
    if (s.k >= 256) {
      for (int64_t c = 128; c < 256; ++c) x[c] = 0.0f;  // an all-zero group (scale 0)
      x[ldx * (s.m - 1) + 3] = Bf16ToFloat(FloatToBf16(1e30f));  // an outlier
    }
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]);
    std::vector<uint8_t> want_q(s.m * ldq, 0xCD);
    std::vector<float> want_s(groups * scale_ld, -1.0f);
    QuantizeFp8GroupHost(x.data(), ldx, s.m, s.k, want_q.data(), ldq, want_s.data(), scale_ld);

    GuardedBuffer dx(xb.size() * 2), dq(want_q.size()), ds(want_s.size() * 4);
    ASSERT_TRUE(dx.ok() && dq.ok() && ds.ok());
    GLM_CUDA_ASSERT(dx.Upload(xb.data(), xb.size() * 2));
    GLM_CUDA_ASSERT(dq.Poison(0xCD));
    std::vector<float> init_s(want_s.size(), -1.0f);
    GLM_CUDA_ASSERT(ds.Upload(init_s.data(), init_s.size() * 4));
    const absl::Status st = QuantizeFp8Group(dx.data(), ldx, s.m, s.k, dq.data(), ldq,
                                             ds.as<float>(), scale_ld, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    std::vector<uint8_t> got_q(want_q.size());
    std::vector<float> got_s(want_s.size());
    GLM_CUDA_ASSERT(dq.Download(got_q.data(), got_q.size()));
    GLM_CUDA_ASSERT(ds.Download(got_s.data(), got_s.size() * 4));
    EXPECT_TRUE(dq.GuardsIntact());
    EXPECT_TRUE(ds.GuardsIntact());
    int bad = 0;
    for (size_t i = 0; i < got_q.size() && bad < 5; ++i) {
      if (got_q[i] != want_q[i]) {
        ++bad;
        ADD_FAILURE() << "q[" << i / ldq << "," << i % ldq << "] = " << int{got_q[i]}
                      << " want " << int{want_q[i]};
      }
    }
    for (size_t i = 0; i < got_s.size() && bad < 10; ++i) {
      if (std::memcmp(&got_s[i], &want_s[i], 4) != 0) {
        ++bad;
        ADD_FAILURE() << "scale[" << i / scale_ld << "," << i % scale_ld << "] = " << got_s[i]
                      << " want " << want_s[i];
      }
    }
  }
}

TEST_F(QuantFp8GroupTest, RejectsBadArguments) {
  GuardedBuffer b(4096);
  ASSERT_TRUE(b.ok());
  float* s = b.as<float>();
  EXPECT_EQ(QuantizeFp8Group(b.data(), 6, 1, 6, b.data(), 8, s, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // k % 4
  EXPECT_EQ(QuantizeFp8Group(b.data(), 4, 1, 8, b.data(), 8, s, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // ldx < k
  EXPECT_EQ(QuantizeFp8Group(b.data(), 8, 2, 8, b.data(), 8, s, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // scale_ld < m
  EXPECT_EQ(QuantizeFp8Group(static_cast<char*>(b.data()) + 2, 8, 1, 8, b.data(), 8, s, 1,
                             nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // x not 8-byte aligned
  EXPECT_TRUE(QuantizeFp8Group(nullptr, 8, 0, 8, nullptr, 8, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace glm::kernels
