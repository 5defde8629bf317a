// Activation quantization for the fp8 block-scaled GEMMs (DeepSeek-V3 / GLM-5 "dynamic" scheme):
// per token, per group of 128 consecutive columns, scale = amax(|x|) / 448 and
// q = e4m3(x / scale) (round to nearest even, saturating to ±448); x ≈ q · scale.
// A group that is all zero gets scale 0 and q = 0. The last group of a row may be partial
// (k not a multiple of 128): its amax is over the columns that exist.
//
// QuantizeFp8GroupHost is the bit-exact host mirror (tests build their references with it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace glm::kernels {

inline constexpr int kFp8GroupSize = 128;  // columns per activation group and per weight block
inline constexpr float kE4m3Max = 448.0f;

// x: bf16 [m, k] (row stride ldx elements). q: e4m3 [m, k] (row stride ldq bytes).
// scales: fp32, group g of row r at scales[g * scale_ld + r] ("M-major", what cuBLASLt's
// VEC128_32F mode reads), scale_ld >= m. k must be a multiple of 4 (8-byte loads); ldx a multiple
// of 4, ldq a multiple of 4, x 8-byte and q 4-byte aligned. m == 0 is a no-op.
absl::Status QuantizeFp8Group(const void* x, int64_t ldx, int64_t m, int64_t k, void* q,
                              int64_t ldq, float* scales, int64_t scale_ld, cudaStream_t stream);

// Host version over float inputs (the bf16 values widened), same layouts; q as e4m3 bytes.
void QuantizeFp8GroupHost(const float* x, int64_t ldx, int64_t m, int64_t k, uint8_t* q,
                          int64_t ldq, float* scales, int64_t scale_ld);

// e4m3 byte -> float (exact). Host helper for references.
float E4m3ToFloat(uint8_t v);
// float -> e4m3 byte, round to nearest even, saturating (finite inputs map to ±448 at most).
uint8_t FloatToE4m3Sat(float v);

}  // namespace glm::kernels
