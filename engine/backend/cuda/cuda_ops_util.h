// Helpers shared by the heavy CUDA ops (cuda_ops_*.cu, cuda_linear.cu; CUDA sources only): CUDA
// errors as absl::Status naming the op, the current device's limits, and the opt-in shared-memory
// setting for one kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/launch.cuh"

namespace glm::engine::cuda {
// Every kernel of the backend's ops is launched with LaunchKernel and opens with PdlEnter
// (programmatic dependent launch: kernels/launch.cuh has the contract).
using kernels::LaunchKernel;
using kernels::PdlEnter;
}  // namespace glm::engine::cuda

namespace glm::engine::cuda::detail {

inline absl::Status CudaCheck(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda ", op, ": ", what, " failed: ",
                                          cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                          ")"));
}

#define GLM_CUDA_OPS_RETURN_IF_ERROR(op, expr)                                         \
  do {                                                                                  \
    if (const cudaError_t glm_ops_err_ = (expr); glm_ops_err_ != cudaSuccess)           \
      return ::glm::engine::cuda::detail::CudaCheck(glm_ops_err_, op, #expr);          \
  } while (0)

struct DeviceInfo {
  int num_sms = 0;
  int smem_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
};

// Attribute queries only: no synchronization, legal during stream capture. A positive
// GLM_KERNELS_SMEM_CAP_BYTES in the environment lowers smem_optin (read once per process).
inline absl::StatusOr<DeviceInfo> CurrentDeviceInfo(const char* op) {
  int device = 0;
  DeviceInfo info;
  GLM_CUDA_OPS_RETURN_IF_ERROR(op, cudaGetDevice(&device));
  GLM_CUDA_OPS_RETURN_IF_ERROR(
      op, cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, device));
  GLM_CUDA_OPS_RETURN_IF_ERROR(
      op, cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // Same cap as the kernels/ launchers (device_limits.h), so an H200 can run GB10's plans.
  static const long env_cap = [] {
    const char* v = std::getenv("GLM_KERNELS_SMEM_CAP_BYTES");
    return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
  }();
  if (env_cap > 0 && env_cap < info.smem_optin) info.smem_optin = static_cast<int>(env_cap);
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
    GLM_CUDA_OPS_RETURN_IF_ERROR(
        op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)));
  }
  return absl::OkStatus();
}

// A kernel-path switch: `mode` is -1 until read; then 0 = by shape (default), 1 = legacy (the
// environment variable `var` starts with '1', read once per process), 2 = the new path wherever
// it applies (set by tests / benches through `mode`). Returns the current mode.
inline int EnvPathMode(const char* var, std::atomic<int>& mode) {
  int v = mode.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv(var);
    v = e != nullptr && e[0] == '1' ? 1 : 0;
    int expected = -1;
    if (!mode.compare_exchange_strong(expected, v)) v = expected;
  }
  return v;
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

}  // namespace glm::engine::cuda::detail
