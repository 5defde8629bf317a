#include "engine/backend/create_backend.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#ifdef GLM_HAVE_CUDA_BACKEND
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/cuda_devices.h"
#endif

namespace glm::engine {

absl::Status CudaBackendAvailable() {
#ifdef GLM_HAVE_CUDA_BACKEND
  return CudaDeviceAvailable();
#else
  return absl::FailedPreconditionError(
      "this build has no CUDA backend (configured without nvcc or with -DGLM_ENABLE_CUDA=OFF); "
      "rebuild with -DGLM_ENABLE_CUDA=ON or use the cpu backend");
#endif
}

absl::StatusOr<int> CudaDeviceCount() {
#ifdef GLM_HAVE_CUDA_BACKEND
  return cuda::VisibleDeviceCount();
#else
  return CudaBackendAvailable();  // always an error here: the build has no CUDA backend
#endif
}

std::string ResolveBackendKind(const std::string& kind) {
  if (kind != "auto") return kind;
  return CudaBackendAvailable().ok() ? "cuda" : "cpu";
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& kind, int num_threads,
                                                       int device_ordinal,
                                                       const kernels::KernelPolicy& policy) {
  const std::string resolved = ResolveBackendKind(kind);
  if (resolved == "cpu") return CreateCpuBackend(num_threads);
  if (resolved == "cuda") {
    GLM_RETURN_IF_ERROR(Annotate(CudaBackendAvailable(), "backend cuda"));
#ifdef GLM_HAVE_CUDA_BACKEND
    return CreateCudaBackend(device_ordinal, policy);
#else
    (void)device_ordinal;
    (void)policy;
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", kind, "'; use one of ", kBackendKinds));
}

}  // namespace glm::engine
