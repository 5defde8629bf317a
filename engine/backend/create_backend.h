// Picks and creates the backend the model runs on: "cpu", "cuda" or "auto" (cuda when this build
// has the CUDA backend and a GPU is usable, else cpu).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace glm::engine {

// The kinds CreateBackend accepts, for help texts: "cpu|cuda|auto".
inline constexpr const char* kBackendKinds = "cpu|cuda|auto";

// OK when CreateBackend("cuda") can work here: the build has the CUDA backend and a device is
// usable. Otherwise FailedPrecondition saying which of the two is missing.
absl::Status CudaBackendAvailable();

// How many CUDA devices this process sees (the ordinals CreateBackend's device_ordinal may take
// are 0 .. count - 1). FailedPrecondition without the CUDA backend in the build or without a
// driver.
absl::StatusOr<int> CudaDeviceCount();

// The kind "auto" resolves to on this machine ("cuda" or "cpu"); other kinds unchanged.
std::string ResolveBackendKind(const std::string& kind);

// num_threads: cpu backend threads (0 = hardware concurrency); device_ordinal: cuda device.
// Errors: unknown kind (InvalidArgument), "cuda" without CUDA support compiled in or without a
// usable device (FailedPrecondition, naming the fix), CUDA setup failures.
// policy: the kernel paths of a device backend (kernels/kernel_policy.h; the cpu backend has one
// path per op and ignores it).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    const std::string& kind, int num_threads, int device_ordinal = 0,
    const kernels::KernelPolicy& policy = kernels::KernelPolicy());

}  // namespace glm::engine
