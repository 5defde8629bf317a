// Which NCCL build the cluster pins and who holds it, decided from the nodes' preflight answers:
//   1. The pinned build is the controller host's copy at nccl.source (or nccl.library) when it
//      exists there: its XXH3-128 (from a hash cache, see NcclSourceProvider) defines the build.
//   2. Otherwise it is the first node's copy (YAML order) that loads with nccl.expected_version.
//   Holders are the nodes whose copy has that hash; nodes without it fetch it from them in the
//   Stage phase (StageNcclRequest carries the hash, the version and the holders as peers).
// ApplyNcclStaging also rewrites each node's nccl.version check: the agent only warns about a
// missing or unusable library when staging is on (PreflightRequest.nccl_stage_if_missing); here
// the warning names the holders ("missing; will be staged from node-1"), or becomes a failure
// when nobody holds the build or the node's own copy is the pinned build and still fails.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/orchestrate/topology.h"
#include "glm/v1/agent.pb.h"

namespace glm::orchestrate {

// The controller host's copy of the pinned build.
struct NcclSourceFile {
  std::string path;
  std::string xxh3_128;
  uint64_t size = 0;
};

// Hashes the controller host's copy; nullopt when there is none (or no library is configured).
using NcclSourceProvider =
    std::function<absl::StatusOr<std::optional<NcclSourceFile>>(const ClusterTopology&)>;

struct NcclStagePlan {
  std::string expected_hash;         // empty: no pinned build known (nothing to stage)
  uint64_t size = 0;
  std::string source;                // for messages: "the controller's copy /x" / "node-1's copy"
  std::vector<std::string> holders;  // nodes whose copy has expected_hash, in YAML order
  bool Holds(const std::string& node) const;
  // Holders other than `node`, comma-joined ("node-1, node-3").
  std::string HoldersExcept(const std::string& node) const;
};

// Picks the pinned build (rules above) and rewrites the nccl.version check (and `ok`) of every
// response in place. Nodes whose preflight call failed are simply absent from `responses`.
NcclStagePlan ApplyNcclStaging(const ClusterTopology& topology,
                               const std::optional<NcclSourceFile>& controller_copy,
                               std::map<std::string, glm::v1::PreflightResponse>* responses);

}  // namespace glm::orchestrate
