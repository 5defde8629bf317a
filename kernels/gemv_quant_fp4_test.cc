// The FP4-activation GEMV's scalar rules and host reference (gemv_quant_fp4.h) against rules
// written here by brute force (nearest representable value by enumeration, ties to the even
// code): no GPU needed. The GPU kernel is compared with GemvQuantFp4Host in
// gemv_quant_fp4mma_test.
#include "kernels/gemv_quant_fp4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace glm::kernels {
namespace {

// xorshift64*: deterministic, seeded per test.
struct Rng {
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  uint64_t s;
};

constexpr float kE2m1Mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// ue4m3 value of byte b (0..0x7e) from the format's definition.
double SpecUe4m3(int b) {
  const int e = (b >> 3) & 15, man = b & 7;
  return e == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, e - 7);
}

// Nearest e2m1 magnitude code to |v| (ties to the even code), saturating at 6.
int BruteE2m1Mag(double a) {
  if (a >= 6.0) return 7;
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kE2m1Mag[c]), db = std::fabs(a - kE2m1Mag[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return best;
}

// Nearest ue4m3 byte to v >= 0 (ties to the even byte), saturating at 448.
int BruteUe4m3(double v) {
  int best = 0;
  for (int b = 1; b <= 0x7e; ++b) {
    const double d = std::fabs(v - SpecUe4m3(b)), db = std::fabs(v - SpecUe4m3(best));
    if (d < db || (d == db && b % 2 == 0)) best = b;
  }
  return best;
}

float RandomFloat(Rng& rng, float lo_exp, float hi_exp) {
  const double u = (rng.Next() % 1000000) / 1e6;
  const double mag = std::exp2(lo_exp + u * (hi_exp - lo_exp));
  return static_cast<float>((rng.Next() & 1) ? -mag : mag);
}

TEST(Fp4RulesTest, E2m1ValuesAreTheSpecMagnitudes) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(Fp4E2m1Value(static_cast<uint8_t>(c)), (c & 8) ? -kE2m1Mag[c & 7] : kE2m1Mag[c & 7]);
  }
}

TEST(Fp4RulesTest, E2m1CodeIsNearestTiesToEvenAndSaturates) {
  // Every magnitude, every midpoint and points either side of it.
  std::vector<float> probes;
  for (int c = 0; c < 8; ++c) probes.push_back(kE2m1Mag[c]);
  for (int c = 0; c < 7; ++c) {
    const float mid = 0.5f * (kE2m1Mag[c] + kE2m1Mag[c + 1]);
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, 0.0f));
    probes.push_back(std::nextafter(mid, 10.0f));
  }
  for (float v : {6.5f, 7.0f, 100.0f, 1e30f}) probes.push_back(v);
  Rng rng(7);
  for (int i = 0; i < 20000; ++i) probes.push_back(std::fabs(RandomFloat(rng, -6.0f, 4.0f)));
  for (float a : probes) {
    for (float v : {a, -a}) {
      const uint8_t code = Fp4E2m1Code(v);
      EXPECT_EQ(code & 7, BruteE2m1Mag(a)) << v;
      EXPECT_EQ((code & 8) != 0, std::signbit(v)) << v;
    }
  }
  EXPECT_EQ(Fp4E2m1Code(0.75f), 2);   // tie between 0.5 and 1.0: the even code (1.0)
  EXPECT_EQ(Fp4E2m1Code(2.5f), 4);    // tie between 2 and 3: 2
  EXPECT_EQ(Fp4E2m1Code(5.0f), 6);    // tie between 4 and 6: 4
  EXPECT_EQ(Fp4E2m1Code(-9.0f), 15);  // saturates to -6
}

