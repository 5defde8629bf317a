// Fuzzes a weight manifest's JSON, which the agent receives from the controller: FromJson either
// refuses it or yields a manifest whose shard plan and JSON form can be computed.
#include <cstddef>
#include <cstdint>

#include "cluster/manifest/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  absl::StatusOr<glm::cluster::Manifest> m = glm::cluster::Manifest::FromJson(j);
  if (m.ok()) {
    (void)glm::cluster::FilesForShard(*m, glm::cluster::ShardSpec{0, 2, true, false, true});
    (void)m->ToJson().dump();
  }
  return 0;
}
