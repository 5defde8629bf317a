// rmsnorm: one CTA of kRmsNormThreads per row. Pass 1 sums x^2 in fp32 (block reduction),
// pass 2 writes w * x * rsqrt(mean + eps). The row is read twice (the second read hits L1/L2 for
// rows up to tens of KB, every model width). Limits: cols < 2^31, rows < 2^31.
#pragma once

#include <cstdint>

#include "kernels/dtype_util.cuh"

namespace glm::kernels::detail {

inline constexpr int kRmsNormThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRmsNormThreads) RmsNormKernel(const T* x, int64_t x_ld,
                                                                 const T* w, float eps, T* y,
                                                                 int64_t y_ld, int64_t cols) {
  __shared__ float scratch[32];
  const T* xr = x + blockIdx.x * x_ld;
  T* yr = y + blockIdx.x * y_ld;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = ToFloat(xr[i]);
    sum = fmaf(v, v, sum);
  }
  sum = BlockSum(sum, scratch);
  const float scale = rsqrtf(sum / static_cast<float>(cols) + eps);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    yr[i] = FromFloat<T>(ToFloat(w[i]) * (ToFloat(xr[i]) * scale));
  }
}

}  // namespace glm::kernels::detail
