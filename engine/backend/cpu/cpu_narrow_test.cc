// Narrow weights on the CPU backend (cpu_narrow.h): the element conversions against brute-force
// references (every e4m3 code, ties, saturation, NaN; bf16 ties), and Linear / MoeExperts with
// bf16 and fp8 block-scaled weights against a straightforward host reference written here
// independently (weights widened from the generated values, x rounded to bf16 and for fp8
// quantized per row per 128 columns, sums in double). Shapes include K not a multiple of 128
// (partial activation group and weight block), rows not multiples of the tiles, padded row
// strides with NaN padding (must never be read), guards around y, accumulate on and off. The
// narrow Linear must also equal, bit for bit, the fp32 Linear on the effective x and the widened
// weight (it is that kernel on widened tiles), whatever the thread count.
#include "engine/backend/cpu/cpu_narrow.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"

namespace glm::engine {
namespace {

constexpr float kGuard = 12345.0f;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// e4m3fn value of code c (0..255), computed from the format definition.
double E4m3Value(int c) {
  const int e = (c >> 3) & 0xf, m = c & 7;
  double a = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  if (e == 0xf && m == 7) a = std::numeric_limits<double>::quiet_NaN();
  return (c & 0x80) != 0 ? -a : a;
}

// Brute force: the nearest finite e4m3 (ties: even code), beyond 448 -> 448, NaN -> 0x7f.
uint8_t RefToE4m3(float v) {
  const uint8_t sign = (Bits(v) >> 24) & 0x80;
  if (std::isnan(v)) return sign | 0x7f;
  static const std::vector<double> values = [] {
    std::vector<double> t(0x7f);
    for (int c = 0; c < 0x7f; ++c) t[c] = E4m3Value(c);
    return t;
  }();
  const double a = std::fabs(static_cast<double>(v));
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x7f; ++c) {
    const double d = std::fabs(a - values[c]);
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

// Brute force bf16 rounding: nearest of the two bf16 neighbours, ties to even.
float RefBf16(float v) {
  const uint32_t u = Bits(v);
  const float lo = FromBits(u & 0xffff0000u);
  const float hi = FromBits((u & 0xffff0000u) + 0x10000u);
  const double dl = std::fabs(double(v) - lo), dh = std::fabs(double(hi) - v);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return ((u >> 16) & 1u) == 0 ? lo : hi;
}

TEST(CpuNarrow, E4m3DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const double want = E4m3Value(c);
    const float got = cpu::E4m3ToFloat(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
    }
  }
}

TEST(CpuNarrow, E4m3EncodeMatchesBruteForce) {
  std::vector<float> vs = {0.0f, -0.0f, 1e-30f, -1e-30f, 447.9f, 448.0f, 449.0f, 464.0f, 470.0f,
                           1e6f, -1e6f, std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min()};
  // Every code, every midpoint between neighbours (the ties) and one ulp either side of it.
  for (int c = 0; c < 0x7e; ++c) {
    const float a = static_cast<float>(E4m3Value(c)), b = static_cast<float>(E4m3Value(c + 1));
    const float mid = static_cast<float>((double(a) + b) / 2);
    for (float v : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      vs.push_back(v);
      vs.push_back(-v);
    }
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ex(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) vs.push_back((i % 2 ? 1.0f : -1.0f) * std::exp2(ex(rng)));
  for (float v : vs) {
    EXPECT_EQ(cpu::FloatToE4m3Sat(v), RefToE4m3(v)) << v;
  }
}

TEST(CpuNarrow, Bf16RoundingMatchesBruteForce) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    uint32_t u = bits(rng);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float v = FromBits(u);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(cpu::RoundToBf16(v)));
      continue;
    }
    if (std::isinf(v) || std::fabs(v) > 3.38e38f) continue;  // rounding past FLT_MAX
    EXPECT_EQ(Bits(cpu::RoundToBf16(v)), Bits(RefBf16(v))) << v;
  }
  EXPECT_EQ(cpu::Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(cpu::Bf16ToFloat(0xc000), -2.0f);
}

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A narrow weight [rows, cols] in host memory (the cpu backend's memory) plus its fp32 values
// computed here from the definition.
struct Weight {
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> fp8;
  std::vector<float> scales;
  MatView view;
  std::vector<float> deq;  // [rows, cols]
};

Weight MakeWeight(WeightDType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weight w;
  const std::vector<float> v = Random(rows * cols, rng, 1.0f / std::sqrt(float(cols)));
  w.deq.resize(rows * cols);
  if (dtype == WeightDType::kBF16) {
    const int64_t ld = (cols + 7) / 8 * 8 + 8;  // padding: NaN (must never be read)
    w.bf16.assign(rows * ld, 0x7fc0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float f = RefBf16(v[r * cols + c]);
        w.deq[r * cols + c] = f;
        w.bf16[r * ld + c] = static_cast<uint16_t>(Bits(f) >> 16);
      }
    }
    w.view = {reinterpret_cast<float*>(w.bf16.data()), rows, cols, ld};
  } else {
    const int64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
    const int64_t sld = (scols + 3) / 4 * 4;
    w.scales.assign(srows * sld, std::numeric_limits<float>::quiet_NaN());
    std::uniform_real_distribution<float> sd(0.5f, 2.0f);
    for (int64_t i = 0; i < srows; ++i) {
      for (int64_t j = 0; j < scols; ++j) w.scales[i * sld + j] = sd(rng) / 448.0f;
    }
    const int64_t ld = cols + 5;
    w.fp8.assign(rows * ld, 0x7f);  // padding: NaN
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float sc = w.scales[(r / 128) * sld + c / 128];
        const uint8_t q = RefToE4m3(v[r * cols + c] * 100.0f / (sc * 448.0f));
        w.fp8[r * ld + c] = q;
        w.deq[r * cols + c] = static_cast<float>(E4m3Value(q)) * sc;
      }
    }
    w.view = {reinterpret_cast<float*>(w.fp8.data()), rows, cols, ld};
    w.view.scales = w.scales.data();
    w.view.scale_ld = sld;
  }
  w.view.dtype = dtype;
  return w;
}

