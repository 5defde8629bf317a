// GemvQuantPlan and DequantizeToBf16 on the GPU against the host mirrors, on weights packed here
// bit by bit as ../shared/specs/quantized-checkpoints.md §1.4-1.5 / §2.3-2.4 lay them out, and
// the host mirrors against a decoder written here from the spec (no GPU needed for those).
// Tolerance of the GEMV: the kernel and GemvQuantHost multiply the same exact products
// (bf16(x) times an exactly dequantized weight; see gemv_quant.cuh); the host sums them in
// double, the GPU in fp32 (MMA partial sums, then one add per 64-byte window or hi/lo product,
// then the split-K adds), so |y - ref| is bounded by about (k / 16 + splits) * 2^-24 * L1 with
// L1 = Σ |x w| (tensor cores may truncate rather than round inside an MMA: a few ulps more):
// 2e-5 * L1 covers k up to ~5000 inputs by the worst-case bound and far more by the random-walk
// one; plus 1e-6 * |y0| for the final add into y when accumulating. The largest |y - ref| / L1
// seen is printed.
// Sweep: m 1/2/5/16, n 1/37/200/576 (partial 16-row and 128-row tiles), k with partial windows,
// every format, groups 16/32/128 and channel, accumulate on/off, strided y with guard bytes
// and its gap columns checked untouched; repeated launches give the same bits.
#include "kernels/gemv_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"

namespace glm::kernels {
namespace {

using testing::Bf16ToFloat;
using testing::FloatToBf16;
using testing::GuardedBuffer;
using Rng = testing::XorShiftRng;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Decoders written from the spec, independent of gemv_quant.cuh's.
float SpecE2m1(int code) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
float SpecE4m3(uint8_t b) {
  const int e = (b >> 3) & 15, man = b & 7;
  const double v = e == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, e - 7);
  return static_cast<float>((b & 0x80) ? -v : v);
}

// A packed weight on the host and on the device.
struct Packed {
  QuantWeightView host;  // host pointers into the vectors below
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;  // bf16 (2 bytes each) or e4m3
  std::vector<int> codes;       // [n, k] the codes as packed (u for int, e2m1 code for nvfp4)
  std::unique_ptr<GuardedBuffer> d_data, d_scales;

  QuantWeightView Device() const {
    QuantWeightView v = host;
    v.data = d_data->data();
    v.scales = d_scales->data();
    return v;
  }
  // W[r][kk] from the spec's formula (no global scale).
  float SpecValue(int64_t r, int64_t kk) const {
    const int64_t group = std::min(host.group_size, host.cols);
    if (host.format == QuantFormat::kNvfp4) {
      return SpecE2m1(codes[r * host.cols + kk]) *
             SpecE4m3(scales[r * host.scale_ld + kk / 16]);
    }
    uint16_t s;
    std::memcpy(&s, scales.data() + 2 * (r * host.scale_ld + kk / group), 2);
    const int q = codes[r * host.cols + kk] - (host.format == QuantFormat::kInt4 ? 8 : 128);
    return static_cast<float>(q) * Bf16ToFloat(s);
  }
};

// Random codes packed per the spec: int: element kk at bit offset bits * (kk mod (32 / bits))
// of little-endian int32 word kk / (32 / bits); nvfp4: element 2i in the low nibble of byte i.
// Scales: int bf16 with random 8-bit mantissas (q * s is then often not a bf16), nvfp4 any
// e4m3 but NaN. Rows padded to ld_bytes = row bytes + pad_bytes (garbage in the padding).
Packed MakePacked(QuantFormat f, int64_t n, int64_t k, int64_t group, uint64_t seed,
                  int64_t pad_bytes = 0) {
  Rng rng(seed);
  Packed p;
  QuantWeightView& v = p.host;
  v.format = f;
  v.rows = n;
  v.cols = k;
  v.group_size = group;
  const int bits = v.bits();
  v.ld_bytes = k * bits / 8 + pad_bytes;
  v.scale_ld = CeilDiv(k, std::min(group, k)) + 1;
  v.global_scale = f == QuantFormat::kNvfp4 ? 0.3712f : 1.0f;
  p.data.resize(static_cast<size_t>(n * v.ld_bytes));
  for (auto& b : p.data) b = static_cast<uint8_t>(rng.Next());
  p.codes.resize(static_cast<size_t>(n * k));
  const int per_word = 32 / bits;
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* row = p.data.data() + r * v.ld_bytes;
    for (int64_t kk = 0; kk < k; ++kk) {
      const int code = static_cast<int>(rng.Next() & ((1u << bits) - 1));
      p.codes[r * k + kk] = code;
      uint32_t word;
      std::memcpy(&word, row + 4 * (kk / per_word), 4);
      const int off = bits * static_cast<int>(kk % per_word);
      word = (word & ~(((1u << bits) - 1) << off)) | (static_cast<uint32_t>(code) << off);
      std::memcpy(row + 4 * (kk / per_word), &word, 4);
    }
  }
  const size_t sbytes = f == QuantFormat::kNvfp4 ? 1 : 2;
  p.scales.resize(static_cast<size_t>(n * v.scale_ld) * sbytes);
  for (int64_t i = 0; i < n * v.scale_ld; ++i) {
    if (f == QuantFormat::kNvfp4) {
      uint8_t b;
      do {
        b = static_cast<uint8_t>(rng.Next());
      } while ((b & 0x7f) == 0x7f);
      p.scales[i] = b;
    } else {
      // bf16 in [2^-9, 2^-5) with a random mantissa, random sign.
      const uint16_t s = static_cast<uint16_t>(((rng.Next() & 1) << 15) |
                                               ((118 + rng.Next() % 4) << 7) | (rng.Next() & 0x7f));
      std::memcpy(p.scales.data() + 2 * i, &s, 2);
    }
  }
  v.data = p.data.data();
  v.scales = p.scales.data();
  return p;
}

