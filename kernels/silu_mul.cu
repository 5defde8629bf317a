#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/silu_mul.cuh"
#include "kernels/silu_mul.h"

namespace glm::kernels {

absl::Status SiluMul(DType dtype, const void* gate, int64_t gate_ld, const void* up,
                     int64_t up_ld, void* out, int64_t out_ld, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  constexpr std::string_view kOp = "SiluMul";
  if (rows < 0 || cols <= 0 || gate_ld < cols || up_ld < cols || out_ld < cols) {
    return absl::InvalidArgumentError(absl::StrCat("SiluMul: bad shape rows=", rows, " cols=",
                                                   cols, " gate_ld=", gate_ld, " up_ld=", up_ld,
                                                   " out_ld=", out_ld,
                                                   " (need rows >= 0, cols > 0, ld >= cols)"));
  }
  if (rows == 0) return absl::OkStatus();
  if ((out == gate && out_ld != gate_ld) || (out == up && out_ld != up_ld)) {
    return absl::InvalidArgumentError("SiluMul: out aliases an input with a different stride");
  }
  GLM_RETURN_IF_ERROR(CheckDevicePointer(gate, kOp, "gate"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(up, kOp, "up"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(out, kOp, "out"));
  const int64_t total = rows * cols;
  const int64_t blocks = std::min<int64_t>((total + detail::kSiluMulThreads - 1) /
                                               detail::kSiluMulThreads,
                                           int64_t{1} << 20);
  const dim3 grid(static_cast<unsigned>(blocks));
  if (dtype == DType::kF32) {
    LaunchKernel(detail::SiluMulKernel<float>, grid, detail::kSiluMulThreads, 0, stream,
                 static_cast<const float*>(gate), gate_ld, static_cast<const float*>(up), up_ld,
                 static_cast<float*>(out), out_ld, rows, cols);
  } else {
    LaunchKernel(detail::SiluMulKernel<__nv_bfloat16>, grid, detail::kSiluMulThreads, 0, stream,
                 static_cast<const __nv_bfloat16*>(gate), gate_ld,
                 static_cast<const __nv_bfloat16*>(up), up_ld, static_cast<__nv_bfloat16*>(out),
                 out_ld, rows, cols);
  }
  return CudaStatus(cudaGetLastError(), "SiluMul launch");
}

}  // namespace glm::kernels
