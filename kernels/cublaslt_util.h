// cuBLASLt plumbing shared by the GEMM launchers (gemm_bf16, gemm_fp8_block): the library handle
// as an owned object and cuBLAS status codes as absl::Status. Host code only.
#pragma once

#include <cublasLt.h>

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glm::kernels {

// OK for CUBLAS_STATUS_SUCCESS; otherwise an error naming the call and the status (Internal,
// or InvalidArgument / Unimplemented for INVALID_VALUE / NOT_SUPPORTED / ARCH_MISMATCH).
absl::Status CublasStatus(cublasStatus_t status, std::string_view what);

// One cuBLASLt context (cublasLtCreate). Not tied to a device or stream; plans made with it keep a
// raw pointer, so it must outlive them. cuBLASLt handles are thread-safe for matmul calls.
class BlasLtHandle {
 public:
  static absl::StatusOr<std::unique_ptr<BlasLtHandle>> Create();
  ~BlasLtHandle();
  BlasLtHandle(const BlasLtHandle&) = delete;
  BlasLtHandle& operator=(const BlasLtHandle&) = delete;

  cublasLtHandle_t get() const { return handle_; }

 private:
  explicit BlasLtHandle(cublasLtHandle_t h) : handle_(h) {}
  cublasLtHandle_t handle_;
};

// Owned cuBLASLt descriptors (destroyed with the object).
struct LtMatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using LtMatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, LtMatmulDescDeleter>;
using LtLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtLayoutDeleter>;
using LtPreference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtPreferenceDeleter>;

absl::StatusOr<LtLayout> MakeLtLayout(cudaDataType_t type, uint64_t rows, uint64_t cols,
                                      int64_t ld);

}  // namespace glm::kernels
