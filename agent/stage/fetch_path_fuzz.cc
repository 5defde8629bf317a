// Fuzzes the path of a FetchFile request (from any peer holding a cluster certificate): a path
// IsServablePath accepts never leaves the stage root.
#include <cstddef>
#include <cstdint>
#include <string>

#include "agent/stage/stage_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path(reinterpret_cast<const char*>(data), size);
  if (glm::stage::IsServablePath(path)) {
    const bool climbs = path == ".." || path.rfind("../", 0) == 0 ||
                        path.find("/../") != std::string::npos ||
                        (path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0);
    if (path[0] == '/' || climbs) {
      __builtin_trap();
    }
  }
  return 0;
}
