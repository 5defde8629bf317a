// GPU presence and compute capability, read without linking CUDA: libcuda.so.1 is dlopened
// (cuInit, cuDeviceGetCount, cuDeviceGetName, cuDeviceGetAttribute); when it is absent the
// driver's <proc>/driver/nvidia/gpus/*/information files still show which GPUs exist.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/preflight/sysfs.h"

namespace glm::preflight {

struct GpuInfo {
  std::string name;
  int cc_major = -1;  // -1 when unknown (driver files only).
  int cc_minor = -1;
};

// libcuda first (only when roots.proc is the real /proc), then the driver's proc files.
// An empty list means no GPU was found; an error means neither source could be read.
absl::StatusOr<std::vector<GpuInfo>> ProbeGpus(const SystemRoots& roots);

}  // namespace glm::preflight