// x as the narrow Linear multiplies it, straightforwardly: bf16; for fp8 per row per 128
// columns scale = amax / 448, e4m3(x / scale) * scale.
std::vector<float> RefEffectiveX(WeightDType dtype, const std::vector<float>& x, int64_t m,
                                 int64_t k, int64_t ldx) {
  std::vector<float> xe(m * k);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) xe[r * k + c] = RefBf16(x[r * ldx + c]);
    if (dtype != WeightDType::kF8E4M3Block128) continue;
    for (int64_t g = 0; g < k; g += 128) {
      float amax = 0.0f;
      for (int64_t c = g; c < std::min(k, g + 128); ++c) {
        amax = std::max(amax, std::fabs(xe[r * k + c]));
      }
      const float scale = amax / 448.0f;
      for (int64_t c = g; c < std::min(k, g + 128); ++c) {
        float& v = xe[r * k + c];
        v = scale > 0.0f ? static_cast<float>(E4m3Value(RefToE4m3(v / scale))) * scale : 0.0f;
      }
    }
  }
  return xe;
}

const char* Name(WeightDType d) { return d == WeightDType::kBF16 ? "bf16" : "fp8"; }

TEST(CpuNarrow, EffectiveXMatchesReference) {
  std::mt19937 rng(11);
  for (WeightDType dtype : {WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    for (int64_t k : {1, 16, 127, 128, 129, 300}) {
      const int64_t m = 5, ldx = k + 2;
      std::vector<float> x = Random(m * ldx, rng, 3.0f);
      for (int64_t c = 0; c < std::min<int64_t>(k, 130); ++c) x[2 * ldx + c] = 0.0f;  // zero group
      const std::vector<float> want = RefEffectiveX(dtype, x, m, k, ldx);
      std::vector<float> got(m * k);
      cpu::EffectiveLinearX(dtype, x.data(), ldx, m, k, got.data());
      for (int64_t i = 0; i < m * k; ++i) {
        ASSERT_EQ(Bits(got[i]), Bits(want[i])) << Name(dtype) << " k=" << k << " i=" << i;
      }
    }
  }
}

TEST(CpuNarrow, SupportsEveryWeightDType) {
  CpuBackend b(1);
  EXPECT_TRUE(b.SupportsWeightDType(WeightDType::kF32));
  EXPECT_TRUE(b.SupportsWeightDType(WeightDType::kBF16));
  EXPECT_TRUE(b.SupportsWeightDType(WeightDType::kF8E4M3Block128));
}

TEST(CpuNarrow, LinearMatchesHostReference) {
  CpuBackend b3(3), b1(1);
  std::mt19937 rng(7);
  for (WeightDType dtype : {WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    for (int64_t M : {1, 4, 5, 70}) {
      for (int64_t N : {1, 33, 130}) {
        for (int64_t K : {8, 128, 200, 300}) {
          for (bool acc : {false, true}) {
            const std::string what = std::string(Name(dtype)) + " M=" + std::to_string(M) +
                                     " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                     " acc=" + std::to_string(acc);
            const Weight w = MakeWeight(dtype, N, K, rng);
            const int64_t ldx = K + 3, ldy = N + 2;
            std::vector<float> x = Random(M * ldx, rng);
            const std::vector<float> x0 = x;
            const std::vector<float> xe = RefEffectiveX(dtype, x, M, K, ldx);
            std::vector<float> y = Random(M * ldy, rng);
            for (int64_t m = 0; m < M; ++m) y[m * ldy + N] = y[m * ldy + N + 1] = kGuard;
            std::vector<float> y0 = y, y1 = y, yf = y;
            b3.Linear({x.data(), M, K, ldx}, w.view, {y.data(), M, N, ldy}, acc);
            b1.Linear({x.data(), M, K, ldx}, w.view, {y1.data(), M, N, ldy}, acc);
            // The fp32 Linear on the effective x and the widened weight.
            b3.Linear({const_cast<float*>(xe.data()), M, K, K},
                      {const_cast<float*>(w.deq.data()), N, K, K}, {yf.data(), M, N, ldy}, acc);
            ASSERT_EQ(x, x0) << what << ": x modified";
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t n = 0; n < ldy; ++n) {
                const float got = y[m * ldy + n];
                if (n >= N) {
                  ASSERT_EQ(got, kGuard) << what << ": wrote outside the view";
                  continue;
                }
                double ref = acc ? y0[m * ldy + n] : 0.0, mag = std::fabs(ref);
                for (int64_t k = 0; k < K; ++k) {
                  ref += double(xe[m * K + k]) * w.deq[n * K + k];
                  mag += std::fabs(double(xe[m * K + k]) * w.deq[n * K + k]);
                }
                ASSERT_TRUE(std::isfinite(got)) << what;
                ASSERT_NEAR(got, ref, 2e-6 * (1 + mag)) << what << " at " << m << "," << n;
                ASSERT_EQ(Bits(got), Bits(y1[m * ldy + n])) << what << ": thread count matters";
                ASSERT_EQ(Bits(got), Bits(yf[m * ldy + n]))
                    << what << ": differs from the fp32 Linear on the widened operands";
              }
            }
          }
        }
      }
    }
  }
}

