// Fuzz target: arbitrary bytes as model.safetensors.index.json.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/weights/safetensors_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto index = glm::engine::ParseSafetensorsIndex(
      std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-index.json");
  if (index.ok()) {
    for (const auto& [name, file] : index->weight_map) {
      if (file.empty() || file.front() == '/') __builtin_trap();  // paths must stay inside
    }
  } else if (index.status().message().empty()) {
    __builtin_trap();
  }
  return 0;
}