TEST(Fp4RulesTest, Ue4m3RoundTripsEveryByteAndRoundsNearestEven) {
  for (int b = 0; b <= 0x7e; ++b) {
    EXPECT_EQ(Fp4Ue4m3Value(static_cast<uint8_t>(b)), static_cast<float>(SpecUe4m3(b))) << b;
    EXPECT_EQ(Fp4Ue4m3Code(Fp4Ue4m3Value(static_cast<uint8_t>(b))), b) << b;
  }
  EXPECT_TRUE(std::isnan(Fp4Ue4m3Value(0x7f)));
  for (int b = 0; b < 0x7e; ++b) {  // midpoints between neighbours: the even byte
    const float lo = Fp4Ue4m3Value(static_cast<uint8_t>(b));
    const float hi = Fp4Ue4m3Value(static_cast<uint8_t>(b + 1));
    const float mid = 0.5f * (lo + hi);
    EXPECT_EQ(Fp4Ue4m3Code(mid), b % 2 == 0 ? b : b + 1) << b;
    EXPECT_EQ(Fp4Ue4m3Code(std::nextafter(mid, 0.0f)), b) << b;
    EXPECT_EQ(Fp4Ue4m3Code(std::nextafter(mid, 1e9f)), b + 1) << b;
  }
  Rng rng(11);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::fabs(RandomFloat(rng, -14.0f, 10.0f));
    EXPECT_EQ(Fp4Ue4m3Code(v), BruteUe4m3(v)) << v;
  }
  EXPECT_EQ(Fp4Ue4m3Code(448.0f), 0x7e);
  EXPECT_EQ(Fp4Ue4m3Code(1e20f), 0x7e);
  EXPECT_EQ(Fp4Ue4m3Code(0.0f), 0);
  EXPECT_EQ(Fp4Ue4m3Code(-1.0f), 0);
  EXPECT_EQ(Fp4Ue4m3Code(std::ldexp(1.0f, -11)), 0);  // below half the smallest subnormal
  EXPECT_EQ(Fp4Ue4m3Code(std::ldexp(1.0f, -10)), 0);  // exactly half: ties to 0
}

// The block rule written out: sx = nearest ue4m3 to amax / 6, codes = nearest e2m1 to x / sx.
TEST(Fp4RulesTest, QuantizeBlockFollowsTheContract) {
  Rng rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    float x[16];
    const float lo = -8.0f + static_cast<float>(trial % 12), hi = lo + 6.0f;
    for (float& v : x) v = RandomFloat(rng, lo, hi);
    if (trial % 7 == 0) x[trial % 16] = 0.0f;
    uint8_t codes[8];
    const uint8_t sb = Fp4QuantizeBlock(x, 16, codes);
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    ASSERT_EQ(sb, BruteUe4m3(amax / 6.0f)) << trial;
    const float s = Fp4Ue4m3Value(sb);
    for (int i = 0; i < 16; ++i) {
      const int code = (codes[i / 2] >> (4 * (i % 2))) & 15;
      if (sb == 0) {
        EXPECT_EQ(code, 0);
        continue;
      }
      const float scaled = x[i] * (1.0f / s);
      EXPECT_EQ(code & 7, BruteE2m1Mag(std::fabs(scaled))) << trial << " " << i;
      // The code is within half a step of x / s (saturation aside): the quantization error.
      if (std::fabs(scaled) <= 6.0f) {
        EXPECT_LE(std::fabs(Fp4E2m1Value(static_cast<uint8_t>(code)) * s - x[i]),
                  1.0f * s + 1e-30f);
      }
    }
  }
}

TEST(Fp4RulesTest, QuantizeBlockEdgeCases) {
  float zeros[16] = {};
  uint8_t codes[8];
  EXPECT_EQ(Fp4QuantizeBlock(zeros, 16, codes), 0);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
  // amax = 6 * 448 or more: the largest scale, codes saturate at 6.
  float big[16];
  for (int i = 0; i < 16; ++i) big[i] = (i % 2 ? -1.0f : 1.0f) * 5000.0f;
  EXPECT_EQ(Fp4QuantizeBlock(big, 16, codes), 0x7e);
  for (uint8_t c : codes) EXPECT_EQ(c, 0xf7);  // +6 low nibble, -6 high nibble
  // A partial block: elements past count are 0.
  float part[16];
  for (int i = 0; i < 16; ++i) part[i] = 3.0f;
  const uint8_t sb = Fp4QuantizeBlock(part, 5, codes);
  EXPECT_EQ(sb, BruteUe4m3(0.5));
  EXPECT_EQ(codes[0], 0x77);
  EXPECT_EQ(codes[1], 0x77);
  EXPECT_EQ(codes[2], 0x07);
  for (int i = 3; i < 8; ++i) EXPECT_EQ(codes[i], 0);
}

