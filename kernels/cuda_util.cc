#include "kernels/cuda_util.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::kernels {

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(ToAbsl(what), " failed: ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

namespace {
thread_local bool tls_pointer_checks = true;
}  // namespace

bool SetDevicePointerChecks(bool enabled) {
  const bool previous = tls_pointer_checks;
  tls_pointer_checks = enabled;
  return previous;
}

bool DevicePointerChecks() { return tls_pointer_checks; }

absl::Status CheckDevicePointer(const void* ptr, std::string_view op, std::string_view name) {
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(op), ": ", ToAbsl(name), " is null; pass device memory"));
  }
  if (!tls_pointer_checks) return absl::OkStatus();
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later launches are unaffected
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(op), ": ", ToAbsl(name),
                                                   " is not a CUDA pointer (",
                                                   cudaGetErrorString(err), ")"));
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToAbsl(op), ": ", ToAbsl(name),
        " points to host memory; allocate it with cudaMalloc (or managed memory)"));
  }
  return absl::OkStatus();
}

absl::Status CheckAligned(const void* ptr, size_t alignment, std::string_view op,
                          std::string_view name) {
  if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(op), ": ", ToAbsl(name), " must be ",
                                                   alignment, "-byte aligned"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceLimits> QueryDeviceLimits(int64_t smem_cap_bytes, int64_t max_sms) {
  int device = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  DeviceLimits l;
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&l.num_sms, cudaDevAttrMultiProcessorCount, device));
  GLM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &l.smem_optin_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&l.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  GLM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &l.reserved_smem_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device));
  GLM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &l.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  return CapDeviceLimits(l, smem_cap_bytes, max_sms);
}

}  // namespace glm::kernels
