// Per-head products with one Linear weight kept in its stored (narrow) form: MLA absorption on
// kv_b_proj ([num_heads * head_rows, cols], bf16 or fp8 e4m3 with 128x128 block scales, or fp32)
// without a transposed or widened copy. Head h's block starts at weight row
// base(h) = h * head_rows + row_begin. Two contractions, for rows m < num_tokens, heads h:
//   kRows (W_UK, absorbed query):  y[m, h, c] = sum_{d < in_dim}  x[m, h, d] * W[base(h) + d, c],
//                                   c < out_dim (<= the weight's columns)
//   kCols (W_UV, absorbed output): y[m, h, j] = sum_{c < in_dim}  x[m, h, c] * W[base(h) + j, c],
//                                   j < out_dim
// Numerics, weight-only: every weight element is widened exactly as the other kernels widen it
// (bf16 -> fp32 exact; fp8 -> float(q) * block_scale, one fp32 multiply; fp32 as is); x is used
// as given in fp32 (no rounding, no quantization); products accumulate in fp32 and y is written
// in fp32. So y equals fp32 math on the widened weight up to the order of summation.
// Deterministic (fixed summation order, no atomics): graph replay equals eager bit for bit.
// One launch per call, all heads, any num_tokens >= 1 (decode: 1..64; larger counts loop over
// token tiles inside the CTA). Sized from the device's SM count (per_head_narrow.cu).
// per_head_narrow.cuh has the tiling.
// Measured (H200, per_head_narrow_bench, GLM-5 widths, CUDA-graph replay with weights from HBM;
// docs/benchmarks.md has the table): W_UK 5.4 µs fp8 at 1 token vs 9.8 µs for the fp32 cuBLASLt
// GEMM on the fp32 copy it replaces; W_UV fp8 at 1 / 8 tokens 5.98 / 19.72 µs vs 11.0 / 26.3.
// kCols stages x plane by plane and reads each float4 once for all of a warp's rows (one read
// per weight row was 4-way bank-conflicted and bound W_UV by shared memory). At 64 tokens still
// 4-6x slower than the GEMM (kRows re-reads x per weight row and holds kMT x 16 accumulators).
// Only 0.24-0.68 of the D2D copy rate at 1 token: latency bound (the products are 6-17 MB).
// CudaBackend::AbsorbPerHead uses it up to 8 tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace glm::kernels {

enum class PerHeadWeight { kF32, kBF16, kF8E4M3Block128 };
enum class PerHeadContract { kRows, kCols };

struct PerHeadNarrowArgs {
  PerHeadContract contract = PerHeadContract::kCols;
  PerHeadWeight weight = PerHeadWeight::kBF16;
  // x (m, h, k) at x[m * x_row_stride + h * x_head_stride + k]; fp32, 4-byte aligned.
  const float* x = nullptr;
  int64_t x_row_stride = 0;
  int64_t x_head_stride = 0;
  // Weight [*, ldw] elements of `weight` (ldw >= the columns used, rounded up to 16 bytes);
  // 16-byte aligned, ldw * element size a multiple of 16 (WeightLoader::Linear stores bf16 / fp8
  // weights so; fp32 needs ldw % 4 == 0). Read (with w_scales) before the kernel waits for the
  // previous one (programmatic dependent launch, kernels/launch.cuh): w must not be written by
  // the kernel launched just before (model weights are immutable).
  const void* w = nullptr;
  int64_t ldw = 0;
  // fp8: scale of element (r, c) = w_scales[(r / 128) * w_scale_ld + c / 128].
  const float* w_scales = nullptr;
  int64_t w_scale_ld = 0;
  int64_t head_rows = 0;  // weight rows per head (kv_b_proj: qk_nope_head_dim + v_head_dim)
  int64_t row_begin = 0;  // first row of the product's block inside a head's rows
  // y (m, h, n) at y[m * y_row_stride + h * y_head_stride + n]; must not overlap x or w.
  float* y = nullptr;
  int64_t y_row_stride = 0;
  int64_t y_head_stride = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t in_dim = 0;   // kRows: weight rows contracted; kCols: weight columns contracted
  int64_t out_dim = 0;  // kRows: weight columns produced; kCols: weight rows produced
  // Run beside the kernel launched just before this one on the stream (programmatic dependent
  // launch, kernels/launch.cuh) instead of after it. Only when x was complete before that
  // kernel could start, i.e. it waits for its own predecessor before it lets dependents launch
  // (PdlEnter; not gemv_narrow, which lets them launch first), and it neither reads nor writes x
  // or y. The kernel then lets the next kernel launch at once, reads x from L2, writes y, and
  // waits for the previous kernel only before it exits: the next kernel's wait covers both, and
  // y is the same as without (the MLA W_UK product beside the indexer's last kernel).
  bool beside_previous = false;
};

// Largest in_dim the kernels take (x of one token tile is staged in shared memory).
int64_t PerHeadNarrowMaxInDim(PerHeadContract contract);

// Checks shapes, strides, alignment and pointers (InvalidArgument naming the rule and the fix),
// then enqueues one kernel on `stream`. num_tokens, num_heads or out_dim == 0: no-op; in_dim == 0
// writes zeros. Allocates nothing: graph-capturable.
absl::Status PerHeadNarrow(const PerHeadNarrowArgs& args, cudaStream_t stream);

// The product's weight blocks widened to fp32 (the same per-element arithmetic as the kernels)
// in the layout of an fp32 per-head GEMM y[m, h, :] = x[m, h, :] . B[h]^T:
//   dst[(h * out_dim + n) * in_dim + k] = kCols: W[base(h) + n, k];  kRows: W[base(h) + k, n].
// For many tokens, where a tensor-core-free fp32 GEMM (cuBLASLt) on the widened copy beats
// PerHeadNarrow's per-tile weight streaming; the result is still fp32 math on the widened
// weights. x, y and num_tokens of `args` are ignored; dst: num_heads * out_dim * in_dim floats
// of device memory. Same checks as PerHeadNarrow (weight, shapes).
absl::Status PerHeadWidenF32(const PerHeadNarrowArgs& args, float* dst, cudaStream_t stream);

// "kRows bf16 m=1 heads=64 in=192 out=512" (benches, errors).
std::string PerHeadNarrowDebugString(const PerHeadNarrowArgs& args);

}  // namespace glm::kernels