TEST(GemvQuantFp4HostTest, MatchesTheContractWrittenOut) {
  const int64_t m = 3, n = 5, k = 64, ld_bytes = k / 2 + 16, scale_ld = k / 16 + 2;
  const int64_t ldx = k + 3, ldy = n + 2;
  Rng rng(5);
  std::vector<float> x(static_cast<size_t>(m * ldx));
  for (float& v : x) v = RandomFloat(rng, -4.0f, 3.0f);
  std::vector<uint8_t> w(static_cast<size_t>(n * ld_bytes)), sc(static_cast<size_t>(n * scale_ld));
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng.Next());
  for (uint8_t& b : sc) b = static_cast<uint8_t>(rng.Next() % 0x7f);  // bit 7 clear, no NaN
  const float gs = 0.625f;
  std::vector<float> y(static_cast<size_t>(m * ldy), 1.5f);
  ASSERT_TRUE(GemvQuantFp4Host(m, x.data(), ldx, w.data(), ld_bytes, sc.data(), scale_ld, gs, n, k,
                               y.data(), ldy, /*accumulate=*/true)
                  .ok());
  for (int64_t tok = 0; tok < m; ++tok) {
    for (int64_t r = 0; r < n; ++r) {
      double sum = 0.0;
      for (int64_t b = 0; b < k / 16; ++b) {
        const float* xb = x.data() + tok * ldx + b * 16;
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const int sx = BruteUe4m3(amax / 6.0f);
        for (int i = 0; i < 16; ++i) {
          const int64_t kk = b * 16 + i;
          const float xs = sx == 0 ? 0.0f : xb[i] * (1.0f / static_cast<float>(SpecUe4m3(sx)));
          const double xq = (std::signbit(xs) ? -1.0 : 1.0) *
                            kE2m1Mag[BruteE2m1Mag(std::fabs(xs))] * SpecUe4m3(sx);
          const uint8_t byte = w[r * ld_bytes + kk / 2];
          const int c = (kk % 2) ? byte >> 4 : byte & 15;
          const double wq =
              ((c & 8) ? -1.0 : 1.0) * kE2m1Mag[c & 7] * SpecUe4m3(sc[r * scale_ld + kk / 16]);
          sum += xq * wq;
        }
      }
      EXPECT_EQ(y[tok * ldy + r], 1.5f + static_cast<float>(sum) * gs) << tok << " " << r;
    }
    for (int64_t r = n; r < ldy; ++r) EXPECT_EQ(y[tok * ldy + r], 1.5f);  // gap untouched
  }
}

TEST(GemvQuantFp4HostTest, RejectsBadShapes) {
  std::vector<float> x(64), y(4);
  std::vector<uint8_t> w(64), sc(8);
  EXPECT_EQ(GemvQuantFp4Host(17, x.data(), 64, w.data(), 32, sc.data(), 4, 1.0f, 1, 64, y.data(), 1,
                             false)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      GemvQuantFp4Host(1, x.data(), 48, w.data(), 24, sc.data(), 3, 1.0f, 1, 48, y.data(), 1, false)
          .code(),
      absl::StatusCode::kInvalidArgument);  // k not a multiple of 32
  EXPECT_EQ(
      GemvQuantFp4Host(1, x.data(), 64, w.data(), 16, sc.data(), 4, 1.0f, 1, 64, y.data(), 1, false)
          .code(),
      absl::StatusCode::kInvalidArgument);  // ld_bytes < k / 2
  EXPECT_EQ(
      GemvQuantFp4Host(1, nullptr, 64, w.data(), 32, sc.data(), 4, 1.0f, 1, 64, y.data(), 1, false)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace glm::kernels