bool Upload(Packed& p) {
  p.d_data = std::make_unique<GuardedBuffer>(p.data.size());
  p.d_scales = std::make_unique<GuardedBuffer>(p.scales.size());
  return p.d_data->ok() && p.d_scales->ok() &&
         p.d_data->Upload(p.data.data(), p.data.size()) == cudaSuccess &&
         p.d_scales->Upload(p.scales.data(), p.scales.size()) == cudaSuccess;
}

// --- Host mirrors against the spec (no GPU). ---

TEST(GemvQuantHostTest, DequantizeMatchesSpecDecoder) {
  for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kInt8, QuantFormat::kNvfp4}) {
    for (int64_t group : {16, 32, 128, 4096}) {
      if (f == QuantFormat::kNvfp4 && group != 16) continue;
      const int64_t n = 5, k = 256;
      Packed p = MakePacked(f, n, k, group, 7 + group, 16);
      std::vector<float> out(static_cast<size_t>(n * k));
      ASSERT_TRUE(DequantizeQuantHost(p.host, out.data(), k).ok());
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t kk = 0; kk < k; ++kk) {
          float want = p.SpecValue(r, kk);
          if (f == QuantFormat::kNvfp4) want *= p.host.global_scale;
          ASSERT_EQ(out[r * k + kk], want)
              << QuantFormatName(f) << " group " << group << " at " << r << "," << kk;
        }
      }
    }
  }
}

TEST(GemvQuantHostTest, E2m1AndE4m3Tables) {
  // Every e4m3 byte but NaN decodes as the spec formula; 0x7e is 448, 0x01 is 2^-9.
  Packed p = MakePacked(QuantFormat::kNvfp4, 1, 32, 16, 3);
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    p.scales[0] = static_cast<uint8_t>(b);
    for (int c = 0; c < 16; ++c) {
      // Element 0 (low nibble of byte 0) takes code c.
      p.data[0] = static_cast<uint8_t>((p.data[0] & 0xf0) | c);
      p.codes[0] = c;
      p.host.global_scale = 1.0f;
      std::vector<float> out(32);
      ASSERT_TRUE(DequantizeQuantHost(p.host, out.data(), 32).ok());
      ASSERT_EQ(out[0], SpecE2m1(c) * SpecE4m3(static_cast<uint8_t>(b))) << b << " " << c;
    }
  }
  EXPECT_EQ(SpecE4m3(0x7e), 448.0f);
  EXPECT_EQ(SpecE4m3(0x01), std::ldexp(1.0f, -9));
}