TEST(CpuNarrow, MoeExpertsMatchHostReference) {
  CpuBackend b(3);
  std::mt19937 rng(9);
  struct S { int tokens, hidden, inter, experts, top_k; };
  const S shapes[] = {{1, 160, 48, 8, 2}, {5, 200, 48, 8, 3}, {17, 256, 144, 16, 4},
                      {3, 132, 260, 4, 4}, {24, 128, 64, 8, 8}};
  for (WeightDType dtype : {WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    for (const S& s : shapes) {
      const std::string what = std::string(Name(dtype)) + " tokens=" +
                               std::to_string(s.tokens) + " hidden=" + std::to_string(s.hidden) +
                               " inter=" + std::to_string(s.inter);
      std::vector<Weight> g, u, d;
      std::vector<MatView> gv, uv, dv, fg, fu, fd;
      for (int e = 0; e < s.experts; ++e) {
        g.push_back(MakeWeight(dtype, s.inter, s.hidden, rng));
        u.push_back(MakeWeight(dtype, s.inter, s.hidden, rng));
        d.push_back(MakeWeight(dtype, s.hidden, s.inter, rng));
      }
      for (int e = 0; e < s.experts; ++e) {
        gv.push_back(g[e].view), uv.push_back(u[e].view), dv.push_back(d[e].view);
        fg.push_back({g[e].deq.data(), s.inter, s.hidden, s.hidden});
        fu.push_back({u[e].deq.data(), s.inter, s.hidden, s.hidden});
        fd.push_back({d[e].deq.data(), s.hidden, s.inter, s.inter});
      }
      std::vector<int32_t> ids;
      for (int t = 0; t < s.tokens; ++t) {
        std::vector<int32_t> perm(s.experts);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        ids.insert(ids.end(), perm.begin(), perm.begin() + s.top_k);
      }
      std::vector<float> wts(s.tokens * s.top_k);
      std::uniform_real_distribution<float> ud(0.f, 1.f);
      for (float& v : wts) v = ud(rng);
      const std::vector<float> x = Random(size_t(s.tokens) * s.hidden, rng);
      const std::vector<float> out0 = Random(size_t(s.tokens) * s.hidden, rng);
      std::vector<float> out = out0, outf = out0;
      b.MoeExperts(MatView{const_cast<float*>(x.data()), s.tokens, s.hidden, s.hidden},
                   ids.data(), wts.data(), s.top_k,
                   ExpertWeights{gv.data(), uv.data(), dv.data(), s.experts},
                   MatView{out.data(), s.tokens, s.hidden, s.hidden});
      b.MoeExperts(MatView{const_cast<float*>(x.data()), s.tokens, s.hidden, s.hidden},
                   ids.data(), wts.data(), s.top_k,
                   ExpertWeights{fg.data(), fu.data(), fd.data(), s.experts},
                   MatView{outf.data(), s.tokens, s.hidden, s.hidden});
      // Reference in double: x fp32 (not rounded), widened weights.
      double max_diff = 0, max_ref = 1;
      for (int t = 0; t < s.tokens; ++t) {
        std::vector<double> ref(out0.begin() + t * s.hidden, out0.begin() + (t + 1) * s.hidden);
        for (int j = 0; j < s.top_k; ++j) {
          const int e = ids[t * s.top_k + j];
          std::vector<double> act(s.inter);
          for (int i = 0; i < s.inter; ++i) {
            double gs = 0, us = 0;
            for (int k = 0; k < s.hidden; ++k) {
              gs += double(x[t * s.hidden + k]) * g[e].deq[i * s.hidden + k];
              us += double(x[t * s.hidden + k]) * u[e].deq[i * s.hidden + k];
            }
            act[i] = gs / (1 + std::exp(-gs)) * us;
          }
          for (int h = 0; h < s.hidden; ++h) {
            double acc = 0;
            for (int i = 0; i < s.inter; ++i) acc += act[i] * d[e].deq[h * s.inter + i];
            ref[h] += wts[t * s.top_k + j] * acc;
          }
        }
        for (int h = 0; h < s.hidden; ++h) {
          const float got = out[t * s.hidden + h];
          ASSERT_TRUE(std::isfinite(got)) << what;
          max_ref = std::max(max_ref, std::fabs(ref[h]));
          max_diff = std::max(max_diff, std::fabs(got - ref[h]));
          ASSERT_EQ(Bits(got), Bits(outf[t * s.hidden + h]))
              << what << ": differs from fp32 MoeExperts on the widened weights";
        }
      }
      EXPECT_LE(max_diff, 1e-5 * max_ref) << what;
    }
  }
}

// AbsorbPerHead (MLA W_UK / W_UV on kv_b_proj as stored): bit for bit the fp32 LinearPerHead on
// the widened weight (kCols) and on its per-head transpose (kRows: the fp32 model's w_uk_t), at
// 1 and 3 threads; and within fp32 rounding of a double reference. Weights bf16 / fp8 (rows
// padded with NaN; head blocks straddling 128-row scale blocks; columns not a multiple of 128) and
// fp32; heads 1, 3, 64; tokens 1, 3, 8, 64; strided x and y with guards between heads.
TEST(CpuNarrow, AbsorbPerHeadMatchesFp32LinearPerHead) {
  CpuBackend b3(3), b1(1);
  std::mt19937 rng(21);
  constexpr int64_t kNope = 37, kV = 45, kHeadRows = kNope + kV;
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    const int64_t cols = dtype == WeightDType::kF8E4M3Block128 ? 144 : 200;
    for (int64_t heads : {1, 3, 64}) {
      Weight w;
      if (dtype == WeightDType::kF32) {
        w.deq = Random(heads * kHeadRows * cols, rng, 0.1f);
        w.view = {w.deq.data(), heads * kHeadRows, cols, cols};
      } else {
        w = MakeWeight(dtype, heads * kHeadRows, cols, rng);
      }
      // The fp32 model's copies: W_UK^T [heads, cols, nope] and the widened weight.
      std::vector<float> uk_t(heads * cols * kNope);
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < kNope; ++d) {
          for (int64_t c = 0; c < cols; ++c) {
            uk_t[(h * cols + c) * kNope + d] = w.deq[(h * kHeadRows + d) * cols + c];
          }
        }
      }
      for (int64_t tokens : {1, 3, 8, 64}) {
        for (Backend::PerHeadContract contract :
             {Backend::PerHeadContract::kRows, Backend::PerHeadContract::kCols}) {
          const bool rows = contract == Backend::PerHeadContract::kRows;
          const int64_t in = rows ? kNope : cols, out = rows ? cols : kV;
          const int64_t row_begin = rows ? 0 : kNope;
          const std::string what = std::string(dtype == WeightDType::kF32 ? "fp32" : Name(dtype)) +
                                   (rows ? " kRows" : " kCols") + " heads=" +
                                   std::to_string(heads) + " tokens=" + std::to_string(tokens);
          const int64_t xhs = in + 1, xrs = heads * xhs + 2, yhs = out + 2, yrs = heads * yhs;
          const std::vector<float> x = Random(tokens * xrs, rng);
          std::vector<float> y(tokens * yrs, kGuard), y1 = y, yf = y;
          const HeadsView xv{const_cast<float*>(x.data()), tokens, heads, in, xrs, xhs};
          b3.AbsorbPerHead(xv, w.view, kHeadRows, row_begin, contract,
                           {y.data(), tokens, heads, out, yrs, yhs});
          b1.AbsorbPerHead(xv, w.view, kHeadRows, row_begin, contract,
                           {y1.data(), tokens, heads, out, yrs, yhs});
          if (rows) {
            b3.LinearPerHead(xv, uk_t.data(), cols * kNope, kNope,
                             {yf.data(), tokens, heads, out, yrs, yhs});
          } else {
            b3.LinearPerHead(xv, w.deq.data() + kNope * cols, kHeadRows * cols, cols,
                             {yf.data(), tokens, heads, out, yrs, yhs});
          }
          for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t h = 0; h < heads; ++h) {
              for (int64_t n = 0; n < yhs; ++n) {
                const float got = y[t * yrs + h * yhs + n];
                if (n >= out) {
                  ASSERT_EQ(got, kGuard) << what << ": wrote outside the view";
                  continue;
                }
                ASSERT_EQ(Bits(got), Bits(yf[t * yrs + h * yhs + n]))
                    << what << ": differs from LinearPerHead on the widened weight at " << t
                    << "," << h << "," << n;
                ASSERT_EQ(Bits(got), Bits(y1[t * yrs + h * yhs + n])) << what << ": threads";
                if (h > 2 && h != heads - 1) continue;  // the double reference on a few heads
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < in; ++k) {
                  const double wv = rows ? w.deq[(h * kHeadRows + k) * cols + n]
                                         : w.deq[(h * kHeadRows + kNope + n) * cols + k];
                  ref += double(x[t * xrs + h * xhs + k]) * wv;
                  mag += std::fabs(double(x[t * xrs + h * xhs + k]) * wv);
                }
                ASSERT_TRUE(std::isfinite(got)) << what;
                ASSERT_NEAR(got, ref, 2e-6 * (1 + mag)) << what << " at " << t << "," << h;
              }
            }
          }
        }
      }
    }
  }
}

