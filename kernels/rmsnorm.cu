#include "kernels/rmsnorm.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/rmsnorm.cuh"

namespace glm::kernels {

absl::Status RmsNorm(DType dtype, const void* x, int64_t x_ld, const void* w, float eps, void* y,
                     int64_t y_ld, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr std::string_view kOp = "RmsNorm";
  if (rows < 0 || rows > 0x7fffffff || cols <= 0 || x_ld < cols || y_ld < cols ||
      !(eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RmsNorm: bad shape rows=", rows, " cols=", cols, " x_ld=", x_ld, " y_ld=", y_ld,
        " eps=", eps, " (need 0 <= rows < 2^31, cols > 0, ld >= cols, eps >= 0)"));
  }
  if (rows == 0) return absl::OkStatus();
  if (x == y && x_ld != y_ld) {
    return absl::InvalidArgumentError("RmsNorm: y aliases x with a different row stride");
  }
  GLM_RETURN_IF_ERROR(CheckDevicePointer(x, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(w, kOp, "w"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(y, kOp, "y"));
  const dim3 grid(static_cast<unsigned>(rows));
  if (dtype == DType::kF32) {
    detail::RmsNormKernel<float><<<grid, detail::kRmsNormThreads, 0, stream>>>(
        static_cast<const float*>(x), x_ld, static_cast<const float*>(w), eps,
        static_cast<float*>(y), y_ld, cols);
  } else {
    detail::RmsNormKernel<__nv_bfloat16><<<grid, detail::kRmsNormThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), x_ld, static_cast<const __nv_bfloat16*>(w), eps,
        static_cast<__nv_bfloat16*>(y), y_ld, cols);
  }
  return CudaStatus(cudaGetLastError(), "RmsNorm launch");
}

}  // namespace glm::kernels
