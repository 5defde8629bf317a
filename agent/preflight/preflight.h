// RunNodePreflight: every local check of a node, in a fixed order, each with a stable id:
//   rdma.hca, rdma.uverbs, rdma.port_state, rdma.link_layer, mtu.netdev, mtu.port, gid.index,
//   memlock, cap_ipc_lock, gpu.present, nccl.version, mem.free, disk.free, and mtu.path per peer
//   when PreflightOptions::mtu_peers is set.
// Reads the kernel through SystemRoots (fixture trees in tests), libibverbs when available.
// Never throws; a check that cannot read its input fails (or warns) saying what it could not read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/preflight/check.h"
#include "agent/preflight/gpu.h"
#include "agent/preflight/node_config.h"
#include "agent/preflight/path_mtu.h"
#include "agent/preflight/sysfs.h"
#include "agent/preflight/verbs.h"

namespace glm::preflight {

struct PreflightOptions {
  NodePreflightConfig node;
  SystemRoots roots;
  // libibverbs view of the port; null = open libibverbs.so.1 when roots.sysfs is "/sys" (a
  // fixture tree is never mixed with the real devices), else sysfs only.
  VerbsProvider* verbs = nullptr;
  // Null = ProbeGpus(roots).
  std::function<absl::StatusOr<std::vector<GpuInfo>>()> gpu_probe;
  bool require_gpu = true;             // false: no GPU is a warning (CPU backend).
  uint64_t memlock_min_bytes = 0;      // 0: only "unlimited" passes; else a finite limit >= this warns.
  uint64_t min_mem_available_bytes = 0;  // from the plan; 0 = report only.
  std::string disk_path;               // where weights go; empty = "/".
  uint64_t min_disk_free_bytes = 0;    // from the plan; 0 = report only.
  std::string nccl_library_override;   // non-empty: load this instead of node.nccl_library.
  // The Stage phase installs the pinned NCCL build when the library is missing or unusable here
  // (the controller sets this; it fails preflight itself when no node holds the build), so
  // nccl.version warns instead of failing.
  bool nccl_stageable = false;
  // Peers' UDP echo responders (fabric IP + port); one "mtu.path" check each, at fabric.mtu.
  struct MtuPeer {
    std::string name;
    std::string fabric_ip;
    uint16_t port = 0;
  };
  std::vector<MtuPeer> mtu_peers;
  std::chrono::milliseconds mtu_probe_timeout{200};
};

PreflightReport RunNodePreflight(const PreflightOptions& options);

// Individual checks, exposed for the GID watcher and tests. Each returns one result.
CheckResult CheckHca(const SystemRoots& roots, const NodePreflightConfig& node);
CheckResult CheckUverbs(const SystemRoots& roots, const NodePreflightConfig& node);
CheckResult CheckPortState(const SystemRoots& roots, const NodePreflightConfig& node,
                           VerbsProvider* verbs);
CheckResult CheckLinkLayer(const SystemRoots& roots, const NodePreflightConfig& node);
CheckResult CheckNetdevMtu(const SystemRoots& roots, const NodePreflightConfig& node);
CheckResult CheckPortMtu(const SystemRoots& roots, const NodePreflightConfig& node,
                         VerbsProvider* verbs);
CheckResult CheckMemlock(const SystemRoots& roots, uint64_t memlock_min_bytes, bool* unlimited);
CheckResult CheckCapIpcLock(const SystemRoots& roots, bool memlock_unlimited);
CheckResult CheckGpu(const absl::StatusOr<std::vector<GpuInfo>>& gpus, bool require_gpu);
// With `stageable`, a missing or unusable library is a warning ("will be staged"): the Stage
// phase replaces it and verifies hash and version.
CheckResult CheckNcclVersion(const std::string& library, const std::string& expected_version,
                             bool stageable = false);
CheckResult CheckMemFree(const SystemRoots& roots, uint64_t min_bytes);
CheckResult CheckDiskFree(const std::string& path, uint64_t min_bytes);

}  // namespace glm::preflight
