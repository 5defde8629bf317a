// RMSNorm: y[r, :] = w * x[r, :] * rsqrt(mean(x[r, :]^2) + eps), fp32 accumulation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

// x: [rows, cols] row stride x_ld; w: [cols]; y: [rows, cols] row stride y_ld; all of `dtype`
// (kF32 or kBF16) on the device. y may alias x (same ld). rows == 0 is a no-op.
absl::Status RmsNorm(DType dtype, const void* x, int64_t x_ld, const void* w, float eps, void* y,
                     int64_t y_ld, int64_t rows, int64_t cols, cudaStream_t stream);

// The threads RmsNorm gives each row of an fp32 call with these pointers and strides when it runs
// its one-round-trip kernel on 16-byte vectors (rmsnorm.cuh RmsNormRegKernel<float, 4, 2>: x, w
// and y 16-byte aligned, cols and both strides multiples of 4, cols <= 8192); 0 when it takes
// another kernel. A kernel that repeats that kernel's summation order with this many virtual
// threads (gemv_narrow's fused RmsNorm) gets the same scale, so the same values, bit for bit.
int RmsNormF32VecThreads(int64_t cols, const float* x, int64_t x_ld, const float* w, const float* y,
                         int64_t y_ld);

}  // namespace glm::kernels
