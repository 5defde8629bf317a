// Linear layer GEMM in bf16 through cuBLASLt: y[M,N] = x[M,K] · w[N,K]^T (+ y when accumulating).
// w has the Linear layout [out_features, in_features]; all matrices row-major with their own row
// strides. bf16 inputs, fp32 accumulation (CUBLAS_COMPUTE_32F), output bf16 or fp32.
//
// In cuBLAS's column-major terms this is the "TN" problem D[N,M] = op_T(A = w)[N,K] · B[K,M] with
// B = x^T, which is the layout every cuBLASLt kernel family supports best.
//
// A GemmBf16Plan is made once per shape (engine setup: one per weight and token-count bucket): it
// owns the descriptors and the algorithm cuBLASLt's heuristic chose, so Run() allocates nothing on
// the host and only enqueues cublasLtMatmul. Workspace comes from the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cublaslt_util.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

struct GemmBf16Shape {
  int64_t m = 0;       // num_tokens (0 allowed: Run is a no-op)
  int64_t n = 0;       // out_features
  int64_t k = 0;       // in_features
  int64_t ldx = 0;     // row stride of x in elements (>= k); 0 = k
  int64_t ldw = 0;     // row stride of w in elements (>= k); 0 = k
  int64_t ldy = 0;     // row stride of y in elements (>= n); 0 = n
  DType out = DType::kBF16;

  std::string DebugString() const;
};

// Every pointer passed to Run must be aligned to this many bytes (the plan asks cuBLASLt only for
// algorithms that work at this alignment). cudaMalloc gives 256.
inline constexpr size_t kGemmPointerAlignment = 16;
// Default cap on the cuBLASLt workspace a plan may ask for (NVIDIA recommends 32 MiB on Hopper).
inline constexpr size_t kGemmDefaultMaxWorkspace = size_t{32} << 20;

class GemmBf16Plan {
 public:
  // InvalidArgument for a bad shape (negative or zero sizes, ld < row length); Unimplemented
  // when cuBLASLt has no algorithm for it on the current device. `handle` must outlive the plan.
  static absl::StatusOr<std::unique_ptr<GemmBf16Plan>> Create(
      const BlasLtHandle& handle, const GemmBf16Shape& shape,
      size_t max_workspace_bytes = kGemmDefaultMaxWorkspace);

  // x: bf16 [m, k] (ldx), w: bf16 [n, k] (ldw), y: [m, n] (ldy) of shape.out, all device memory
  // aligned to kGemmPointerAlignment. accumulate: y += x·w^T (else y = x·w^T; y is not read).
  // workspace: device memory of at least workspace_bytes(), 256-byte aligned (may be null when
  // workspace_bytes() is 0). Not thread-safe per plan; the stream orders uses of the workspace.
  absl::Status Run(const void* x, const void* w, void* y, bool accumulate, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream) const;

  size_t workspace_bytes() const { return workspace_bytes_; }
  const GemmBf16Shape& shape() const { return shape_; }

 private:
  GemmBf16Plan() = default;

  cublasLtHandle_t handle_ = nullptr;
  GemmBf16Shape shape_;
  LtMatmulDesc desc_;
  LtLayout a_, b_, c_;
  cublasLtMatmulAlgo_t algo_{};
  size_t workspace_bytes_ = 0;
};

}  // namespace glm::kernels
