#include "kernels/cublaslt_util.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::kernels {

namespace {

// cublasGetStatusName lives in libcublas, which the GEMMs do not link; cuBLASLt alone is enough.
const char* StatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_<unknown>";
  }
}

}  // namespace

absl::Status CublasStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(ToAbsl(what), " failed: ", StatusName(status), " (",
                                       static_cast<int>(status), ")");
  switch (status) {
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<std::unique_ptr<BlasLtHandle>> BlasLtHandle::Create() {
  cublasLtHandle_t h = nullptr;
  GLM_RETURN_IF_ERROR(CublasStatus(cublasLtCreate(&h), "cublasLtCreate"));
  return std::unique_ptr<BlasLtHandle>(new BlasLtHandle(h));
}

BlasLtHandle::~BlasLtHandle() { cublasLtDestroy(handle_); }

absl::StatusOr<LtLayout> MakeLtLayout(cudaDataType_t type, uint64_t rows, uint64_t cols,
                                      int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  GLM_RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld),
                                   "cublasLtMatrixLayoutCreate"));
  return LtLayout(l);
}

}  // namespace glm::kernels
