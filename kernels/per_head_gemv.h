// Small-M fp32 GEMV over a batch of heads (absorbed MLA W_UK^T / W_UV; with heads == 1 an fp32
// Linear such as the MoE router):
//   y[m, h, n] (+)= sum_k x[m, h, k] * w[h][n, k]   m < rows, h < heads, n < out_dim, k < in_dim
// fp32 in, fp32 accumulation, fp32 out, deterministic (fixed summation order, no atomics): graph
// replay equals eager bit for bit. Meant for decode (rows <= kPerHeadGemvMaxRows), streaming the
// weights with 16-byte loads over every SM instead of a batched cuBLAS GEMV.
// Status: CudaBackend::Linear runs fp32 Linears of one row with weights up to 16 MiB on it
// (heads = 1: the MoE router, 6144 -> 256), launched with programmatic dependent launch
// (launch.cuh) rather than on cuBLASLt. Measured (H200, smallops_bench, graph replay): router
// 4.25 µs at M = 1 (1.48 TB/s), where cuBLASLt takes 6.3 µs for it (ncu, alone).
// Larger weights and more rows stay on cuBLASLt: W_UK^T / W_UV shapes 11.4 µs at M = 1 (2.2 /
// 3.0 TB/s) and ~3 µs more per row (M = 16: 58-73 µs), since every warp re-reads all of x from
// shared memory per 2 output rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace glm::kernels {

inline constexpr int64_t kPerHeadGemvMaxRows = 16;
// x[:, h, :] is staged in shared memory: rows * in_dim * 4 bytes must fit in this.
inline constexpr int64_t kPerHeadGemvMaxSmemBytes = 48 * 1024;

// Whether PerHeadGemv takes this shape (1 <= rows <= kPerHeadGemvMaxRows, x of one head fits
// the shared-memory stage). Any strides and alignment are accepted; 16-byte weight loads are
// used when w, w_ld, w_head_stride and in_dim allow.
bool PerHeadGemvSupported(int64_t rows, int64_t in_dim);

// Element (m, h, k) of x at x[m * x_row_stride + h * x_head_stride + k]; w[h] row n at
// w + h * w_head_stride + n * w_ld; y (m, h, n) at y[m * y_row_stride + h * y_head_stride + n].
// All device pointers. y must not overlap x or w. accumulate: y += result instead of y = result.
// rows == 0 or heads == 0 or out_dim == 0 is a no-op; in_dim == 0 writes zeros (or leaves y).
// norm (optional, heads == 1): an fp32 RmsNorm fused ahead of the product. Each CTA normalizes
// its staged x rows to w * x * rsqrt(mean(x^2) + eps) in the summation order of RmsNorm's vector
// kernel (kernels/rmsnorm.cuh), so y is what RmsNorm into `out` followed by PerHeadGemv on `out`
// gives, bit for bit, in one launch; CTA 0 writes the normalized rows to out ([rows, in_dim],
// row stride out_ld; apart from x, w and y). PerHeadGemvNormFusible says when it applies.
struct PerHeadGemvNorm {
  const float* w = nullptr;  // [in_dim]
  float eps = 0.0f;
  float* out = nullptr;
  int64_t out_ld = 0;
};
// Whether `norm` applies to a call of rows x in_dim with one head: RmsNorm's vector kernel takes
// the rows (rmsnorm.h RmsNormF32VecThreads > 0: x, w and out 16-byte aligned, strides and in_dim
// multiples of 4, in_dim <= 8192), out overlaps neither x nor w, and the stage still fits.
bool PerHeadGemvNormFusible(const float* x, int64_t x_row_stride, int64_t rows, int64_t in_dim,
                            const PerHeadGemvNorm& norm);

absl::Status PerHeadGemv(const float* x, int64_t x_row_stride, int64_t x_head_stride,
                         const float* w, int64_t w_head_stride, int64_t w_ld, float* y,
                         int64_t y_row_stride, int64_t y_head_stride, int64_t rows, int64_t heads,
                         int64_t in_dim, int64_t out_dim, bool accumulate, cudaStream_t stream,
                         const PerHeadGemvNorm* norm = nullptr);

}  // namespace glm::kernels
