// The CUDA devices this process sees, without CUDA headers (create_backend.h reaches it).
#pragma once

#include "absl/status/statusor.h"

namespace glm::engine::cuda {

// cudaGetDeviceCount: the ordinals a backend may take are 0 .. count - 1. An error (no driver,
// no device) says why.
absl::StatusOr<int> VisibleDeviceCount();

}  // namespace glm::engine::cuda
