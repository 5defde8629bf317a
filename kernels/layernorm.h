// LayerNorm: y[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * w + b, biased variance, fp32
// accumulation (engine/backend/backend.h LayerNorm; the DSA indexer's k_norm).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

// x: [rows, cols] row stride x_ld; w, b: [cols]; y: [rows, cols] row stride y_ld; fp32 on the
// device. y may alias x (same ld). rows == 0 is a no-op.
absl::Status LayerNorm(const float* x, int64_t x_ld, const float* w, const float* b, float eps,
                       float* y, int64_t y_ld, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace glm::kernels
