// Device helpers shared by the MoE kernels (kernels/moe_*.cuh): the routing kernels' block scan
// and the weight-row tasks of the decode and token-group kernels (a task: kDecWRows weight rows
// of one expert, i.e. 2 gate + 2 up rows fused or 4 down rows, against a few token rows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/moe_common.h"

namespace glm::kernels::moe {

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, <= 1024); *total: the
// block's sum. Three __syncthreads; warp_sums: 32 ints of shared memory.
__device__ __forceinline__ int BlockExclusiveScan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x / 32;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int ws = lane < nw ? warp_sums[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int n = __shfl_up_sync(0xffffffffu, ws, o);
      if (lane >= o) ws += n;
    }
    if (lane < nw) warp_sums[lane] = ws;
  }
  __syncthreads();
  const int base = warp > 0 ? warp_sums[warp - 1] : 0;
  *total = warp_sums[nw - 1];
  __syncthreads();
  return base + incl - v;
}

// The end of a task pass: each (token row, weight row) sum reduced over the warp (fixed
// butterfly: deterministic), lane q writes output column n0 + q of rows < ng (fused: silu(gate
// q) * up q; down: row q).
template <bool kFused, int kNG>
__device__ __forceinline__ void DecodeEpilogue(const DecodeParams& p, float (&acc)[kNG][kDecWRows],
                                               const int* pair_of, int ng, int n0, int lane) {
  constexpr int kHalf = kDecWRows / 2;
#pragma unroll
  for (int r = 0; r < kNG; ++r) {
    if (r < ng) {  // warp-uniform
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
      }
      float* crow = p.c + int64_t{pair_of[r]} * p.n + n0;
      if constexpr (kFused) {
        // lane q < kHalf: column n0 + q = silu(gate q) * up q.
        float g = acc[r][0], u = acc[r][kHalf];
#pragma unroll
        for (int q = 1; q < kHalf; ++q) {
          if (lane == q) g = acc[r][q], u = acc[r][kHalf + q];
        }
        if (lane < kHalf && n0 + lane < p.n) crow[lane] = g / (1.0f + expf(-g)) * u;
      } else {
        float v = acc[r][0];
#pragma unroll
        for (int q = 1; q < kDecWRows; ++q) {
          if (lane == q) v = acc[r][q];
        }
        if (lane < kDecWRows && n0 + lane < p.n) crow[lane] = v;
      }
    }
  }
}

// The task's kDecWRows weight rows from its two halves' first rows (see DecodePass); rows past
// n read row n0 (valid) and are dropped.
template <bool kFused>
__device__ __forceinline__ void TaskRows(int n, const char* w0, int64_t ld0, const char* w1,
                                         int64_t ld1, int n0, const char* (&wr)[kDecWRows]) {
  constexpr int kHalf = kDecWRows / 2;
#pragma unroll
  for (int m = 0; m < kHalf; ++m) {
    const int q0 = m, q1 = kFused ? m : m + kHalf;
    wr[m] = w0 + (n0 + q0 < n ? q0 : 0) * ld0;
    wr[kHalf + m] = w1 + (n0 + q1 < n ? q1 : 0) * ld1;
  }
}

// First weight rows of a task's two row halves (see DecodePass) for output columns n0..:
// fused gate / up rows n0.., down rows n0.. (both halves; DecodePass adds the second's offset).
template <bool kFused, int kWT>
__device__ __forceinline__ void TaskWeights(const MoeExpert& ex, int n0, const char*& w0,
                                            int64_t& ld0, const char*& w1, int64_t& ld1,
                                            const float*& s0, const float*& s1) {
  constexpr int kEB = ElemBytes(kWT);
  if constexpr (kFused) {
    w0 = static_cast<const char*>(ex.gate) + int64_t{n0} * ex.gate_ld * kEB;
    w1 = static_cast<const char*>(ex.up) + int64_t{n0} * ex.up_ld * kEB;
    ld0 = ex.gate_ld * kEB, ld1 = ex.up_ld * kEB;
    if constexpr (kWT == kWFP8) {
      s0 = ex.gate_s + (n0 >> 7) * ex.gate_sld;
      s1 = ex.up_s + (n0 >> 7) * ex.up_sld;
    }
  } else {
    ld0 = ld1 = ex.down_ld * kEB;
    w0 = static_cast<const char*>(ex.down) + int64_t{n0} * ld0;
    w1 = w0;  // rows n0 + kDecWRows / 2.. (DecodePass adds the half's offset)
    if constexpr (kWT == kWFP8) s0 = s1 = ex.down_s + (n0 >> 7) * ex.down_sld;
  }
}

}  // namespace glm::kernels::moe
