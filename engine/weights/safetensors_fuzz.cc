// Fuzz target: arbitrary bytes as a safetensors file. Header validation must reject bad input
// with a status (never crash, never read out of bounds); tensors it accepts must be readable.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "engine/weights/dequantize.h"
#include "engine/weights/safetensors.h"

namespace {
// Decode only small tensors so each input stays fast.
constexpr size_t kMaxDecodeBytes = 1 << 16;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace glm::engine;
  auto bytes = std::as_bytes(std::span<const uint8_t>(data, size));
  auto file = SafetensorsFile::FromBuffer(bytes, "fuzz-input");
  if (!file.ok()) {
    if (file.status().message().empty()) __builtin_trap();  // every rejection explains itself
    return 0;
  }
  const BlockSize blocks[] = {{128, 128}, {1, 1}, {3, 5}};
  for (const SafetensorsEntry& entry : (*file)->tensors()) {
    const TensorView view = (*file)->View(entry);
    if (view.data < bytes.data() || view.data + view.nbytes > bytes.data() + bytes.size()) {
      __builtin_trap();  // a validated entry must lie inside the file
    }
    if (view.nbytes > kMaxDecodeBytes || !IsFloatDType(view.dtype)) continue;
    auto values = DecodeToFloat(view);
    if (!values.ok() || values->size() != static_cast<size_t>(view.num_elements())) {
      __builtin_trap();
    }
    // Pair "<x>.weight" with "<x>.weight_scale_inv" the way WeightStore does.
    const SafetensorsEntry* scale = (*file)->Find(entry.name + "_scale_inv");
    if (scale == nullptr) continue;
    const TensorView scale_view = (*file)->View(*scale);
    for (const BlockSize& block : blocks) {
      auto dequantized = DecodeToFloat(view, &scale_view, block);
      if (dequantized.ok() && dequantized->size() != static_cast<size_t>(view.num_elements())) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
