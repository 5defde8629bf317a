// Fuzzes what the stager reads from outside: a manifest's JSON (from the controller) and the path
// of a FetchFile request (from any peer holding a cluster certificate).
#include <cstddef>
#include <cstdint>
#include <string>

#include "agent/stage/manifest.h"
#include "agent/stage/stage_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) {
    absl::StatusOr<glm::stage::Manifest> m = glm::stage::Manifest::FromJson(j);
    if (m.ok()) {
      (void)glm::stage::FilesForShard(*m, glm::stage::ShardSpec{0, 2, true, false, true});
      (void)m->ToJson().dump();
    }
  }
  std::string path(reinterpret_cast<const char*>(data), size);
  if (glm::stage::IsServablePath(path)) {
    // A servable path never climbs out of the root.
    const bool climbs = path == ".." || path.rfind("../", 0) == 0 ||
                        path.find("/../") != std::string::npos ||
                        (path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0);
    if (path[0] == '/' || climbs) {
      __builtin_trap();
    }
  }
  return 0;
}
