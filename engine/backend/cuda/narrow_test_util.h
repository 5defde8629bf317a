// Test setup shared by the CUDA narrow-weight tests (cuda_narrow_test.cc, cuda_moe_test.cc):
// fp32 / bf16 / fp8 e4m3 (128x128 block scales) weights on the device with their dequantized
// fp32 values on the host (the CPU backend's reference operands), expert sets of such weights,
// output guards and bf16 rounding. Header-only, for tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "kernels/quant_fp8_group.h"

namespace glm::engine::narrow_test {

// Guard floats around every output buffer (a write outside the output changes them).
inline constexpr int64_t kGuard = 64;
inline constexpr float kGuardValue = 12345.0f;

// f rounded to bf16 (nearest even), as an fp32 value.
inline float RoundBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t Bf16Bits(float f) {  // f already representable
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

inline const char* DTypeName(WeightDType d) {
  return d == WeightDType::kF32 ? "fp32" : d == WeightDType::kBF16 ? "bf16" : "fp8";
}

inline std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Row layout of a test weight: rows of ceil(cols / values per 16 bytes) 16-byte chunks plus
// pad_chunks more, the padding NaN (a read past the row's cols poisons the result); fp8 scale
// rows of ceil(cols / 128) + scale_pad columns rounded up to 4, the padding scale_pad_value.
struct NarrowLayout {
  int64_t pad_chunks = 0;
  int64_t scale_pad = 0;
  float scale_pad_value = 0.0f;
};

// A weight [rows, cols] on the device and its dequantized fp32 values on the host.
struct NarrowWeight {
  std::unique_ptr<Buffer> data, scales;
  MatView view;
  std::vector<float> deq;  // [rows, cols]
};

// Values ~ N(0, 1 / cols); bf16 rounded; fp8 with scales in [0.5, 2] / 448 and values quantized
// to e4m3 (saturating) at 100x the normal magnitude, so they span the e4m3 range.
inline NarrowWeight MakeNarrowWeight(Backend& gpu, WeightDType dtype, int64_t rows, int64_t cols,
                                     std::mt19937& rng, const NarrowLayout& layout = {}) {
  NarrowWeight w;
  const std::vector<float> v = Random(rows * cols, rng, 1.0f / std::sqrt(float(cols)));
  w.deq.resize(rows * cols);
  const int64_t per_chunk = dtype == WeightDType::kF32 ? 4 : dtype == WeightDType::kBF16 ? 8 : 16;
  const int64_t ld = (cols + per_chunk - 1) / per_chunk * per_chunk + layout.pad_chunks * per_chunk;
  if (dtype == WeightDType::kF32) {
    std::vector<float> h(rows * ld, std::numeric_limits<float>::quiet_NaN());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) h[r * ld + c] = w.deq[r * cols + c] = v[r * cols + c];
    }
    w.data = gpu.Allocate(h.size() * 4);
    gpu.CopyToDevice(w.data->data(), h.data(), h.size() * 4);
  } else if (dtype == WeightDType::kBF16) {
    std::vector<uint16_t> h(rows * ld, 0x7fc0);  // NaN padding
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        w.deq[r * cols + c] = RoundBf16(v[r * cols + c]);
        h[r * ld + c] = Bf16Bits(w.deq[r * cols + c]);
      }
    }
    w.data = gpu.Allocate(h.size() * 2);
    gpu.CopyToDevice(w.data->data(), h.data(), h.size() * 2);
  } else {
    const int64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
    const int64_t sld = (scols + layout.scale_pad + 3) / 4 * 4;
    std::vector<float> s(srows * sld, layout.scale_pad_value);
    std::uniform_real_distribution<float> sd(0.5f, 2.0f);
    for (int64_t i = 0; i < srows; ++i) {
      for (int64_t j = 0; j < scols; ++j) s[i * sld + j] = sd(rng) / 448.0f;
    }
    std::vector<uint8_t> q(rows * ld, 0x7f);  // e4m3 NaN padding
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float sc = s[(r / 128) * sld + c / 128];
        q[r * ld + c] = kernels::FloatToE4m3Sat(v[r * cols + c] * 100.0f / (sc * 448.0f));
        w.deq[r * cols + c] = kernels::E4m3ToFloat(q[r * ld + c]) * sc;
      }
    }
    w.data = gpu.Allocate(q.size());
    gpu.CopyToDevice(w.data->data(), q.data(), q.size());
    w.scales = gpu.Allocate(s.size() * 4);
    gpu.CopyToDevice(w.scales->data(), s.data(), s.size() * 4);
    w.view.scales = w.scales->f32();
    w.view.scale_ld = sld;
  }
  w.view.data = w.data->f32();
  w.view.rows = rows, w.view.cols = cols, w.view.ld = ld;
  w.view.dtype = dtype;
  return w;
}

// Routed experts (gate / up [inter, hidden], down [hidden, inter]) as narrow weights: the device
// views for the CUDA backend, the dequantized host views for the CPU backend.
struct NarrowExperts {
  std::vector<NarrowWeight> g, u, d;
  std::vector<MatView> gv, uv, dv, hg, hu, hd;
  ExpertWeights Device() { return {gv.data(), uv.data(), dv.data(), int32_t(gv.size())}; }
  ExpertWeights Host() { return {hg.data(), hu.data(), hd.data(), int32_t(hg.size())}; }
};

inline NarrowExperts MakeNarrowExperts(Backend& gpu, WeightDType dtype, int experts, int64_t inter,
                                       int64_t hidden, std::mt19937& rng,
                                       const NarrowLayout& layout = {}) {
  NarrowExperts ex;
  for (int e = 0; e < experts; ++e) {
    ex.g.push_back(MakeNarrowWeight(gpu, dtype, inter, hidden, rng, layout));
    ex.u.push_back(MakeNarrowWeight(gpu, dtype, inter, hidden, rng, layout));
    ex.d.push_back(MakeNarrowWeight(gpu, dtype, hidden, inter, rng, layout));
  }
  for (int e = 0; e < experts; ++e) {
    ex.gv.push_back(ex.g[e].view), ex.uv.push_back(ex.u[e].view), ex.dv.push_back(ex.d[e].view);
    ex.hg.push_back({ex.g[e].deq.data(), inter, hidden, hidden});
    ex.hu.push_back({ex.u[e].deq.data(), inter, hidden, hidden});
    ex.hd.push_back({ex.d[e].deq.data(), hidden, inter, inter});
  }
  return ex;
}

}  // namespace glm::engine::narrow_test
