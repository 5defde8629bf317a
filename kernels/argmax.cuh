// argmax_rows: one CTA of kArgmaxThreads per row; each thread scans a strided slice keeping
// (value, index), then a warp-shuffle and shared-memory reduction with ties to the lower index.
// NaN never wins (comparisons with NaN are false). Limits: vocab < 2^31.
#pragma once

#include <cstdint>

#include "kernels/dtype_util.cuh"
#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline constexpr int kArgmaxThreads = 512;

__device__ __forceinline__ void ArgmaxCombine(float& v, int32_t& i, float ov, int32_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads) ArgmaxRowsKernel(const T* __restrict__ logits, int64_t ld,
                                                                   int32_t vocab, int32_t* out) {
  PdlEnter();
  __shared__ float s_v[32];
  __shared__ int32_t s_i[32];
  const T* row = logits + blockIdx.x * ld;
  float best = -INFINITY;
  int32_t best_i = 0x7fffffff;
  // kUnroll independent loads in flight per thread before the compares (latency, not
  // bandwidth, bounds one CTA per row otherwise).
  constexpr int kUnroll = 8;
  const int32_t step = static_cast<int32_t>(blockDim.x);
  int32_t c = threadIdx.x;
  for (; c + (kUnroll - 1) * step < vocab; c += kUnroll * step) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ToFloat(row[c + u * step]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) ArgmaxCombine(best, best_i, v[u], c + u * step);
  }
  for (; c < vocab; c += step) ArgmaxCombine(best, best_i, ToFloat(row[c]), c);
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    ArgmaxCombine(best, best_i, ov, oi);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_v[warp] = best;
    s_i[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x / 32;
    best = lane < num_warps ? s_v[lane] : -INFINITY;
    best_i = lane < num_warps ? s_i[lane] : 0x7fffffff;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, off);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, best_i, off);
      ArgmaxCombine(best, best_i, ov, oi);
    }
    if (lane == 0) out[blockIdx.x] = best_i == 0x7fffffff ? 0 : best_i;
  }
}

}  // namespace glm::kernels::detail