// AbsorbPerHead over a whole weight as one head (MLA's expanded form: kvx = lat . kv_b^T with
// weight-only numerics; the NarrowLinear fast path): bit for bit the fp32 Linear on the widened
// weight, at 1 and 3 threads, for decode-size and prefill-size row counts.
TEST(CpuNarrow, AbsorbPerHeadWholeWeightEqualsFp32Linear) {
  CpuBackend b3(3), b1(1);
  std::mt19937 rng(23);
  for (WeightDType dtype : {WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    const int64_t rows = 3 * 82, cols = dtype == WeightDType::kBF16 ? 200 : 144;
    const Weight w = MakeWeight(dtype, rows, cols, rng);
    for (int64_t tokens : {1, 3, 4, 70}) {
      const int64_t ldx = cols + 64, ldy = rows + 1;
      const std::vector<float> x = Random(tokens * ldx, rng);
      std::vector<float> y(tokens * ldy, kGuard), y1 = y, yf = y;
      const HeadsView xv{const_cast<float*>(x.data()), tokens, 1, cols, ldx, 0};
      b3.AbsorbPerHead(xv, w.view, rows, 0, Backend::PerHeadContract::kCols,
                       {y.data(), tokens, 1, rows, ldy, 0});
      b1.AbsorbPerHead(xv, w.view, rows, 0, Backend::PerHeadContract::kCols,
                       {y1.data(), tokens, 1, rows, ldy, 0});
      b3.Linear({const_cast<float*>(x.data()), tokens, cols, ldx},
                {const_cast<float*>(w.deq.data()), rows, cols, cols}, {yf.data(), tokens, rows, ldy},
                false);
      for (int64_t i = 0; i < tokens * ldy; ++i) {
        ASSERT_EQ(Bits(y[i]), Bits(yf[i])) << Name(dtype) << " tokens=" << tokens << " i=" << i;
        ASSERT_EQ(Bits(y[i]), Bits(y1[i])) << Name(dtype) << " threads, i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace glm::engine
