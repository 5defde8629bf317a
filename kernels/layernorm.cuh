// layernorm: one CTA of kLayerNormThreads per row, three passes over the row like the CPU
// reference: sum -> mean, sum of (x - mean)^2 -> biased variance (two-pass, no cancellation),
// then the normalized write. Reads hit L1/L2 after the first pass for every model width.
// Limits: rows < 2^31, cols < 2^31.
#pragma once

#include <cstdint>

#include "kernels/dtype_util.cuh"
#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline constexpr int kLayerNormThreads = 256;

__global__ void __launch_bounds__(kLayerNormThreads) LayerNormKernel(
    const float* x, int64_t x_ld, const float* w, const float* b, float eps, float* y,
    int64_t y_ld, int64_t cols) {
  PdlEnter();
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * x_ld;
  float* yr = y + blockIdx.x * y_ld;
  const float n = static_cast<float>(cols);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += xr[i];
  const float mean = BlockSum(sum, scratch) / n;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float d = xr[i] - mean;
    sq = fmaf(d, d, sq);
  }
  const float var = BlockSum(sq, scratch) / n;
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
  }
}

}  // namespace glm::kernels::detail
