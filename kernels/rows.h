// Row ops on fp32 matrices with row strides (engine/backend/backend.h Fill / Add / Copy /
// GatherRows / ScatterRows): fills, accumulation, and row copies through optional int32 row maps
// (embedding lookup, KV gather, paged KV write).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

// y[r, c] = value for r < rows, c < cols. y: [rows, cols] row stride y_ld, fp32 on the device.
absl::Status FillRows(float* y, int64_t y_ld, int64_t rows, int64_t cols, float value,
                      cudaStream_t stream);

// y[r, c] += x[r, c]. x, y: [rows, cols] with their own row strides. y may alias x (same ld).
absl::Status AddRows(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows,
                     int64_t cols, cudaStream_t stream);

// dst[dst_rows ? dst_rows[i] : i, c] = src[src_rows ? src_rows[i] : i, c] for i < rows,
// c < cols. src_rows / dst_rows: optional [rows] int32 on the device, null = identity. Row ids
// are trusted (checked by the caller at setup); with a dst_rows map, ids must be distinct.
// Copy: both null. GatherRows: src_rows only. ScatterRows: dst_rows only.
absl::Status CopyRows(const float* src, int64_t src_ld, const int32_t* src_rows, float* dst,
                      int64_t dst_ld, const int32_t* dst_rows, int64_t rows, int64_t cols,
                      cudaStream_t stream);

}  // namespace glm::kernels
