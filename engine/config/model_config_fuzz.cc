// Fuzz target: ParseModelConfig on arbitrary bytes must return a status, never crash or hang.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/config/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = glm::engine::ParseModelConfig(text, "fuzz.json");
  if (config.ok()) {
    // Exercise the accessors on whatever was accepted.
    for (int i = 0; i <= config->num_hidden_layers && i < 4096; ++i) {
      (void)config->IsMoeLayer(i);
      (void)config->HasIndexer(i);
    }
  }
  return 0;
}
