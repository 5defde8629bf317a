#include "engine/weights/float_codec.h"

#include <array>
#include <bit>
#include <cmath>

namespace glm::engine {
namespace {

constexpr uint32_t kSignBit = 0x80000000u;

constexpr float MakeFloat(uint32_t bits) { return std::bit_cast<float>(bits); }

// e4m3fn code -> float32 bits, built once from the bit layout (no floating-point arithmetic).
constexpr uint32_t Fp8E4M3ToFloatBits(uint8_t code) {
  const uint32_t sign = (code & 0x80u) ? kSignBit : 0u;
  const uint32_t exponent = (code >> 3) & 0xFu;
  uint32_t mantissa = code & 0x7u;
  if (exponent == 0xF && mantissa == 0x7) return sign | 0x7FC00000u;  // NaN
  if (exponent == 0) {
    if (mantissa == 0) return sign;  // ±0
    // Subnormal m·2^-9: normalise so the leading 1 becomes implicit.
    int shift = 0;
    while ((mantissa & 0x8u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x7u;
    const uint32_t float_exponent = static_cast<uint32_t>(1 - 7 - shift + 127);
    return sign | (float_exponent << 23) | (mantissa << 20);
  }
  return sign | ((exponent - 7 + 127) << 23) | (mantissa << 20);
}

constexpr std::array<uint32_t, 256> MakeFp8Table() {
  std::array<uint32_t, 256> table{};
  for (int code = 0; code < 256; ++code) table[code] = Fp8E4M3ToFloatBits(static_cast<uint8_t>(code));
  return table;
}

constexpr std::array<uint32_t, 256> kFp8Table = MakeFp8Table();

}  // namespace

float Bf16ToFloat(uint16_t bits) { return MakeFloat(static_cast<uint32_t>(bits) << 16); }

float F16ToFloat(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) ? kSignBit : 0u;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) {
    // Inf, or NaN with its payload kept in the top mantissa bits.
    return MakeFloat(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return MakeFloat(sign);
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3FFu;
    const uint32_t float_exponent = static_cast<uint32_t>(1 - 15 - shift + 127);
    return MakeFloat(sign | (float_exponent << 23) | (mantissa << 13));
  }
  return MakeFloat(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

float Fp8E4M3ToFloat(uint8_t bits) { return MakeFloat(kFp8Table[bits]); }

uint16_t FloatToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t FloatToF16(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7E00u);
  const float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (magnitude < 0x1.0p-14f) {
    // Subnormal range: steps of 2^-24; q == 1024 is the smallest normal, encoded the same way.
    const auto q = static_cast<uint16_t>(std::nearbyint(magnitude * 0x1.0p24f));
    return static_cast<uint16_t>(sign | q);
  }
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction·2^exponent
  --exponent;                                              // magnitude = (2·fraction)·2^exponent
  auto mantissa = static_cast<uint32_t>(std::nearbyint((2.0f * fraction - 1.0f) * 1024.0f));
  if (mantissa == 1024) {
    mantissa = 0;
    ++exponent;
  }
  if (exponent + 15 >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent + 15) << 10) | mantissa);
}

uint8_t FloatToFp8E4M3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80u : 0u;
  if (std::isnan(value)) return 0x7F;
  float magnitude = std::fabs(value);
  if (magnitude > 448.0f) magnitude = 448.0f;
  if (magnitude < 0x1.0p-6f) {
    // Subnormal range: steps of 2^-9; q == 8 is the smallest normal, encoded the same way.
    const auto q = static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f));
    return static_cast<uint8_t>(sign | q);
  }
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);
  --exponent;
  auto mantissa = static_cast<uint32_t>(std::nearbyint((2.0f * fraction - 1.0f) * 8.0f));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  // magnitude <= 448 = 1.75·2^8 cannot round past the largest finite code 0x7E.
  return static_cast<uint8_t>(sign | (static_cast<uint32_t>(exponent + 7) << 3) | mantissa);
}

}  // namespace glm::engine
