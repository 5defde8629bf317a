// Staging the pinned NCCL library onto a node: copy (or fetch) it to the path the cluster YAML
// names when it is missing or differs from the source's, verify the XXH3-128 hash before it is
// moved into place, then dlopen it and check ncclGetVersion (NcclLibrary::Load).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/stage/nccl_loader.h"

namespace glm::stage {

struct NcclStageOptions {
  std::string dest_path;         // nccl.library from the YAML.
  std::string expected_version;  // nccl.expected_version; empty = any.
  // The source's hash (from the controller's manifest). Empty: hash source_path.
  std::string expected_hash;
  // Where the source's copy is readable locally (controller node, shared mount). May be empty
  // when `fetch` is set.
  std::string source_path;
  // Writes the source's bytes to the given path (e.g. from a peer over the stage protocol).
  // Null: copy source_path.
  std::function<absl::Status(const std::string& partial_path)> fetch;
};

struct NcclStageResult {
  bool copied = false;   // false: the file in place already matched.
  std::string hash;      // of the file now in place.
  std::unique_ptr<NcclLibrary> library;
};

// Errors say which step failed (source unreadable, hash mismatch naming both hashes, dlopen,
// version naming both versions) and the fix.
absl::StatusOr<NcclStageResult> StageAndLoadNccl(const NcclStageOptions& options);

}  // namespace glm::stage
