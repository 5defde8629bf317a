// Host helpers shared by the kernel launchers: CUDA errors as absl::Status, pointer checks,
// device limits read from the device's attributes. Host code only (compiled by the C++ compiler).
#pragma once

#include <cuda_runtime_api.h>

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
absl::Status CheckDevicePointer(const void* ptr, std::string_view op, std::string_view name);

// InvalidArgument unless `ptr` is aligned to `alignment` bytes.
absl::Status CheckAligned(const void* ptr, size_t alignment, std::string_view op,
                          std::string_view name);

// The current device's limits (cudaDeviceGetAttribute), with the GLM_KERNELS_SMEM_CAP_BYTES /
// GLM_KERNELS_MAX_SMS caps from the environment applied.
absl::StatusOr<DeviceLimits> QueryDeviceLimits();

}  // namespace glm::kernels