TEST(GemvQuantPlanTest, RefusesBadShapes) {
  const DeviceLimits h200 = H200Limits();
  QuantWeightView w;
  w.format = QuantFormat::kInt4;
  w.rows = 64;
  w.cols = 256;
  w.group_size = 128;
  w.ld_bytes = 128;
  w.scale_ld = 2;
  EXPECT_TRUE(PlanGemvQuant(1, w, h200).ok());
  EXPECT_FALSE(PlanGemvQuant(17, w, h200).ok());
  EXPECT_FALSE(PlanGemvQuant(-1, w, h200).ok());
  QuantWeightView bad = w;
  bad.cols = 240;  // int4 needs k % 32 == 0
  bad.scale_ld = 2;
  EXPECT_FALSE(PlanGemvQuant(1, bad, h200).ok());
  bad = w;
  bad.group_size = 8;
  EXPECT_FALSE(PlanGemvQuant(1, bad, h200).ok());
  bad = w;
  bad.ld_bytes = 120;  // < row bytes and not a multiple of 16
  EXPECT_FALSE(PlanGemvQuant(1, bad, h200).ok());
  bad = w;
  bad.scale_ld = 1;  // < ceil(256 / 128)
  EXPECT_FALSE(PlanGemvQuant(1, bad, h200).ok());
  bad = w;
  bad.format = QuantFormat::kNvfp4;
  bad.group_size = 32;  // nvfp4 is 16 inputs per scale
  EXPECT_FALSE(PlanGemvQuant(1, bad, h200).ok());
  bad.group_size = 16;
  bad.scale_ld = 16;
  EXPECT_TRUE(PlanGemvQuant(1, bad, h200).ok());
  bad = w;
  bad.format = QuantFormat::kInt8;
  bad.cols = 248;  // int8 needs k % 16 == 0
  bad.ld_bytes = 256;
  EXPECT_FALSE(PlanGemvQuant(1, bad, h200).ok());
}

TEST(GemvQuantPlanTest, PlansFitTheDevice) {
  for (const DeviceLimits& l : {Gb10Limits(), H200Limits()}) {
    for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kInt8, QuantFormat::kNvfp4}) {
      for (int64_t m : {1, 8, 16}) {
        for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 6144}, {6144, 2048},
                            {24576, 2048}, {576, 6144}, {154880, 6144}}) {
          QuantWeightView w;
          w.format = f;
          w.rows = n;
          w.cols = k;
          w.group_size = f == QuantFormat::kNvfp4 ? 16 : 128;
          w.ld_bytes = k * w.bits() / 8;
          w.scale_ld = k / w.group_size;
          auto t = PlanGemvQuant(m, w, l);
          ASSERT_TRUE(t.ok()) << t.status();
          const int64_t window = f == QuantFormat::kInt8 ? 64 : 128;
          EXPECT_GE(int64_t{t->splits} * t->windows_per_split, CeilDiv(k, window));
          EXPECT_LT(int64_t{t->splits - 1} * t->windows_per_split, CeilDiv(k, window));
          EXPECT_LE(t->smem_bytes, static_cast<size_t>(l.smem_optin_per_block));
          EXPECT_EQ(t->window_scale, f != QuantFormat::kNvfp4);
          EXPECT_EQ(t->partial_bytes,
                    t->splits > 1 ? static_cast<size_t>(t->splits) * m * n * 4 : 0u);
        }
      }
    }
  }
}

// --- GPU. ---

class GemvQuantGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

struct Case {
  QuantFormat f;
  int64_t m, n, k, group;
  bool accumulate;
};

std::string Name(const Case& c) {
  return absl::StrCat(QuantFormatName(c.f), " m=", c.m, " n=", c.n, " k=", c.k,
                      " group=", c.group, c.accumulate ? " acc" : "");
}

double g_max_err_ratio = 0.0;  // the largest |y - ref| / L1 of the GPU cases run

