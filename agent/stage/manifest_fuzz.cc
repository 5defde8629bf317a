// Fuzzes what the stager reads from outside: a manifest's JSON (from the controller) and a
// stage-protocol request (from any peer on the fabric).
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "agent/stage/manifest.h"
#include "agent/stage/stage_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) {
    absl::StatusOr<glm::stage::Manifest> m = glm::stage::Manifest::FromJson(j);
    if (m.ok()) {
      (void)glm::stage::FilesForShard(*m, glm::stage::ShardSpec{0, 2, true, false, true});
      (void)m->ToJson().dump();
    }
  }
  int fds[2];
  if (size < 65536 && socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0) {
    (void)!write(fds[0], data, size);
    shutdown(fds[0], SHUT_WR);
    absl::StatusOr<glm::stage::StageRequest> r = glm::stage::ReadRequest(fds[1], 0);
    if (r.ok()) (void)glm::stage::IsServablePath(r->path);
    close(fds[0]);
    close(fds[1]);
  }
  return 0;
}
