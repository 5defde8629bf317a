#include "engine/weights/dtype.h"

#include <array>
#include <utility>

namespace glm::engine {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 8> kDTypes = {{
    {DType::kF32, "F32", 4},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kI32, "I32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
}};

const DTypeInfo& Info(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::string_view SupportedDTypeList() { return "F32, F16, BF16, F8_E4M3, I32, I64, U8, BOOL"; }

}  // namespace glm::engine
