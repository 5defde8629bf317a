// per_head_gemv (per_head_gemv.h). Grid (CTA slots, heads); a CTA of kPhgWarps warps stages
// x[:, h, :] ([rows, in_dim] fp32) in shared memory once, then loops over groups of output rows
// of its head. Inside a CTA the warps form (kPhgWarps / ksplit) row teams x ksplit K slices:
// a warp owns kPhgRowsPerWarp output rows and every ksplit-th block of kPhgUnroll chunks of
// 32 * kVec columns of K; it issues all the block's weight loads (kVec = 4: 16-byte loads) before
// its FMAs, with the next block's loads in flight (two register buffers; the first two blocks
// are loaded before the grid-dependency wait), and stages x with up to 8 float4 loads per thread
// in flight. Summation order (fixed, so results are deterministic): per lane in K order over its
// blocks, then a butterfly over the warp, then (ksplit > 1) the K slices in slice order through
// shared memory. No atomics.
#pragma once

#include <cstdint>

#include "kernels/launch.cuh"
#include "kernels/rmsnorm.cuh"

namespace glm::kernels::detail {

inline constexpr int kPhgWarps = 8;
inline constexpr int kPhgThreads = kPhgWarps * 32;
inline constexpr int kPhgRowsPerWarp = 2;
inline constexpr int kPhgUnroll = 4;

struct PerHeadGemvArgs {
  const float* x;
  int64_t x_row_stride, x_head_stride;
  const float* w;
  int64_t w_head_stride, w_ld;
  float* y;
  int64_t y_row_stride, y_head_stride;
  int rows;
  int64_t in_dim, out_dim;
  int ksplit;          // K slices per row team: 1, 2, 4 or 8
  int64_t groups;      // output-row groups per head: ceil(out_dim / rows per CTA)
  bool accumulate;
  bool x_vec;  // x, its strides and in_dim allow 16-byte loads of the staged rows
  // Fused RmsNorm (PerHeadGemvNorm; norm_w null: none; heads == 1): the staged rows are
  // normalized in shared memory; CTA 0 writes them to norm_out.
  const float* norm_w;
  float norm_eps;
  int norm_threads;  // rmsnorm.h RmsNormF32VecThreads of the row
  float* norm_out;
  int64_t norm_out_ld;
};

template <int kVec>
struct alignas(4 * kVec) PhgVec {
  float v[kVec];
};

template <int kVec, int kMaxM>
__global__ void __launch_bounds__(kPhgThreads) PerHeadGemvKernel(PerHeadGemvArgs a) {
  // Fused norm: this thread's norm_w columns k = threadIdx.x + i * kPhgThreads (in_dim <= 8192),
  // loaded before the grid-dependency wait (immutable), in flight while x is staged.
  constexpr int kNormItems = 8192 / kPhgThreads;
  float norm_w[kNormItems];
  const bool norm = a.norm_w != nullptr;
#pragma unroll
  for (int i = 0; i < kNormItems; ++i) {
    const int64_t k = threadIdx.x + int64_t{i} * kPhgThreads;
    norm_w[i] = norm && k < a.in_dim ? __ldg(a.norm_w + k) : 0.0f;
  }
  extern __shared__ __align__(16) float smem[];
  constexpr int kRows = kPhgRowsPerWarp;
  using V = PhgVec<kVec>;
  const int64_t K = a.in_dim;
  const int64_t h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slice = warp % a.ksplit, team = warp / a.ksplit;
  const int teams = kPhgWarps / a.ksplit;
  const int64_t rows_per_cta = static_cast<int64_t>(teams) * kRows;
  constexpr int64_t kChunk = 32 * kVec;
  const int64_t block_cols = kChunk * kPhgUnroll;
  const float* wh = a.w + h * a.w_head_stride;

  // Two weight blocks of the warp's rows in registers: block i + 1's loads are in flight while
  // block i's FMAs run, and the first two are issued before the grid-dependency wait (a router
  // warp's whole K slice), so they overlap the previous kernel's tail and the staging of x.
  V wa[kRows][kPhgUnroll], wb[kRows][kPhgUnroll];
  // Loads the weight block starting at column kb of the warp's rows of group g into dst.
  auto load = [&](V(&dst)[kRows][kPhgUnroll], int64_t g, int64_t kb) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t n = g * rows_per_cta + team * kRows + r;
#pragma unroll
      for (int u = 0; u < kPhgUnroll; ++u) {
        const int64_t k = kb + u * kChunk + lane * kVec;
        if (n < a.out_dim && k < K) {
          dst[r][u] = *reinterpret_cast<const V*>(wh + n * a.w_ld + k);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) dst[r][u].v[e] = 0.0f;
        }
      }
    }
  };

  int64_t g = blockIdx.x;
  const int64_t kb0 = slice * block_cols;
  const int64_t kstep = block_cols * a.ksplit;  // a warp's consecutive blocks
  if (g < a.groups && kb0 < K) {
    load(wa, g, kb0);
    if (kb0 + kstep < K) load(wb, g, kb0 + kstep);
  }
  PdlEnter();  // launched with LaunchKernel: x and y only after the previous kernel completed
  // [rows][in_dim] x, then kPhgWarps * kMaxM * kRows partials (then, fused norm: [rows][32])
  float* sx = smem;
  float* red = smem + static_cast<int64_t>(a.rows) * K;
  if (a.x_vec) {
    // kStageVec float4 loads per thread in flight at once (the router's row: one round trip).
    constexpr int kStageVec = 8;
    const int64_t n4 = K / 4;
    float4* sx4 = reinterpret_cast<float4*>(sx);
    for (int m = 0; m < a.rows; ++m) {
      const float4* xm4 =
          reinterpret_cast<const float4*>(a.x + m * a.x_row_stride + h * a.x_head_stride);
      for (int64_t base = threadIdx.x; base < n4; base += int64_t{kPhgThreads} * kStageVec) {
        float4 v[kStageVec];
#pragma unroll
        for (int u = 0; u < kStageVec; ++u) {
          const int64_t i = base + int64_t{u} * kPhgThreads;
          if (i < n4) v[u] = __ldg(xm4 + i);
        }
#pragma unroll
        for (int u = 0; u < kStageVec; ++u) {
          const int64_t i = base + int64_t{u} * kPhgThreads;
          if (i < n4) sx4[m * n4 + i] = v[u];
        }
      }
    }
  } else {
    for (int m = 0; m < a.rows; ++m) {
      const float* xm = a.x + m * a.x_row_stride + h * a.x_head_stride;
#pragma unroll 4
      for (int64_t k = threadIdx.x; k < K; k += kPhgThreads) sx[m * K + k] = __ldg(xm + k);
    }
  }
  __syncthreads();
  if (norm) {
    // RmsNorm of the staged rows (rmsnorm.cuh's fused-norm helpers: RmsNormRegKernel<float, 4,
    // 2>'s order with norm_threads virtual threads), in place. (token, virtual warp) pairs go
    // round the warps; K % 4 == 0 (the launcher), so row m starts at float4 m * K / 4.
    float* part = red + kPhgWarps * kMaxM * kRows;
    const int vwarps = a.norm_threads / 32;
    const int64_t nvec = K / 4;
    const float4* sx4 = reinterpret_cast<const float4*>(sx);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int pr = warp; pr < a.rows * vwarps; pr += kPhgWarps) {  // warp-uniform
      const int m = pr / vwarps, vw = pr - m * vwarps;
      const int64_t j = static_cast<int64_t>(vw) * 32 + lane;
      const bool va = j < nvec, vb = j + a.norm_threads < nvec;
      const float4 x0 = va ? sx4[m * nvec + j] : zero;
      const float4 x1 = vb ? sx4[m * nvec + j + a.norm_threads] : zero;
      const float sum = RmsNormWarpSum(RmsNormVec4ThreadSum(x0, va, x1, vb));
      if (lane == 0) part[m * 32 + vw] = sum;
    }
    __syncthreads();
    const bool write = blockIdx.x == 0 && blockIdx.y == 0;
    for (int m = 0; m < a.rows; ++m) {
      const float sum = RmsNormWarpSum(lane < vwarps ? part[m * 32 + lane] : 0.0f);
      const float scale = rsqrtf(sum / static_cast<float>(K) + a.norm_eps);
#pragma unroll
      for (int i = 0; i < kNormItems; ++i) {
        const int64_t k = threadIdx.x + int64_t{i} * kPhgThreads;
        if (k >= K) break;
        const float v = norm_w[i] * (sx[m * K + k] * scale);
        sx[m * K + k] = v;
        if (write) a.norm_out[m * a.norm_out_ld + k] = v;
      }
    }
    __syncthreads();
  }
  // Block kb's FMAs: per lane in K order (the summation order of the kernel's contract).
  float acc[kMaxM][kRows];
  auto fma_block = [&](const V(&w)[kRows][kPhgUnroll], int64_t kb) {
#pragma unroll
    for (int u = 0; u < kPhgUnroll; ++u) {
      const int64_t k = kb + u * kChunk + lane * kVec;
      if (k >= K) continue;
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
        if (m >= a.rows) break;
        const V xv = *reinterpret_cast<const V*>(sx + m * K + k);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[m][r] = fmaf(w[r][u].v[e], xv.v[e], acc[m][r]);
        }
      }
    }
  };
  bool preloaded = true;
  for (; g < a.groups; g += gridDim.x) {
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;
    }
    if (!preloaded && kb0 < K) {
      load(wa, g, kb0);
      if (kb0 + kstep < K) load(wb, g, kb0 + kstep);
    }
    preloaded = false;
    // Blocks kb (in wa) and kb + kstep (in wb) are in flight; each is refilled with the block
    // two steps on once its FMAs are issued.
    for (int64_t kb = kb0; kb < K; kb += 2 * kstep) {
      fma_block(wa, kb);
      if (kb + 2 * kstep < K) load(wa, g, kb + 2 * kstep);
      if (kb + kstep < K) {
        fma_block(wb, kb + kstep);
        if (kb + 3 * kstep < K) load(wb, g, kb + 3 * kstep);
      }
    }
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], off);
        }
      }
    }
    if (a.ksplit > 1) {
      // Partials of every warp, then a fixed-order sum over the K slices of each team.
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (lane == (m * kRows + r) % 32) red[(warp * kMaxM + m) * kRows + r] = acc[m][r];
        }
      }
      __syncthreads();
      for (int i = threadIdx.x; i < teams * kMaxM * kRows; i += kPhgThreads) {
        const int t = i / (kMaxM * kRows), mr = i % (kMaxM * kRows);
        const int m = mr / kRows, r = mr % kRows;
        const int64_t n = g * rows_per_cta + t * kRows + r;
        if (m >= a.rows || n >= a.out_dim) continue;
        float s = 0.0f;
        for (int sl = 0; sl < a.ksplit; ++sl) s += red[((t * a.ksplit + sl) * kMaxM + m) * kRows + r];
        float* yp = a.y + m * a.y_row_stride + h * a.y_head_stride + n;
        *yp = a.accumulate ? *yp + s : s;
      }
      __syncthreads();  // red is rewritten by the next group
    } else {
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int64_t n = g * rows_per_cta + team * kRows + r;
          if (m < a.rows && n < a.out_dim && lane == (m * kRows + r) % 32) {
            float* yp = a.y + m * a.y_row_stride + h * a.y_head_stride + n;
            *yp = a.accumulate ? *yp + acc[m][r] : acc[m][r];
          }
        }
      }
    }
  }
}

}  // namespace glm::kernels::detail
