// Host helpers shared by the kernel launchers: CUDA errors as absl::Status, pointer checks,
// device limits read from the device's attributes. Host code only (compiled by the C++ compiler).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_limits.h"

namespace glm::kernels {

// Element type of activations passed to the small kernels.
enum class DType { kF32, kBF16 };

// OK for cudaSuccess; otherwise an Internal error naming the call and CUDA's message.
absl::Status CudaStatus(cudaError_t err, std::string_view what);

#define GLM_CUDA_RETURN_IF_ERROR(expr)                                          \
  do {                                                                          \
    if (cudaError_t glm_cuda_err_ = (expr); glm_cuda_err_ != cudaSuccess)       \
      return ::glm::kernels::CudaStatus(glm_cuda_err_, #expr);                  \
  } while (0)

// InvalidArgument unless `ptr` is device (or managed) memory. `op` and `name` go in the message.
// With the calling thread's pointer checks off (SetDevicePointerChecks) only the null check runs:
// no driver query (cudaPointerGetAttributes costs ~1 us and is not allowed in every stream
// capture mode).
absl::Status CheckDevicePointer(const void* ptr, std::string_view op, std::string_view name);

// Per-thread switch for CheckDevicePointer's driver query; on by default on every thread (the
// kernels' own tests keep it on). A caller whose pointers are device memory by construction (the
// CUDA backend once its owner validated a first step: engine/backend/cuda) turns it off for the
// thread that launches. Returns the previous setting.
bool SetDevicePointerChecks(bool enabled);
bool DevicePointerChecks();

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool BytesOverlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// InvalidArgument unless `ptr` is aligned to `alignment` bytes.
absl::Status CheckAligned(const void* ptr, size_t alignment, std::string_view op,
                          std::string_view name);

// Whether kernels launched with LaunchKernel (launch.cuh) use programmatic dependent launch on
// the current device: compute capability 9.0+ and this build's device code for it compiled for
// 9.0+ (code JIT-compiled from an older virtual architecture has no grid-dependency wait).
// Cached per device; thread-safe. Defined in launch.cu.
bool PdlLaunches();

// The current device's limits (cudaDeviceGetAttribute) under the caller's caps
// (CapDeviceLimits; KernelPolicy::smem_cap_bytes / max_sms, 0 = none).
absl::StatusOr<DeviceLimits> QueryDeviceLimits(int64_t smem_cap_bytes, int64_t max_sms);

}  // namespace glm::kernels
