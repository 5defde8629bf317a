// The agent's side of the Preflight RPC beyond the host checks: turns the controller's
// PreflightRequest (the node's fabric settings from cluster.yaml) into agent/preflight's
// PreflightOptions, runs RunNodePreflight, and converts the report to glm.v1 messages.
#pragma once

#include <optional>
#include <vector>

#include "agent/preflight/gid.h"
#include "agent/preflight/preflight.h"
#include "glm/v1/agent.pb.h"

namespace glm::agent {

struct NodePreflightOutcome {
  std::vector<glm::v1::Check> checks;
  std::optional<preflight::GidEntry> gid;          // resolved entry, when found
  std::optional<preflight::GidCheckInput> gid_input;  // what the watcher re-checks (RDMA only)
  std::optional<glm::v1::NcclLibraryState> nccl;      // when nccl_library is configured
};

// What is at `path`: present, XXH3-128, size, and the version ncclGetVersion reports (or why it
// does not load).
glm::v1::NcclLibraryState InspectNcclLibrary(const std::string& path);

// `node` is the agent's --node; `require_gpu` already folds in --allow-no-gpu. Checks the host
// checks already cover (mem.free, disk.free) are left out. Without an hca in the request (no
// RDMA fabric), memlock/cap_ipc_lock failures are warnings: only RDMA registration needs them.
NodePreflightOutcome RunAgentNodePreflight(const std::string& node,
                                           const glm::v1::PreflightRequest& req,
                                           const preflight::SystemRoots& roots, bool require_gpu);

glm::v1::Check ToProto(const preflight::CheckResult& c);
glm::v1::GidEntry ToProto(const preflight::GidEntry& e);

}  // namespace glm::agent
