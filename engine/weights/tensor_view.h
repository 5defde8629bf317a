// A read-only, non-owning view of one checkpoint tensor's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/weights/dtype.h"

namespace glm::engine {

// Points into a memory-mapped file: valid while the SafetensorsFile / WeightStore that returned
// it lives. `data` has no alignment guarantee (safetensors offsets are byte offsets); read
// elements with memcpy. Bytes are little-endian, row-major (C order).
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;

  // Product of `shape` (1 for a scalar). Shapes were checked for overflow when parsed.
  int64_t num_elements() const;
};

// "[2048, 6144]" for messages.
std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace glm::engine
