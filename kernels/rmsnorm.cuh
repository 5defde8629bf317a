// rmsnorm, two kernels:
// - RmsNormRegKernel (every model width; the decode path): one CTA per row, sized to the row
//   (threads = ceil(cols / (kVec * kItems)) rounded to a warp, at most 1024). Each thread loads
//   its kItems vectors of x AND w up front (16-byte loads when the row is aligned, kVec = 1
//   otherwise), so a row costs one memory round trip, one block reduction of sum(x^2) in fp32,
//   and the writes from registers. Summation order: per thread over its items, then the fixed
//   warp-shuffle tree and warp order of BlockSum (deterministic).
// - RmsNormKernel (rows wider than 1024 threads x 2 vectors, or x 8 scalars when unaligned): 256
//   threads, two passes over the row (the second read hits L1/L2).
// Limits: cols < 2^31, rows < 2^31.
#pragma once

#include <cstdint>

#include "kernels/dtype_util.cuh"
#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline constexpr int kRmsNormThreads = 256;
inline constexpr int kRmsNormRegMaxThreads = 1024;

// kVec consecutive elements of T, loaded / stored as one access (16 bytes for the vector paths).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) RmsVec {
  T v[kVec];
};

template <typename T, int kVec, int kItems>
__global__ void __launch_bounds__(kRmsNormRegMaxThreads)
    RmsNormRegKernel(const T* x, int64_t x_ld, const T* w, float eps, T* y, int64_t y_ld,
                     int64_t cols) {
  PdlEnter();
  __shared__ float scratch[32];
  using V = RmsVec<T, kVec>;
  const V* xr = reinterpret_cast<const V*>(x + blockIdx.x * x_ld);
  const V* wv = reinterpret_cast<const V*>(w);
  V* yr = reinterpret_cast<V*>(y + blockIdx.x * y_ld);
  const int64_t nvec = cols / kVec;  // the launcher guarantees cols % kVec == 0
  V xv[kItems], ww[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int64_t j = static_cast<int64_t>(it) * blockDim.x + threadIdx.x;
    if (j < nvec) {
      xv[it] = xr[j];
      ww[it] = wv[j];
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int64_t j = static_cast<int64_t>(it) * blockDim.x + threadIdx.x;
    if (j < nvec) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float v = ToFloat(xv[it].v[e]);
        sum = fmaf(v, v, sum);
      }
    }
  }
  sum = BlockSum(sum, scratch);
  const float scale = rsqrtf(sum / static_cast<float>(cols) + eps);
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int64_t j = static_cast<int64_t>(it) * blockDim.x + threadIdx.x;
    if (j < nvec) {
      V out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        out.v[e] = FromFloat<T>(ToFloat(ww[it].v[e]) * (ToFloat(xv[it].v[e]) * scale));
      }
      yr[j] = out;
    }
  }
}

// Kernels that fuse an fp32 RmsNorm into their own work (gemv_narrow, per_head_gemv) repeat the
// summation order of RmsNormRegKernel<float, 4, 2> with rmsnorm.h's RmsNormF32VecThreads threads,
// so that their scale, and every normalized value, is RmsNorm's bit for bit:
// - RmsNormVec4ThreadSum: virtual thread j's sum of squares of float4 j (a) and float4 j +
//   threads (b) of the row, each only where it exists: fma over a's elements, then b's.
// - RmsNormWarpSum: BlockSum's butterfly over a warp (every lane gets the same sum): first over
//   each virtual warp's 32 thread sums, then over the virtual warps' sums (lane w: warp w's, 0
//   past the last); scale = rsqrtf(sum / cols + eps).
__device__ __forceinline__ float RmsNormVec4ThreadSum(const float4& a, bool va, const float4& b,
                                                      bool vb) {
  float s = 0.0f;
  if (va) {
    s = fmaf(a.x, a.x, s);
    s = fmaf(a.y, a.y, s);
    s = fmaf(a.z, a.z, s);
    s = fmaf(a.w, a.w, s);
  }
  if (vb) {
    s = fmaf(b.x, b.x, s);
    s = fmaf(b.y, b.y, s);
    s = fmaf(b.z, b.z, s);
    s = fmaf(b.w, b.w, s);
  }
  return s;
}

__device__ __forceinline__ float RmsNormWarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kRmsNormThreads) RmsNormKernel(const T* x, int64_t x_ld,
                                                                 const T* w, float eps, T* y,
                                                                 int64_t y_ld, int64_t cols) {
  PdlEnter();
  __shared__ float scratch[32];
  const T* xr = x + blockIdx.x * x_ld;
  T* yr = y + blockIdx.x * y_ld;
  // kUnroll independent loads in flight per thread (one CTA per row is latency-bound otherwise).
  constexpr int kUnroll = 8;
  const int64_t step = blockDim.x;
  float sum = 0.0f;
  int64_t i0 = threadIdx.x;
  for (; i0 + (kUnroll - 1) * step < cols; i0 += kUnroll * step) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ToFloat(xr[i0 + u * step]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) sum = fmaf(v[u], v[u], sum);
  }
  for (; i0 < cols; i0 += step) {
    const float v = ToFloat(xr[i0]);
    sum = fmaf(v, v, sum);
  }
  sum = BlockSum(sum, scratch);
  const float scale = rsqrtf(sum / static_cast<float>(cols) + eps);
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * step < cols; i += kUnroll * step) {
    float xv[kUnroll], wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      xv[u] = ToFloat(xr[i + u * step]);
      wv[u] = ToFloat(w[i + u * step]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) yr[i + u * step] = FromFloat<T>(wv[u] * (xv[u] * scale));
  }
  for (; i < cols; i += step) yr[i] = FromFloat<T>(ToFloat(w[i]) * (ToFloat(xr[i]) * scale));
}

}  // namespace glm::kernels::detail
