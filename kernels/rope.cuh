// rope_interleaved: one CTA per row. Threads first compute cos/sin of the row's num_freqs angles
// into shared memory (fp64 sincos of the fp32 angle, matching the CPU reference), then rotate
// every (head, pair) of the row. Limits: num_freqs <= kRopeMaxFreqs (8 KiB of shared memory).
#pragma once

#include <cstdint>

#include "kernels/dtype_util.cuh"

namespace glm::kernels::detail {

inline constexpr int kRopeThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRopeThreads) RopeInterleavedKernel(
    T* x, int64_t heads, int64_t row_stride, int64_t head_stride, const int32_t* positions,
    const float* inv_freq, int num_freqs) {
  __shared__ float s_cos[1024];
  __shared__ float s_sin[1024];
  const int64_t row = blockIdx.x;
  const float pos = static_cast<float>(positions[row]);
  for (int i = threadIdx.x; i < num_freqs; i += blockDim.x) {
    const float angle = pos * inv_freq[i];
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    s_cos[i] = static_cast<float>(c);
    s_sin[i] = static_cast<float>(s);
  }
  __syncthreads();
  T* xr = x + row * row_stride;
  const int64_t pairs = heads * num_freqs;
  for (int64_t j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int64_t h = j / num_freqs;
    const int i = static_cast<int>(j - h * num_freqs);
    T* p = xr + h * head_stride + 2 * i;
    const float a = ToFloat(p[0]), b = ToFloat(p[1]);
    p[0] = FromFloat<T>(a * s_cos[i] - b * s_sin[i]);
    p[1] = FromFloat<T>(b * s_cos[i] + a * s_sin[i]);
  }
}

}  // namespace glm::kernels::detail
