// rows: grid-stride over rows * cols elements, one fp32 element per thread per step, with the
// row index mapped through optional int32 tables. Memory-bound; no shared memory. Limits:
// rows * cols < 2^62.
#pragma once

#include <cstdint>

#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline constexpr int kRowsThreads = 256;

__global__ void __launch_bounds__(kRowsThreads) FillRowsKernel(float* y, int64_t y_ld,
                                                               int64_t rows, int64_t cols,
                                                               float value) {
  PdlEnter();
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e - r * cols;
    y[r * y_ld + c] = value;
  }
}

__global__ void __launch_bounds__(kRowsThreads) AddRowsKernel(const float* x, int64_t x_ld,
                                                              float* y, int64_t y_ld,
                                                              int64_t rows, int64_t cols) {
  PdlEnter();
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e - r * cols;
    y[r * y_ld + c] += x[r * x_ld + c];
  }
}

__global__ void __launch_bounds__(kRowsThreads) CopyRowsKernel(const float* src, int64_t src_ld,
                                                               const int32_t* src_rows,
                                                               float* dst, int64_t dst_ld,
                                                               const int32_t* dst_rows,
                                                               int64_t rows, int64_t cols) {
  PdlEnter();
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / cols, c = e - i * cols;
    const int64_t sr = src_rows != nullptr ? src_rows[i] : i;
    const int64_t dr = dst_rows != nullptr ? dst_rows[i] : i;
    dst[dr * dst_ld + c] = src[sr * src_ld + c];
  }
}

}  // namespace glm::kernels::detail
