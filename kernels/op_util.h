// Helpers shared by the launchers of the heavy ops in kernels/ (MLA attention, DSA indexer, MoE,
// fp8 KV; CUDA sources only): CUDA errors as absl::Status naming the op, the current device's
// limits under the caller's KernelPolicy caps, and the opt-in shared-memory setting for one kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline absl::Status CudaCheck(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda ", op, ": ", what, " failed: ",
                                          cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                          ")"));
}

#define GLM_OP_RETURN_IF_ERROR(op, expr)                                         \
  do {                                                                                  \
    if (const cudaError_t glm_ops_err_ = (expr); glm_ops_err_ != cudaSuccess)           \
      return ::glm::kernels::detail::CudaCheck(glm_ops_err_, op, #expr);          \
  } while (0)

struct DeviceInfo {
  int num_sms = 0;
  int smem_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
};

// Attribute queries only: no synchronization, legal during stream capture. smem_cap_bytes > 0
// (KernelPolicy::smem_cap_bytes) lowers smem_optin, so a large GPU runs a smaller chip's plans.
inline absl::StatusOr<DeviceInfo> CurrentDeviceInfo(const char* op, int64_t smem_cap_bytes) {
  int device = 0;
  DeviceInfo info;
  GLM_OP_RETURN_IF_ERROR(op, cudaGetDevice(&device));
  GLM_OP_RETURN_IF_ERROR(
      op, cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, device));
  GLM_OP_RETURN_IF_ERROR(
      op, cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (smem_cap_bytes > 0 && smem_cap_bytes < info.smem_optin) {
    info.smem_optin = static_cast<int>(smem_cap_bytes);
  }
  return info;
}

// Lets `kernel` use `bytes` of dynamic shared memory (opt-in above 48 KiB); FailedPrecondition
// naming the op when the device cannot give that much.
template <typename Kernel>
absl::Status UseDynamicSmem(Kernel kernel, int64_t bytes, const DeviceInfo& info, const char* op) {
  if (bytes > info.smem_optin) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda ", op, ": needs ", bytes, " bytes of shared memory per block, device "
                     "allows ", info.smem_optin, " (reduce the head dims / head count)"));
  }
  if (bytes > 48 * 1024) {
    GLM_OP_RETURN_IF_ERROR(
        op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)));
  }
  return absl::OkStatus();
}

// Resident CTAs per SM of `kernel` with `threads` per block and `smem` dynamic bytes on the current
// device, cached per (kernel, device, smem); 1 when the query fails (sizing only, never
// correctness).
template <typename Kernel>
int CachedCtasPerSm(Kernel kernel, int threads, int64_t smem) {
  static std::mutex* mu = new std::mutex;
  static auto* cache = new std::map<std::tuple<const void*, int, int, int64_t>, int>;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, threads, smem);
  std::lock_guard<std::mutex> lock(*mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  int blocks = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads,
                                                    static_cast<size_t>(smem)) != cudaSuccess ||
      blocks < 1) {
    (void)cudaGetLastError();
    blocks = 1;
  }
  (*cache)[key] = blocks;
  return blocks;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace glm::kernels::detail