// Runs one case; checks y against GemvQuantHost, guards, gaps and repeatability.
void RunCase(const Case& c, const KernelPolicy& policy = {}) {
  SCOPED_TRACE(Name(c));
  Packed p = MakePacked(c.f, c.n, c.k, c.group, 1000 + c.m * 7 + c.n * 13 + c.k + c.group,
                        c.n % 2 ? 16 : 0);
  ASSERT_TRUE(Upload(p));
  Rng rng(c.m * 31 + c.k);
  const int64_t ldx = c.k + 3, ldy = c.n + 5;
  std::vector<float> x(static_cast<size_t>(c.m * ldx));
  for (auto& v : x) v = rng.Uniform() * 4.0f;
  std::vector<float> y0(static_cast<size_t>(c.m * ldy));
  for (auto& v : y0) v = rng.Uniform();
  std::vector<float> ref = y0;
  ASSERT_TRUE(GemvQuantHost(c.m, x.data(), ldx, p.host, ref.data(), ldy, c.accumulate).ok());
  // L1 = Σ |bf16(x) w| per output.
  std::vector<float> wd(static_cast<size_t>(c.n * c.k));
  ASSERT_TRUE(DequantizeQuantHost(p.host, wd.data(), c.k).ok());
  auto plan = GemvQuantPlan::Create(c.m, p.host, policy);
  ASSERT_TRUE(plan.ok()) << plan.status();
  GuardedBuffer dx(x.size() * 4), dy(y0.size() * 4);
  GuardedBuffer ws(std::max<size_t>(plan->workspace_bytes(), 16));
  GuardedBuffer cnt(std::max<size_t>(plan->num_counters(), 1) * 4);
  ASSERT_TRUE(dx.ok() && dy.ok() && ws.ok() && cnt.ok());
  GLM_CUDA_ASSERT(dx.Upload(x.data(), x.size() * 4));
  GLM_CUDA_ASSERT(dy.Upload(y0.data(), y0.size() * 4));
  GLM_CUDA_ASSERT(cudaMemset(cnt.data(), 0, cnt.bytes()));
  GemvQuantArgs a;
  a.x = dx.as<float>();
  a.ldx = ldx;
  a.w = p.Device();
  a.y = dy.as<float>();
  a.ldy = ldy;
  a.accumulate = c.accumulate;
  ASSERT_TRUE(plan->Run(a, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
  GLM_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> y(y0.size());
  GLM_CUDA_ASSERT(dy.Download(y.data(), y.size() * 4));
  EXPECT_TRUE(dy.GuardsIntact());
  int bad = 0;
  for (int64_t tok = 0; tok < c.m; ++tok) {
    for (int64_t r = 0; r < ldy; ++r) {
      const size_t i = static_cast<size_t>(tok * ldy + r);
      if (r >= c.n) {  // gap columns untouched
        ASSERT_EQ(y[i], y0[i]) << "gap column " << r << " of token " << tok << " written";
        continue;
      }
      double l1 = 0.0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        l1 += std::fabs(static_cast<double>(Bf16ToFloat(FloatToBf16(x[tok * ldx + kk]))) *
                        wd[r * c.k + kk]);
      }
      const double err = std::fabs(static_cast<double>(y[i]) - ref[i]);
      if (!c.accumulate && l1 > 0) g_max_err_ratio = std::max(g_max_err_ratio, err / l1);
      const double tol = 2e-5 * l1 + 1e-6 * std::fabs(y0[i]) + 1e-30;
      if (!(std::fabs(static_cast<double>(y[i]) - ref[i]) <= tol) && bad++ < 5) {
        ADD_FAILURE() << "token " << tok << " row " << r << ": gpu " << y[i] << " host "
                      << ref[i] << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  // Repeat (accumulate off so the result is comparable): same bits; counters left zero.
  if (!c.accumulate) {
    ASSERT_TRUE(
        plan->Run(a, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
    GLM_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> y2(y.size());
    GLM_CUDA_ASSERT(dy.Download(y2.data(), y2.size() * 4));
    EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * 4), 0) << "not deterministic";
  }
  std::vector<int32_t> counters(static_cast<size_t>(std::max<int64_t>(plan->num_counters(), 1)));
  GLM_CUDA_ASSERT(cnt.Download(counters.data(), counters.size() * 4));
  for (int32_t v : counters) EXPECT_EQ(v, 0);
}

TEST_F(GemvQuantGpuTest, SweepMatchesHost) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 128}, {37, 96}, {200, 352}, {576, 2048}};
  for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kInt8, QuantFormat::kNvfp4}) {
    for (int64_t group : {16, 32, 128, 0}) {  // 0: channel (group = k)
      if (f == QuantFormat::kNvfp4 && group != 16) continue;
      for (int64_t m : {1, 2, 5, 16}) {
        for (auto [n, k] : shapes) {
          for (bool acc : {false, true}) {
            if (acc && m != 5 && m != 16) continue;  // accumulate at two token counts
            RunCase({f, m, n, k, group == 0 ? k : group, acc});
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  std::printf("largest |y - ref| / sum |x w| so far: %.3g\n", g_max_err_ratio);
}

TEST_F(GemvQuantGpuTest, LongRowsAndSplits) {
  // GLM-5 expert gate/up width (k 6144) and down (n 6144): many windows per split, split-K.
  for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kInt8, QuantFormat::kNvfp4}) {
    const int64_t group = f == QuantFormat::kNvfp4 ? 16 : 128;
    RunCase({f, 16, 256, 6144, group, false});
    RunCase({f, 1, 640, 2048, group, true});
  }
  std::printf("largest |y - ref| / sum |x w| so far: %.3g\n", g_max_err_ratio);
}

TEST_F(GemvQuantGpuTest, Gb10SharedMemoryCap) {
  KernelPolicy policy;
  policy.smem_cap_bytes = Gb10Limits().smem_optin_per_block;
  policy.max_sms = Gb10Limits().num_sms;
  for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kNvfp4}) {
    RunCase({f, 16, 300, 6144, f == QuantFormat::kNvfp4 ? 16 : 128, false}, policy);
  }
}

