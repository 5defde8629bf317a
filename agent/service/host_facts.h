// Host facts and the host-level preflight checks (CPU, memory, disk, GPU presence). RDMA, GID,
// MTU, memlock and NCCL checks live in agent/preflight; the agent service merges both lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/human_bytes.h"
#include "glm/v1/types.pb.h"

namespace glm::agent {

// Where the facts are read from. Tests point these at a temp dir with fake files.
struct HostProbePaths {
  std::string proc_root = "/proc";  // meminfo, driver/nvidia/version
  std::string dev_root = "/dev";    // nvidia0, nvidia1, ...
};

// What the checks compare against (from the plan, when known; 0 = not known).
struct HostRequirements {
  std::string model_dir;             // Disk check runs on this dir or its nearest existing parent.
  int64_t required_disk_bytes = 0;
  int64_t required_memory_bytes = 0;
  bool require_gpu = false;          // Missing GPU: FAIL when true, WARN otherwise.
};

// Gathers facts; missing sources leave fields at zero/empty (never an error).
glm::v1::HostFacts GatherHostFacts(const HostProbePaths& paths = {});

// Runs the host checks in a stable order: host.cpu.count, host.memory.total,
// host.memory.available, host.disk.free, host.gpu.present. Every non-pass result has a fix.
std::vector<glm::v1::Check> RunHostChecks(const HostRequirements& req,
                                          const HostProbePaths& paths = {});

}  // namespace glm::agent
