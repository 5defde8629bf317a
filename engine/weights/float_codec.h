// Bit-exact scalar conversions between float32 and the narrow float formats in checkpoints.
//
// Decoders are exact (every narrow value is representable in float32), including subnormals,
// signed zeros, infinities and NaNs. Encoders round to nearest, ties to even.
//   bf16:        1 sign, 8 exponent, 7 mantissa bits (the top half of a float32).
//   f16:         IEEE binary16: 1/5/10, bias 15, inf and NaN at exponent 31.
//   fp8 e4m3fn:  1/4/3, bias 7, no infinities; 0x7F and 0xFF are NaN; max finite ±448;
//                subnormals m·2^-9 (PyTorch torch.float8_e4m3fn, OCP FP8 "E4M3").
#pragma once

#include <cstdint>

namespace glm::engine {

float Bf16ToFloat(uint16_t bits);
float F16ToFloat(uint16_t bits);
float Fp8E4M3ToFloat(uint8_t bits);

// Round to nearest even; NaN stays NaN (quiet); overflow gives ±inf.
uint16_t FloatToBf16(float value);
// Round to nearest even; NaN stays NaN (quiet); overflow gives ±inf.
uint16_t FloatToF16(float value);
// Round to nearest even; NaN gives 0x7F; |value| > 448 (including ±inf) saturates to ±448,
// as block quantizers clamp before the cast.
uint8_t FloatToFp8E4M3(float value);

}  // namespace glm::engine
