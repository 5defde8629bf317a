// Fuzz target: ParseClusterSpec on arbitrary bytes returns a status; never crashes or hangs.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cluster/spec/cluster_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = glm::cluster::ParseClusterSpec(text, "fuzz.yaml", "/nonexistent");
  if (spec.ok()) {
    (void)spec->world_size();
    (void)spec->ResolvePath(spec->model.path);
    for (const auto& node : spec->nodes) (void)spec->Where(node.location);
  }
  (void)glm::cluster::ParseByteSize(text.substr(0, 64));
  return 0;
}
