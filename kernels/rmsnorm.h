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

}  // namespace glm::kernels
