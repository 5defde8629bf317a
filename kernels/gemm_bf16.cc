#include "kernels/gemm_bf16.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::kernels {

std::string GemmBf16Shape::DebugString() const {
  return absl::StrCat("m=", m, " n=", n, " k=", k, " ldx=", ldx, " ldw=", ldw, " ldy=", ldy,
                      " out=", out == DType::kF32 ? "f32" : "bf16");
}

absl::StatusOr<std::unique_ptr<GemmBf16Plan>> GemmBf16Plan::Create(const BlasLtHandle& handle,
                                                                   const GemmBf16Shape& shape_in,
                                                                   size_t max_workspace_bytes) {
  GemmBf16Shape s = shape_in;
  if (s.ldx == 0) s.ldx = s.k;
  if (s.ldw == 0) s.ldw = s.k;
  if (s.ldy == 0) s.ldy = s.n;
  if (s.m < 0 || s.n <= 0 || s.k <= 0 || s.ldx < s.k || s.ldw < s.k || s.ldy < s.n ||
      s.m > INT32_MAX || s.n > INT32_MAX || s.k > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmBf16Plan: bad shape ", s.DebugString(),
                     " (need m >= 0, n > 0, k > 0, ldx >= k, ldw >= k, ldy >= n, each < 2^31)"));
  }
  auto plan = std::unique_ptr<GemmBf16Plan>(new GemmBf16Plan());
  plan->handle_ = handle.get();
  plan->shape_ = s;
  if (s.m == 0) return plan;

  const cudaDataType_t out_type = s.out == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc = nullptr;
  GLM_RETURN_IF_ERROR(CublasStatus(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                   "cublasLtMatmulDescCreate"));
  plan->desc_.reset(desc);
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  GLM_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)),
      "set TRANSA"));
  GLM_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)),
      "set TRANSB"));
  // Column-major view: A = w as [k, n] (ld ldw), B = x as [k, m] (ld ldx), C = D = y as [n, m].
  GLM_ASSIGN_OR_RETURN(plan->a_, MakeLtLayout(CUDA_R_16BF, s.k, s.n, s.ldw));
  GLM_ASSIGN_OR_RETURN(plan->b_, MakeLtLayout(CUDA_R_16BF, s.k, s.m, s.ldx));
  GLM_ASSIGN_OR_RETURN(plan->c_, MakeLtLayout(out_type, s.n, s.m, s.ldy));

  cublasLtMatmulPreference_t pref_raw = nullptr;
  GLM_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&pref_raw), "cublasLtMatmulPreferenceCreate"));
  LtPreference pref(pref_raw);
  const uint64_t ws = max_workspace_bytes;
  const uint32_t align = kGemmPointerAlignment;
  GLM_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof(ws)),
      "set MAX_WORKSPACE_BYTES"));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    GLM_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulPreferenceSetAttribute(pref_raw, attr, &align, sizeof(align)),
        "set MIN_ALIGNMENT"));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(plan->handle_, desc, plan->a_.get(), plan->b_.get(),
                                     plan->c_.get(), plan->c_.get(), pref_raw, 1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "GemmBf16Plan: cuBLASLt has no algorithm for ", s.DebugString(), " with ",
        kGemmPointerAlignment, "-byte aligned pointers and <= ", max_workspace_bytes,
        " bytes of workspace on this device (heuristic status ", static_cast<int>(st),
        "); try a larger workspace or padded strides"));
  }
  plan->algo_ = result.algo;
  plan->workspace_bytes_ = result.workspaceSize;
  return plan;
}

absl::Status GemmBf16Plan::Run(const void* x, const void* w, void* y, bool accumulate,
                               void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) const {
  constexpr std::string_view kOp = "GemmBf16";
  if (shape_.m == 0) return absl::OkStatus();
  for (auto [p, name] : {std::pair<const void*, const char*>{x, "x"}, {w, "w"}, {y, "y"}}) {
    if (p == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("GemmBf16: ", name, " is null"));
    }
    GLM_RETURN_IF_ERROR(CheckAligned(p, kGemmPointerAlignment, kOp, name));
  }
  if (workspace_bytes < workspace_bytes_ || (workspace_bytes_ > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("GemmBf16: workspace of ", workspace_bytes,
                                                   " bytes is smaller than the plan's ",
                                                   workspace_bytes_, " (", shape_.DebugString(),
                                                   "); pass workspace_bytes() of device memory"));
  }
  if (workspace != nullptr) GLM_RETURN_IF_ERROR(CheckAligned(workspace, 256, kOp, "workspace"));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return CublasStatus(
      cublasLtMatmul(handle_, desc_.get(), &alpha, w, a_.get(), x, b_.get(), &beta, y, c_.get(), y,
                     c_.get(), &algo_, workspace, workspace_bytes_, stream),
      "GemmBf16: cublasLtMatmul");
}

}  // namespace glm::kernels
