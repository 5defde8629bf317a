#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/layernorm.h"

namespace glm::kernels {

absl::Status LayerNorm(const float* x, int64_t x_ld, const float* w, const float* b, float eps,
                       float* y, int64_t y_ld, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr std::string_view kOp = "LayerNorm";
  if (rows < 0 || rows > 0x7fffffff || cols <= 0 || cols > 0x7fffffff || x_ld < cols ||
      y_ld < cols || !(eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LayerNorm: bad shape rows=", rows, " cols=", cols, " x_ld=", x_ld, " y_ld=", y_ld,
        " eps=", eps, " (need 0 <= rows < 2^31, 0 < cols < 2^31, ld >= cols, eps >= 0)"));
  }
  if (rows == 0) return absl::OkStatus();
  if (x == y && x_ld != y_ld) {
    return absl::InvalidArgumentError("LayerNorm: y aliases x with a different row stride");
  }
  GLM_RETURN_IF_ERROR(CheckDevicePointer(x, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(w, kOp, "w"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(b, kOp, "b"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(y, kOp, "y"));
  LaunchKernel(detail::LayerNormKernel, static_cast<unsigned>(rows), detail::kLayerNormThreads, 0,
               stream, x, x_ld, w, b, eps, y, y_ld, cols);
  return CudaStatus(cudaGetLastError(), "LayerNorm launch");
}

}  // namespace glm::kernels
