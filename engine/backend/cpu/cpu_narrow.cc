#include "engine/backend/cpu/cpu_narrow.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace glm::engine::cpu {
namespace {

constexpr int64_t kGroup = 128;    // activation quantization group == weight block (columns)
constexpr float kE4m3Max = 448.0f;
constexpr int64_t kTileN = 32;     // weight rows widened at a time
constexpr int64_t kChunkM = 64;    // x rows per task

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

const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) {
      const int e = (v >> 3) & 0xf, m = v & 7;
      float a;
      if (e == 0xf && m == 7) {
        a = std::numeric_limits<float>::quiet_NaN();
      } else if (e == 0) {
        a = std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
      } else {
        a = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
      }
      t[v] = (v & 0x80) != 0 ? -a : a;
    }
    return t;
  }();
  return table;
}

// Items per ParallelFor chunk so a chunk carries >= ~64K multiply-adds (as the fp32 ops do).
int64_t MinChunk(int64_t work_per_item) {
  constexpr int64_t kMinWorkPerChunk = 1 << 16;
  return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, work_per_item));
}

// One row of EffectiveLinearX.
void EffectiveRow(WeightDType dtype, const float* x, int64_t k, float* out) {
  if (dtype == WeightDType::kF32) {
    std::memcpy(out, x, k * sizeof(float));
    return;
  }
  for (int64_t c = 0; c < k; ++c) out[c] = RoundToBf16(x[c]);
  if (dtype == WeightDType::kBF16) return;
  // kernels::QuantizeFp8GroupHost on the bf16 values, then e4m3(q) * scale.
  for (int64_t c0 = 0; c0 < k; c0 += kGroup) {
    const int64_t c1 = std::min(k, c0 + kGroup);
    float amax = 0.0f;
    for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(out[c]));
    const float scale = amax / kE4m3Max;
    for (int64_t c = c0; c < c1; ++c) {
      out[c] = scale > 0.0f ? E4m3ToFloat(FloatToE4m3Sat(out[c] / scale)) * scale : 0.0f;
    }
  }
}

}  // namespace

float RoundToBf16(float v) {
  const uint32_t u = Bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return FromBits((u | 0x00400000u) & 0xffff0000u);  // NaN
  return FromBits((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

float Bf16ToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

float E4m3ToFloat(uint8_t v) { return E4m3Table()[v]; }

uint8_t FloatToE4m3Sat(float v) {
  const uint32_t u = Bits(v);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(v)) return sign | 0x7f;
  const float a = std::fabs(v);
  if (a >= kE4m3Max) return sign | 0x7e;  // saturate (inf too)
  if (a < 0.015625f) {                    // below 2^-6: subnormal quantum 2^-9; 8 -> 2^-6 (0x08)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: keep 3 of fp32's 23 mantissa bits, round to nearest even (may carry into exponent).
  const uint32_t ua = Bits(a);
  const uint32_t r = (ua + 0x7ffffu + ((ua >> 20) & 1u)) & 0xfff00000u;
  const int e = static_cast<int>(r >> 23) - 127;  // [-6, 8]
  const uint32_t code = static_cast<uint32_t>(e + 7) << 3 | ((r >> 20) & 7u);
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7e));
}

void EffectiveLinearX(WeightDType dtype, const float* x, int64_t ldx, int64_t m, int64_t k,
                      float* out) {
  for (int64_t r = 0; r < m; ++r) EffectiveRow(dtype, x + r * ldx, k, out + r * k);
}

void WidenWeightRows(const MatView& w, int64_t r0, int64_t n, float* out) {
  const int64_t cols = w.cols;
  switch (w.dtype) {
    case WeightDType::kF32:
      for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * cols, w.Row(r0 + i), cols * 4);
      break;
    case WeightDType::kBF16: {
      const uint16_t* base = reinterpret_cast<const uint16_t*>(w.data);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t* src = base + (r0 + i) * w.ld;
        float* dst = out + i * cols;
        for (int64_t c = 0; c < cols; ++c) dst[c] = Bf16ToFloat(src[c]);
      }
      break;
    }
    case WeightDType::kF8E4M3Block128: {
      const uint8_t* base = reinterpret_cast<const uint8_t*>(w.data);
      const std::array<float, 256>& table = E4m3Table();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        const uint8_t* src = base + r * w.ld;
        const float* srow = w.scales + (r / kGroup) * w.scale_ld;
        float* dst = out + i * cols;
        for (int64_t c0 = 0; c0 < cols; c0 += kGroup) {
          const int64_t c1 = std::min(cols, c0 + kGroup);
          const float sc = srow[c0 / kGroup];
          for (int64_t c = c0; c < c1; ++c) dst[c] = table[src[c]] * sc;
        }
      }
      break;
    }
  }
}

void NarrowLinear(ThreadPool& pool, const MatView& x, const MatView& w, const MatView& y,
                  bool accumulate, NarrowX x_mode, Fp32BlockFn block) {
  const int64_t M = x.rows, N = w.rows, K = x.cols;
  if (M == 0 || N == 0) return;
  // x as multiplied: [M, K] (row stride K) when it changes, else x itself.
  std::vector<float> xe;
  MatView xv = x;
  if (x_mode == NarrowX::kLikeWeight) {
    xe.resize(static_cast<size_t>(M * K));
    pool.ParallelFor(M, MinChunk(4 * K), [&](int64_t begin, int64_t end) {
      EffectiveLinearX(w.dtype, x.Row(begin), x.ld, end - begin, K, xe.data() + begin * K);
    });
    xv = MatView{xe.data(), M, K, K};
  }
  // Tasks: (weight tile tn, x chunk cm), tn-major so consecutive tasks of a chunk of work reuse
  // the widened tile.
  const int64_t tiles_n = (N + kTileN - 1) / kTileN;
  const int64_t chunks_m = (M + kChunkM - 1) / kChunkM;
  const int64_t task_work = K * std::min(M, kChunkM) * std::min(N, kTileN);
  pool.ParallelFor(tiles_n * chunks_m, MinChunk(task_work), [&](int64_t begin, int64_t end) {
    std::vector<float> tile(static_cast<size_t>(std::min(N, kTileN) * K));
    int64_t widened = -1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t tn = t / chunks_m, cm = t % chunks_m;
      const int64_t n0 = tn * kTileN, nr = std::min(kTileN, N - n0);
      if (tn != widened) {
        WidenWeightRows(w, n0, nr, tile.data());
        widened = tn;
      }
      const MatView wt{tile.data(), nr, K, K};
      block(xv, wt, y.Cols(n0, nr), accumulate, cm * kChunkM, std::min(M, (cm + 1) * kChunkM), 0,
            nr);
    }
  });
}

}  // namespace glm::engine::cpu
