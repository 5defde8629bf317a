// Exhaustive checks of the narrow-float codecs against references computed another way.
#include "engine/weights/float_codec.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace glm::engine {
namespace {

// Same value, or both NaN (sign of NaN is not compared).
bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);  // distinguishes ±0
}

// e4m3fn by its definition: (-1)^s * 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8.
float Fp8Reference(int code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xF, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<float>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return static_cast<float>(sign ? -magnitude : magnitude);
}

// binary16 by its definition.
float F16Reference(int code) {
  const int sign = code >> 15, exponent = (code >> 10) & 0x1F, mantissa = code & 0x3FF;
  double magnitude;
  if (exponent == 31) {
    if (mantissa != 0) return std::numeric_limits<float>::quiet_NaN();
    magnitude = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa / 1024.0, -14);
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return static_cast<float>(sign ? -magnitude : magnitude);
}

TEST(Fp8E4M3Test, AllCodesMatchDefinition) {
  for (int code = 0; code < 256; ++code) {
    EXPECT_TRUE(SameFloat(Fp8E4M3ToFloat(static_cast<uint8_t>(code)), Fp8Reference(code)))
        << "code 0x" << std::hex << code;
  }
}

TEST(Fp8E4M3Test, KnownValues) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0xFE), -448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), 0x1.0p-9f);   // smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x07), 7 * 0x1.0p-9f);  // largest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), 0x1.0p-6f);   // smallest normal
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xFF)));
  EXPECT_TRUE(std::signbit(Fp8E4M3ToFloat(0x80)));
  EXPECT_EQ(Fp8E4M3ToFloat(0x80), 0.0f);
  EXPECT_FALSE(std::isinf(Fp8E4M3ToFloat(0x78)));  // e4m3fn has no infinity: 0x78 is 256
  EXPECT_EQ(Fp8E4M3ToFloat(0x78), 256.0f);
}

TEST(Bf16Test, AllCodesMatchShiftedFloatBits) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float expected = std::bit_cast<float>(code << 16);
    const float got = Bf16ToFloat(static_cast<uint16_t>(code));
    ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << code;
  }
}

TEST(F16Test, AllCodesMatchDefinition) {
  for (int code = 0; code < 65536; ++code) {
    ASSERT_TRUE(SameFloat(F16ToFloat(static_cast<uint16_t>(code)), F16Reference(code)))
        << "code 0x" << std::hex << code;
  }
}

#if defined(__FLT16_MANT_DIG__) && (defined(__x86_64__) || defined(__aarch64__))
TEST(F16Test, AllCodesMatchCompilerFloat16) {
  for (int code = 0; code < 65536; ++code) {
    const auto half = std::bit_cast<_Float16>(static_cast<uint16_t>(code));
    ASSERT_TRUE(SameFloat(F16ToFloat(static_cast<uint16_t>(code)), static_cast<float>(half)))
        << code;
  }
}
#endif

// Brute-force nearest code (ties to the even code) among finite codes of a decoder.
template <typename Decode>
int NearestCode(float value, int num_codes, Decode decode) {
  int best = -1;
  double best_error = 0;
  for (int code = 0; code < num_codes; ++code) {
    const float candidate = decode(code);
    if (!std::isfinite(candidate)) continue;
    const double error = std::fabs(static_cast<double>(candidate) - value);
    if (best < 0 || error < best_error ||
        (error == best_error && (code & 1) == 0 && (best & 1) == 1)) {
      best = code;
      best_error = error;
    }
  }
  return best;
}

TEST(Fp8E4M3Test, EncodeIsNearestEvenAndRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float value = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(value)) continue;
    EXPECT_EQ(FloatToFp8E4M3(value), code) << code;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> log_magnitude(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float value = std::exp2(log_magnitude(rng)) * ((i & 1) ? -1.0f : 1.0f);
    const float clamped = std::clamp(value, -448.0f, 448.0f);
    const int expected = NearestCode(clamped, 256, [](int c) {
      return Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    });
    const float got = Fp8E4M3ToFloat(FloatToFp8E4M3(value));
    ASSERT_EQ(got, Fp8E4M3ToFloat(static_cast<uint8_t>(expected))) << value;
  }
  // Ties between neighbours go to the even mantissa: 1 + 1/16 lies between 1 and 1.125.
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), 0x3A);  // between 1.125 (0x39) and 1.25 (0x3A)
  EXPECT_EQ(FloatToFp8E4M3(1000.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToFp8E4M3(0x1.0p-11f), 0x00);  // a quarter of the smallest subnormal
  EXPECT_EQ(FloatToFp8E4M3(0x1.0p-10f), 0x00);  // half of it: a tie, to even (zero)
  EXPECT_EQ(FloatToFp8E4M3(0x1.8p-9f), 0x02);   // 1.5 subnormal steps: a tie, to even (2)
  EXPECT_EQ(FloatToFp8E4M3(0x1.8p-10f), 0x01);
}

TEST(F16Test, EncodeIsNearestEvenAndRoundTrips) {
  for (int code = 0; code < 65536; ++code) {
    const float value = F16ToFloat(static_cast<uint16_t>(code));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(value))));
      continue;
    }
    ASSERT_EQ(FloatToF16(value), code) << code;
  }
  // Midpoints between neighbouring finite codes round to the even one.
  for (int code = 0; code < 0x7BFF; ++code) {
    const double low = F16ToFloat(static_cast<uint16_t>(code));
    const double high = F16ToFloat(static_cast<uint16_t>(code + 1));
    const auto mid = static_cast<float>((low + high) / 2);
    ASSERT_EQ(FloatToF16(mid), (code & 1) ? code + 1 : code) << code;
  }
  EXPECT_EQ(FloatToF16(65520.0f), 0x7C00);  // rounds to inf
  EXPECT_EQ(FloatToF16(65519.0f), 0x7BFF);
}

TEST(Bf16Test, EncodeRoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // overflow to inf
  for (uint32_t code = 0; code < 65536; ++code) {
    const float value = Bf16ToFloat(static_cast<uint16_t>(code));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToBf16(value), code);
  }
}

}  // namespace
}  // namespace glm::engine
