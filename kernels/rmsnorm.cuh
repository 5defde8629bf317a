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
  // kUnroll independent loads in flight per thread (one CTA per row is latency-bound otherwise).
  constexpr int kUnroll = 8;
  const int64_t step = blockDim.x;
  float sum = 0.0f;
  int64_t i0 = threadIdx.x;
  for (; i0 + (kUnroll - 1) * step < cols; i0 += kUnroll * step) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ToFloat(xr[i0 + u * step]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) sum = fmaf(v[u], v[u], sum);
  }
  for (; i0 < cols; i0 += step) {
    const float v = ToFloat(xr[i0]);
    sum = fmaf(v, v, sum);
  }
  sum = BlockSum(sum, scratch);
  const float scale = rsqrtf(sum / static_cast<float>(cols) + eps);
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * step < cols; i += kUnroll * step) {
    float xv[kUnroll], wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      xv[u] = ToFloat(xr[i + u * step]);
      wv[u] = ToFloat(w[i + u * step]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) yr[i + u * step] = FromFloat<T>(wv[u] * (xv[u] * scale));
  }
  for (; i < cols; i += step) yr[i] = FromFloat<T>(ToFloat(w[i]) * (ToFloat(xr[i]) * scale));
}

}  // namespace glm::kernels::detail
