// The FP4-activation variant of gemv_quant's nvfp4 decode GEMV: an opt-in path
// (LinearPolicy::nvfp4_path = kFp4Mma) that runs both operands on the block-scaled FP4 tensor
// cores of compute capability 12.x (mma.sync m16n8k64 kind::mxf4nvf4, ue4m3 scales per 16
// inputs; gemv_quant_fp4mma.cuh). It does NOT keep gemv_quant.h's weight-only contract
// (activations rounded to bf16): the activations are quantized to nvfp4 first, which costs
// accuracy (e2m1 has 1 mantissa bit), so it is a separate contract with its own reference:
//   per token and per 16 consecutive inputs [16 b, 16 b + 16):
//     amax = max |x|;  sx = ue4m3(amax / 6) (nearest, ties to even, saturating at 448; 0 when
//     amax / 6 rounds to 0);  codes = e2m1(x * (1 / sx)) (nearest, ties to the even code,
//     saturating at ±6; all 0 when sx == 0)
//   y[m, n] (+)= global_scale * Σ_k (e2m1(xq) * sx) * (e2m1(w) * sw)
// with the weight exactly as gemv_quant.h's nvfp4 rule (e2m1 codes, e4m3 scale per 16 inputs).
// Every product is exact in fp32; the tensor cores sum in fp32 (order unspecified), the
// reference in double. Limits: weight scale bytes must be non-negative (bit 7 clear, as ModelOpt
// writes them: the instruction reads them as ue4m3) and x finite (a NaN / Inf activation gives
// an unspecified finite result, not NaN, on this path). Everything else as gemv_quant.h
// (shapes, m <= 16, strides, determinism, no allocation).
// The scalar rules below are shared by the kernel and the host reference so both quantize the
// activations bit for bit alike. Plain C++ (CPU-only builds carry the reference and its tests).
#pragma once

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"

#if defined(__CUDACC__)
#define GLM_FP4_HD __host__ __device__
#else
#define GLM_FP4_HD
#endif

namespace glm::kernels {

inline constexpr int kFp4BlockElems = 16;  // inputs per ue4m3 scale (weights and activations)

// The value of e2m1 code `code` (bit 3 sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6).
GLM_FP4_HD inline float Fp4E2m1Value(uint8_t code) {
  const int c = code & 7;
  const float mag = c < 2 ? 0.5f * c : static_cast<float>((2 + (c & 1)) << ((c >> 1) - 1)) * 0.5f;
  return (code & 8) ? -mag : mag;
}

// e2m1 code of v: nearest magnitude, ties to the even code (0, 1.0, 2.0, 4.0 win a tie),
// saturating at 6 (NaN gives 6 too); the sign bit is v's.
GLM_FP4_HD inline uint8_t Fp4E2m1Code(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  const float a = v < 0.0f ? -v : v;
  const uint8_t mag = a <= 0.25f   ? 0
                      : a < 0.75f  ? 1
                      : a <= 1.25f ? 2
                      : a < 1.75f  ? 3
                      : a <= 2.5f  ? 4
                      : a < 3.5f   ? 5
                      : a <= 5.0f  ? 6
                                   : 7;
  return static_cast<uint8_t>(((u >> 28) & 8) | mag);
}

// The value of a ue4m3 byte (e4m3 without the sign: bias 7, subnormals m / 8 * 2^-6; 0x7f NaN).
GLM_FP4_HD inline float Fp4Ue4m3Value(uint8_t b) {
  const int e = (b >> 3) & 15, man = b & 7;
  if ((b & 0x7f) == 0x7f) {
    const uint32_t nan = 0x7fc00000u;
    float f;
    memcpy(&f, &nan, 4);
    return f;
  }
  if (e == 0) return static_cast<float>(man) * 0.001953125f;  // man * 2^-9
  const uint32_t bits = (static_cast<uint32_t>(e + 120) << 23) | (static_cast<uint32_t>(man) << 20);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// The ue4m3 byte nearest to v (ties to even), saturating at 448 (0x7e); 0 for v <= 0 or NaN.
GLM_FP4_HD inline uint8_t Fp4Ue4m3Code(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 448.0f) return 0x7e;
  uint32_t u;
  memcpy(&u, &v, 4);
  int e = static_cast<int>((u >> 23) & 0xff) - 127;
  if (e >= -6) {  // normal: keep 3 mantissa bits, round half to even
    const uint32_t mant = u & 0x7fffffu;
    uint32_t q = mant >> 20;
    const uint32_t rem = mant & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (q & 1))) ++q;
    if (q == 8) {
      q = 0;
      ++e;
    }
    return static_cast<uint8_t>(((e + 7) << 3) | static_cast<int>(q));
  }
  // Subnormal: q * 2^-9 with q = v * 512 rounded half to even (q == 8 is 0x08 = 2^-6).
  const float s = v * 512.0f;  // exact: a power-of-two scale of a value < 2^-6
  int q = static_cast<int>(s);
  const float frac = s - static_cast<float>(q);
  if (frac > 0.5f || (frac == 0.5f && (q & 1))) ++q;
  return static_cast<uint8_t>(q);
}

// One block of `count` (<= 16) activations: writes 8 bytes of e2m1 codes (element 2i in the low
// nibble of byte i; elements past count are 0) and returns the ue4m3 scale byte (the rule in the
// file comment).
GLM_FP4_HD inline uint8_t Fp4QuantizeBlock(const float* x, int count, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) {
    const float a = x[i] < 0.0f ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  const uint8_t sb = Fp4Ue4m3Code(amax / 6.0f);
  const float r = sb == 0 ? 0.0f : 1.0f / Fp4Ue4m3Value(sb);
  for (int i = 0; i < kFp4BlockElems / 2; ++i) {
    const uint8_t lo = 2 * i < count && sb != 0 ? Fp4E2m1Code(x[2 * i] * r) : 0;
    const uint8_t hi = 2 * i + 1 < count && sb != 0 ? Fp4E2m1Code(x[2 * i + 1] * r) : 0;
    codes[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return sb;
}

// The reference of the FP4-activation path on host memory: y[m, n] (+)= global_scale * Σ_k
// xq[m, k] wq[n, k] with xq from Fp4QuantizeBlock and wq = e2m1 * e4m3 of the nvfp4 weight
// (w: [n, ld_bytes] packed codes, scales: e4m3 [n, scale_ld], as gemv_quant.h's QuantWeightView
// for kNvfp4), products summed in double, rounded to fp32, then times global_scale.
// InvalidArgument for m outside [0, 16], k not a multiple of 32, short strides or null pointers.
absl::Status GemvQuantFp4Host(int64_t m, const float* x, int64_t ldx, const uint8_t* w,
                              int64_t ld_bytes, const uint8_t* scales, int64_t scale_ld,
                              float global_scale, int64_t n, int64_t k, float* y, int64_t ldy,
                              bool accumulate);

}  // namespace glm::kernels