TEST_F(GemvQuantGpuTest, DequantizeToBf16MatchesHost) {
  for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kInt8, QuantFormat::kNvfp4}) {
    for (int64_t group : {16, 32, 128, 0}) {
      if (f == QuantFormat::kNvfp4 && group != 16) continue;
      const int64_t n = 77, k = 384, ld_out = k + 8;
      Packed p = MakePacked(f, n, k, group == 0 ? k : group, 55 + group, 32);
      ASSERT_TRUE(Upload(p));
      GuardedBuffer out(static_cast<size_t>(n * ld_out) * 2);
      ASSERT_TRUE(out.ok());
      GLM_CUDA_ASSERT(out.Poison(0x7f));
      ASSERT_TRUE(DequantizeToBf16(p.Device(), out.data(), ld_out, 0).ok());
      GLM_CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<uint16_t> got(static_cast<size_t>(n * ld_out));
      GLM_CUDA_ASSERT(out.Download(got.data(), got.size() * 2));
      EXPECT_TRUE(out.GuardsIntact());
      std::vector<float> want(static_cast<size_t>(n * k));
      ASSERT_TRUE(DequantizeQuantHost(p.host, want.data(), k).ok());
      int bad = 0;
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t kk = 0; kk < ld_out; ++kk) {
          const uint16_t g = got[r * ld_out + kk];
          const uint16_t w = kk < k ? GemvQuantBf16Bits(want[r * k + kk]) : 0x7f7f;
          if (g != w && bad++ < 5) {
            ADD_FAILURE() << QuantFormatName(f) << " group " << group << " at " << r << ","
                          << kk << ": got 0x" << std::hex << g << " want 0x" << w;
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST_F(GemvQuantGpuTest, RunRefusesMismatchAndMisalignment) {
  Packed p = MakePacked(QuantFormat::kInt4, 64, 256, 128, 9);
  ASSERT_TRUE(Upload(p));
  auto plan = GemvQuantPlan::Create(2, p.host);
  ASSERT_TRUE(plan.ok()) << plan.status();
  GuardedBuffer dx(2 * 256 * 4), dy(2 * 64 * 4);
  GemvQuantArgs a;
  a.x = dx.as<float>();
  a.ldx = 256;
  a.w = p.Device();
  a.y = dy.as<float>();
  a.ldy = 64;
  GuardedBuffer ws(std::max<size_t>(plan->workspace_bytes(), 16));
  GuardedBuffer cnt(std::max<size_t>(plan->num_counters(), 1) * 4);
  GLM_CUDA_ASSERT(cudaMemset(cnt.data(), 0, cnt.bytes()));
  EXPECT_TRUE(
      plan->Run(a, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
  GemvQuantArgs b = a;
  b.w.group_size = 32;  // not the plan's shape
  EXPECT_FALSE(
      plan->Run(b, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
  b = a;
  b.w.data = static_cast<const uint8_t*>(a.w.data) + 4;  // not 16-byte aligned
  EXPECT_FALSE(
      plan->Run(b, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
  b = a;
  b.ldy = 63;
  EXPECT_FALSE(
      plan->Run(b, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
  b = a;
  b.x = nullptr;
  EXPECT_FALSE(
      plan->Run(b, ws.data(), ws.bytes(), cnt.as<int32_t>(), plan->num_counters(), 0).ok());
  EXPECT_FALSE(GemvQuantPlan::Create(17, p.host).ok());
  EXPECT_FALSE(DequantizeToBf16(p.Device(), dy.data(), 255, 0).ok());  // ld_out < k
  GLM_CUDA_ASSERT(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace glm::kernels
