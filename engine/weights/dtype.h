// Element types a safetensors checkpoint may hold, with their on-disk names and sizes.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace glm::engine {

// The dtypes the reader accepts. Anything else in a header (F64, I8, F8_E5M2, ...) is rejected
// with a message listing these.
enum class DType { kF32, kF16, kBF16, kF8E4M3, kI32, kI64, kU8, kBool };

// On-disk name as written in a safetensors header: "F32", "BF16", "F8_E4M3", ...
std::string_view DTypeName(DType dtype);

// Bytes per element (1, 2, 4 or 8).
size_t DTypeSize(DType dtype);

// Parses an on-disk name; nullopt for names this reader does not support.
std::optional<DType> ParseDType(std::string_view name);

// "F32, F16, BF16, F8_E4M3, I32, I64, U8, BOOL" for error messages.
std::string_view SupportedDTypeList();

}  // namespace glm::engine
