// Interleaved (GPT-J) RoPE in place, as engine/backend/backend.h RopeInterleaved: on dims
// [0, 2 * num_freqs) of every head, pair (2i, 2i+1) rotates by positions[row] * inv_freq[i]
// (angle in fp32, cos/sin evaluated in fp64 and rounded, like the CPU backend).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

inline constexpr int kRopeMaxFreqs = 1024;

// A second set of heads for the same launch: element (r, h, d) at x[r * row_stride +
// h * head_stride + d] with the first set's row_stride and dtype.
struct RopeHeads {
  void* x;
  int64_t heads, head_stride;
};

// x: element (r, h, d) at x[r * row_stride + h * head_stride + d], `dtype` on the device;
// positions: [rows] int32; inv_freq: [num_freqs] fp32, 1 <= num_freqs <= kRopeMaxFreqs.
// Heads must not overlap: head_stride >= 2 * num_freqs (or heads == 1). second (optional): more
// heads rotated by the same launch (the same rows, positions and frequencies; its rotated dims
// must not overlap the first set's).
absl::Status RopeInterleaved(DType dtype, void* x, int64_t rows, int64_t heads, int64_t row_stride,
                             int64_t head_stride, const int32_t* positions, const float* inv_freq,
                             int num_freqs, cudaStream_t stream, const RopeHeads* second = nullptr);

}  // namespace glm::kernels
