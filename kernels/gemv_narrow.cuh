// Device code of gemv_narrow (gemv_narrow.h has the contract).
//
// Algorithm: y[m, n] (+)= Σ_k xe[m, k] · w[n, k] for M <= 16 tokens, one launch. xe is x (fp32)
// as today's two-step path multiplies it: bf16 weights: x rounded to bf16; fp8 weights: x
// rounded to bf16, then per token per 128-column group scale = amax / 448 and q = e4m3(x / scale)
// (the rule of quant_fp8_group.cuh, bit for bit), with y = Σ_g s_x[m, g] · s_w[n/128, g] ·
// Σ_{k in g} q[m, k] · w[n, k].
//
// Tiling: a CTA is 8 warps over 128 consecutive weight rows (= one 128-row block of fp8
// scales), warp w owning rows 16w..16w+15, and one range of K (grid.y splits K when the rows
// alone give too few CTAs). The CTA first issues its warps' first kGemvDepth weight loads, then
// stages its K range of x in shared memory as 2-byte values (fp8: the quantized e4m3 values as
// f16, exact, plus the per-group scales; bf16: bf16) and synchronizes once; no shared memory is
// touched by the weight stream. Tensor cores through mma.sync m16n8k16 (A = 16 weight rows,
// B = 8 tokens; M > 8 uses two 8-token tiles) with fp32 accumulators; fp8 weights are widened
// with cvt.rn.f16x2.e4m3x2 (exact).
// Weight loads: a "step" is 16 rows x 128 bytes (fp8: one 128-column group; bf16: 64 columns);
// thread (g = lane/4, t = lane%4) loads two 16-byte chunks (bytes t·16 and 64 + t·16 of the
// step's 128) of rows g and g+8, so a quad reads whole 64-byte segments; the MMA's k order is a
// permutation of the physical one, and the B fragment is read from shared memory at the same
// physical positions, so the dot products are unchanged. kGemvDepth steps (2 KiB each) per warp
// are in flight in a register ring. Loads are streaming (ld.global.nc.L1::no_allocate): weights are
// read once per call.
// Split K: each CTA writes fp32 partials [split, m, n] to the workspace, fences, and takes a
// ticket from the row block's counter; the last CTA of a row block sums the partials in split
// order (deterministic: no float atomics, the order does not depend on which CTA finishes
// last), writes y and resets the counter to 0 for the next launch.
// Cluster split K (GemvSplitReduce::kCluster, sm_90+): the row block's splits are one cluster
// (dims 1 x splits); each CTA writes its partials [m][128] fp32 to its own shared memory, one
// cluster barrier publishes them, and CTA r of the cluster sums elements r·256 + tid (stride
// splits·256) over the cluster's CTAs in split order (all peer loads issued before the adds),
// writes y, and a second barrier keeps every CTA's shared memory alive until its peers have read
// it. The sums are the kGlobal path's, in the same order: the same bits.
// Shared memory rows are padded so the B-fragment reads are conflict-free: fp8 reads 16-byte
// units {0,2,4,6} of a 128-byte line per token row (stride ≡ 16 mod 128), bf16 units {0..3}
// (stride ≡ 64 mod 128).
// Limits: M <= 16; fp8: K % 16 == 0; 16-byte aligned weight rows. Rows past N and columns past K
// contribute nothing (loads skipped, bf16 tails masked: a row's padding is never multiplied).
// NOTE: shared memory per CTA is M x (K range) x 2 bytes (+ scales); the host caps the K range so
// that two CTAs fit an SM's shared memory (GB10: ~49 KiB, H200: ~113 KiB per CTA).
// Cost: every CTA stages (and for fp8 quantizes) its K range of x before its weight stream gets
// past the first kGemvDepth steps, so the time grows with M (gemv_bench, H200, lm_head fp8:
// 267 µs at M = 1, 569 µs at M = 8 with one item per warp at a time). Latency knobs
// (GemvNarrowTuning, none changes a value): kStage items per warp have their x loads issued
// together (float4 loads where x rows are 16-byte aligned) before any is converted, so a warp
// waits for ceil(items / kStage) L2 round trips instead of one per item; the weight steps past
// the register ring are prefetched into L2 (prefetch.global.L2, a window of prefetch_steps per
// warp, opened before the grid-dependency wait and advanced one step per consumed step), which
// keeps HBM busy while x is staged; the global reduction's last CTA loads 16 partials at a time.
// NarrowLinear takes this path only where it measured faster than the GEMM path (cuda_linear.cu
// GemvPreferred).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#include <cooperative_groups.h>
#define GLM_GEMV_CLUSTERS 1
#endif

#include "kernels/load_util.cuh"
#include "kernels/rmsnorm.cuh"

namespace glm::kernels::detail {

inline constexpr int kGemvWarps = 8;
inline constexpr int kGemvThreads = 32 * kGemvWarps;
inline constexpr int kGemvRows = 16 * kGemvWarps;  // rows per CTA: one fp8 scale block row
inline constexpr int kGemvMaxCluster = 16;  // the most splits reduced through a cluster
// Steps in flight per warp: 4 (8 KiB) with one 8-token tile; 3 with two (registers: no spills).
template <int kNT>
inline constexpr int kGemvDepth = kNT == 1 ? 4 : 3;

struct GemvParams {
  const float* x;        // [m, k] fp32, row stride ldx
  int64_t ldx;
  const uint8_t* w;      // [n, k] bf16 or e4m3, row stride ldw_bytes
  int64_t ldw_bytes;
  const float* ws;       // fp8: [ceil(n/128), ws_ld] block scales
  int64_t ws_ld;
  float* y;              // [m, n] fp32, row stride ldy
  int64_t ldy;
  float* partial;        // [splits, m, n] fp32 when splits > 1
  int* counters;         // [row blocks] zero on entry when splits > 1; left zero
  int64_t n, k;
  int m;
  int groups_per_split;  // 128-column groups per K range
  int x_stride;          // bytes per token row of the staged x
  int accumulate;
  int cluster;           // > 1: cluster split-K reduction (grid.y == cluster), else 1
  int red_offset;        // cluster: byte offset of the [m][128] fp32 partials in shared memory
  int x_vec;             // 1: x and ldx allow 16-byte loads of 4 columns (x 16-byte aligned,
                         // ldx % 4 == 0)
  int prefetch_steps;    // steps per warp kept prefetched into L2 ahead of the register ring
  int batched_reduce;    // 1: the global reduction's last CTA loads 16 partials at a time
  // Fused RmsNorm (GemvNarrowArgs::norm_w; null: none): every token row of x is first replaced by
  // norm_w * x * scale, scale = rsqrt(mean(x^2) + norm_eps) summed in the order of rmsnorm.cuh's
  // RmsNormRegKernel<float, 4, 2> run with norm_threads threads (RmsNormF32VecThreads); the CTAs
  // of row block 0 also write the normalized rows of their K range to norm_out.
  const float* norm_w;  // [k]
  float norm_eps;
  int norm_threads;  // a multiple of 32, at most 1024
  float* norm_out;   // [m, k], row stride norm_out_ld
  int64_t norm_out_ld;
};

// The fused RmsNorm's scales (GemvParams::norm_w): lane mm of every warp returns token mm's
// rsqrt(mean(x^2) + eps), bit for bit the scale of RmsNormRegKernel<float, 4, 2> with
// p.norm_threads threads. Its virtual thread j = 32 vw + lane (virtual warp vw) sums float4 j and
// j + norm_threads of the row; each virtual warp reduces by BlockSum's first butterfly, and the
// virtual warps' sums by its second. (token, virtual warp) pairs go round the CTA's warps, four
// pairs' loads in flight per warp. `part` ([m][32] fp32 of shared memory) is free on return.
// Every thread of the CTA calls it (two barriers).
__device__ __forceinline__ float GemvNormScales(const GemvParams& p, float* part, int warp,
                                                int lane) {
  const int vwarps = p.norm_threads / 32;
  const int64_t nvec = p.k / 4;
  const int pairs = p.m * vwarps;
  constexpr int kPairs = 4;
  for (int base = warp; base < pairs; base += kGemvWarps * kPairs) {  // warp-uniform
    float4 a[kPairs], b[kPairs];
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      const int pr = base + u * kGemvWarps;
      a[u] = b[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (pr < pairs) {
        const int mm = pr / vwarps, vw = pr - mm * vwarps;
        const int64_t j = static_cast<int64_t>(vw) * 32 + lane;
        const float4* row = reinterpret_cast<const float4*>(p.x + mm * p.ldx);
        if (j < nvec) a[u] = row[j];
        if (j + p.norm_threads < nvec) b[u] = row[j + p.norm_threads];
      }
    }
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      const int pr = base + u * kGemvWarps;
      if (pr >= pairs) break;
      const int mm = pr / vwarps, vw = pr - mm * vwarps;
      const int64_t j = static_cast<int64_t>(vw) * 32 + lane;
      const float s =
          RmsNormWarpSum(RmsNormVec4ThreadSum(a[u], j < nvec, b[u], j + p.norm_threads < nvec));
      if (lane == 0) part[mm * 32 + vw] = s;
    }
  }
  __syncthreads();
  float scale = 0.0f;
  for (int mm = 0; mm < p.m; ++mm) {
    const float v = RmsNormWarpSum(lane < vwarps ? part[mm * 32 + lane] : 0.0f);
    if (lane == mm) scale = rsqrtf(v / static_cast<float>(p.k) + p.norm_eps);
  }
  __syncthreads();
  return scale;
}

// Prefetches one weight row's step into L2: the `bytes` (1..128) at `p` (16-byte aligned), one
// 128-byte line or the two it straddles; never an address outside those bytes.
__device__ __forceinline__ void GemvPrefetchL2(const uint8_t* p, int64_t bytes) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
  const int into = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 127u);
  if (into != 0 && min(bytes, int64_t{128}) > 128 - into) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + (128 - into)));
  }
}

// The activation quantization rule of quant_fp8_group.cuh (QuantScale / QuantE4m3), repeated
// here because that header defines a kernel: plain IEEE division and the satfinite e4m3
// conversion. gemv_narrow_test checks the result bit for bit against QuantizeFp8GroupHost.
__device__ __forceinline__ float GemvQuantScale(float amax) { return amax / 448.0f; }
__device__ __forceinline__ uint8_t GemvQuantE4m3(float v, float scale) {
  if (!(scale > 0.0f)) return 0;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ uint32_t GemvE4m3x2ToHalf2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

template <bool kFp8>
__device__ __forceinline__ void GemvMma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (kFp8) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Zeroes the bf16 elements at columns >= k of an 8-element chunk starting at column col.
__device__ __forceinline__ uint4 GemvMaskBf16(uint4 v, int64_t col, int64_t k) {
  const int64_t valid = k - col;  // 1..7 when called
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (2 * i >= valid) {
      w[i] = 0;
    } else if (2 * i + 1 >= valid) {
      w[i] &= 0xffffu;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// grid (ceil(n / 128), splits), block kGemvThreads, dynamic shared memory: the staged x
// [m][x_stride bytes] then (fp8) the x scales [m][groups_per_split] fp32.
// kStage: (token, group) staging items per warp whose x loads are issued together before any of
// them is converted (1: the previous kernel's one at a time); the order of the items does not
// change any value.
template <int kNT, bool kFp8, int kStage>
__global__ void __launch_bounds__(kGemvThreads, 2) GemvNarrowKernel(const GemvParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int s_last;
  constexpr int kStepK = kFp8 ? 128 : 64;  // columns per step
  constexpr int kChunkK = kStepK / 2;      // columns per quad per 16-byte chunk row
  constexpr int kEB = kFp8 ? 1 : 2;        // weight bytes per element
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGemvRows;
  const int64_t r0 = n0 + warp * 16;
  const int num_groups = static_cast<int>((p.k + 127) / 128);
  const int gb = blockIdx.y * p.groups_per_split;
  const int ge = min(num_groups, gb + p.groups_per_split);
  const int64_t k0 = static_cast<int64_t>(gb) * 128;
  const int64_t k1 = min(static_cast<int64_t>(ge) * 128, p.k);
  const int nsteps = static_cast<int>((k1 - k0 + kStepK - 1) / kStepK);
  const bool warp_active = r0 < p.n;

  // Rows g and g+8 of the warp's 16 (loads skipped past N).
  const int64_t ra = r0 + g, rb = r0 + g + 8;
  const bool va = ra < p.n, vb = rb < p.n;
  const uint8_t* wrow[2] = {p.w + (va ? ra : 0) * p.ldw_bytes, p.w + (vb ? rb : 0) * p.ldw_bytes};
  const bool vrow[2] = {va, vb};

  // ring[d][h * 2 + c]: step d's chunk c of row g + 8h.
  uint4 ring[kGemvDepth<kNT>][4];
  auto load_step = [&](uint4(&dst)[4], int s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t col = k0 + static_cast<int64_t>(s) * kStepK + c * kChunkK + t * (16 / kEB);
        dst[h * 2 + c] = (vrow[h] && col < p.k) ? LoadStreaming16(wrow[h] + col * kEB)
                                                : make_uint4(0, 0, 0, 0);
      }
    }
  };
  if (warp_active) {
#pragma unroll
    for (int d = 0; d < kGemvDepth<kNT>; ++d) {
      if (d < nsteps) load_step(ring[d], d);
    }
  }
  // L2 prefetch window: steps [depth, depth + prefetch_steps) of the warp's 16 rows now (lane l
  // < 16: row r0 + l), then one step per consumed step in the loop below. Weights are immutable,
  // so this may run before the grid-dependency wait. Prefetches change no value.
  const int pf = p.prefetch_steps;
  const bool pf_lane = warp_active && pf > 0 && lane < 16 && r0 + lane < p.n;
  const uint8_t* pf_row = p.w + (pf_lane ? r0 + lane : 0) * p.ldw_bytes + k0 * kEB;
  const int64_t pf_bytes = (k1 - k0) * kEB;  // the row's bytes in this K range
  if (pf_lane) {
    const int s_end = min(nsteps, kGemvDepth<kNT> + pf);
    for (int s = kGemvDepth<kNT>; s < s_end; ++s) {
      GemvPrefetchL2(pf_row + s * 128, pf_bytes - s * 128);
    }
  }
  // Fused RmsNorm (compiled into the one-item staging variant only, which Run launches for fused
  // calls: in the 4- and 8-item ones its registers would spill): norm_w of the warp's first
  // staging item, loaded now (immutable, so before the grid-dependency wait) instead of after the
  // scales, one L2 round trip fewer on the critical path (a second item's would spill).
  const bool norm = kStage == 1 && p.norm_w != nullptr;
  const int ng = ge - gb;
  const int items = p.m * ng;
  float4 norm_pre = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (norm && warp < items) {
    const int64_t c = k0 + (warp % ng) * 128 + lane * 4;
    if (c < p.k) norm_pre = __ldg(reinterpret_cast<const float4*>(p.norm_w + c));
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Programmatic dependent launch (a no-op unless launched with it): the next kernel may start
  // its own weight prefetch now; this one waits for the previous kernel (its x, y, workspace
  // and counters) only after issuing the weight loads above.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif

  // Fused RmsNorm: lane mm holds token mm's scale; the staged-x region is its scratch first.
  const float norm_scale =
      norm ? GemvNormScales(p, reinterpret_cast<float*>(smem), warp, lane) : 0.0f;
  const bool norm_write = norm && blockIdx.x == 0;

  // Stage x[0:m, k0:k1) (one warp per (token, 128-column group); lane: 4 columns).
  unsigned char* xs = smem;
  float* sxs = reinterpret_cast<float*>(smem + static_cast<size_t>(p.m) * p.x_stride);
  for (int base = warp; base < items; base += kGemvWarps * kStage) {
    // Loads of up to kStage items first (warp-uniform bounds), then their conversion.
    float v[kStage][4];
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int item = base + u * kGemvWarps;
#pragma unroll
      for (int i = 0; i < 4; ++i) v[u][i] = 0.0f;
      if (item < items) {
        const int mm = item / ng, gl = item - mm * ng;
        const int64_t c = k0 + gl * 128 + lane * 4;
        const float* src = p.x + mm * p.ldx + c;
        if (p.x_vec && c + 4 <= p.k) {
          const float4 f = *reinterpret_cast<const float4*>(src);
          v[u][0] = f.x;
          v[u][1] = f.y;
          v[u][2] = f.z;
          v[u][3] = f.w;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (c + i < p.k) v[u][i] = src[i];
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int item = base + u * kGemvWarps;
      if (item >= items) break;
      const int mm = item / ng, gl = item - mm * ng;
      const int64_t c = k0 + gl * 128 + lane * 4;
      if (norm) {  // RmsNormRegKernel's w * (x * scale); x 16-byte aligned, k % 4 == 0 (Run)
        const float sc = __shfl_sync(0xffffffffu, norm_scale, mm);
        if (c < p.k) {
          const float4 nw = base == warp  // the first pass (kStage == 1 here)
                                ? norm_pre
                                : __ldg(reinterpret_cast<const float4*>(p.norm_w + c));
          v[u][0] = nw.x * (v[u][0] * sc);
          v[u][1] = nw.y * (v[u][1] * sc);
          v[u][2] = nw.z * (v[u][2] * sc);
          v[u][3] = nw.w * (v[u][3] * sc);
          if (norm_write) {
            *reinterpret_cast<float4*>(p.norm_out + mm * p.norm_out_ld + c) =
                make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[u][i] = c + i < p.k ? __bfloat162float(__float2bfloat16_rn(v[u][i])) : 0.0f;
      }
      uint32_t packed[2];
      if constexpr (kFp8) {
        float amax = fmaxf(fmaxf(fabsf(v[u][0]), fabsf(v[u][1])),
                           fmaxf(fabsf(v[u][2]), fabsf(v[u][3])));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        }
        const float scale = GemvQuantScale(amax);
        if (lane == 0) sxs[mm * p.groups_per_split + gl] = scale;
        const uint32_t q01 = static_cast<uint32_t>(GemvQuantE4m3(v[u][0], scale)) |
                             static_cast<uint32_t>(GemvQuantE4m3(v[u][1], scale)) << 8;
        const uint32_t q23 = static_cast<uint32_t>(GemvQuantE4m3(v[u][2], scale)) |
                             static_cast<uint32_t>(GemvQuantE4m3(v[u][3], scale)) << 8;
        packed[0] = GemvE4m3x2ToHalf2(q01);
        packed[1] = GemvE4m3x2ToHalf2(q23);
      } else {
        const __nv_bfloat162 b01 = __floats2bfloat162_rn(v[u][0], v[u][1]);
        const __nv_bfloat162 b23 = __floats2bfloat162_rn(v[u][2], v[u][3]);
        memcpy(&packed[0], &b01, 4);
        memcpy(&packed[1], &b23, 4);
      }
      *reinterpret_cast<uint2*>(xs + static_cast<size_t>(mm) * p.x_stride +
                                (gl * 128 + lane * 4) * 2) = make_uint2(packed[0], packed[1]);
    }
  }
  __syncthreads();

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

  if (warp_active) {
    const float* ws_row = kFp8 ? p.ws + static_cast<int64_t>(blockIdx.x) * p.ws_ld + gb : nullptr;
    // The B fragments of token row nt*8 + g (zero past M).
    const unsigned char* xrow[kNT];
    bool xok[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int tok = nt * 8 + g;
      xok[nt] = tok < p.m;
      xrow[nt] = xs + static_cast<size_t>(xok[nt] ? tok : 0) * p.x_stride;
    }
    for (int s0 = 0; s0 < nsteps; s0 += kGemvDepth<kNT>) {
#pragma unroll
      for (int d = 0; d < kGemvDepth<kNT>; ++d) {
        const int s = s0 + d;
        if (s >= nsteps) break;
        if constexpr (kFp8) {
          float blk[kNT][4];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) blk[nt][e] = 0.0f;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            uint4 xv[kNT][2];
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              const unsigned char* xp = xrow[nt] + (s * 128 + c * 64 + t * 16) * 2;
              xv[nt][0] = xok[nt] ? *reinterpret_cast<const uint4*>(xp) : make_uint4(0, 0, 0, 0);
              xv[nt][1] =
                  xok[nt] ? *reinterpret_cast<const uint4*>(xp + 16) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint32_t wa = Word4(ring[d][c], j), wb = Word4(ring[d][2 + c], j);
              const uint32_t a0 = GemvE4m3x2ToHalf2(wa), a2 = GemvE4m3x2ToHalf2(wa >> 16);
              const uint32_t a1 = GemvE4m3x2ToHalf2(wb), a3 = GemvE4m3x2ToHalf2(wb >> 16);
#pragma unroll
              for (int nt = 0; nt < kNT; ++nt) {
                GemvMma<true>(blk[nt], a0, a1, a2, a3, Word4(xv[nt][j / 2], (2 * j) % 4),
                              Word4(xv[nt][j / 2], (2 * j + 1) % 4));
              }
            }
          }
          const float sw = __ldg(ws_row + s);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const int tok = nt * 8 + 2 * t;
            const float f0 = tok < p.m ? sxs[tok * p.groups_per_split + s] * sw : 0.0f;
            const float f1 = tok + 1 < p.m ? sxs[(tok + 1) * p.groups_per_split + s] * sw : 0.0f;
            acc[nt][0] += blk[nt][0] * f0;
            acc[nt][1] += blk[nt][1] * f1;
            acc[nt][2] += blk[nt][2] * f0;
            acc[nt][3] += blk[nt][3] * f1;
          }
        } else {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            uint4 wa = ring[d][c], wb = ring[d][2 + c];
            const int64_t col = k0 + static_cast<int64_t>(s) * kStepK + c * kChunkK + t * 8;
            if (col + 8 > p.k && col < p.k) {
              wa = GemvMaskBf16(wa, col, p.k);
              wb = GemvMaskBf16(wb, col, p.k);
            }
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              const uint4 xv =
                  xok[nt] ? *reinterpret_cast<const uint4*>(xrow[nt] + (s * 64 + c * 32 + t * 8) * 2)
                          : make_uint4(0, 0, 0, 0);
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                GemvMma<false>(acc[nt], Word4(wa, 2 * j), Word4(wb, 2 * j),
                               Word4(wa, 2 * j + 1), Word4(wb, 2 * j + 1),
                               Word4(xv, 2 * j), Word4(xv, 2 * j + 1));
              }
            }
          }
        }
        if (s + kGemvDepth<kNT> < nsteps) load_step(ring[d], s + kGemvDepth<kNT>);
        if (pf_lane && s + kGemvDepth<kNT> + pf < nsteps) {
          const int sp = s + kGemvDepth<kNT> + pf;
          GemvPrefetchL2(pf_row + sp * 128, pf_bytes - sp * 128);
        }
      }
    }
  }

  // acc[nt][e]: row r0 + g + 8 * (e / 2), token nt * 8 + 2t + e % 2.
  const bool split = gridDim.y > 1;
  const bool use_cluster = p.cluster > 1;
  float* red = reinterpret_cast<float*>(smem + p.red_offset);  // cluster: [m][kGemvRows]
  if (warp_active) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = r0 + g + 8 * (e / 2);
        const int tok = nt * 8 + 2 * t + (e % 2);
        if (row >= p.n || tok >= p.m) continue;
        if (use_cluster) {
          red[tok * kGemvRows + (row - n0)] = acc[nt][e];
        } else if (split) {
          p.partial[(static_cast<int64_t>(blockIdx.y) * p.m + tok) * p.n + row] = acc[nt][e];
        } else {
          float* yp = p.y + tok * p.ldy + row;
          *yp = p.accumulate ? *yp + acc[nt][e] : acc[nt][e];
        }
      }
    }
  }
#if defined(GLM_GEMV_CLUSTERS) && defined(__CUDA_ARCH__)
  if (use_cluster) {
    // Every thread of every CTA of the cluster reaches both barriers (no early return above).
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    cl.sync();
    const int cs = p.cluster;  // == gridDim.y; cluster rank == blockIdx.y == split index
    const int rank = static_cast<int>(cl.block_rank());
    const int rows = static_cast<int>(min(static_cast<int64_t>(kGemvRows), p.n - n0));
    for (int i = rank * kGemvThreads + tid; i < p.m * kGemvRows; i += cs * kGemvThreads) {
      const int tok = i / kGemvRows, r = i - tok * kGemvRows;
      if (r >= rows) continue;
      float v[kGemvMaxCluster];
#pragma unroll
      for (int z = 0; z < kGemvMaxCluster; ++z) {
        if (z < cs) v[z] = *cl.map_shared_rank(red + i, static_cast<unsigned>(z));
      }
      float sum = 0.0f;
#pragma unroll
      for (int z = 0; z < kGemvMaxCluster; ++z) {
        if (z < cs) sum += v[z];
      }
      float* yp = p.y + tok * p.ldy + n0 + r;
      *yp = p.accumulate ? *yp + sum : sum;
    }
    cl.sync();
    return;
  }
#endif
  if (!split) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(p.counters + blockIdx.x, 1) == static_cast<int>(gridDim.y) - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int rows = static_cast<int>(min(static_cast<int64_t>(kGemvRows), p.n - n0));
  for (int i = tid; i < p.m * kGemvRows; i += kGemvThreads) {
    const int tok = i / kGemvRows, r = i - tok * kGemvRows;
    if (r >= rows) continue;
    const int64_t row = n0 + r;
    const float* part = p.partial + static_cast<int64_t>(tok) * p.n + row;
    const int64_t zstride = static_cast<int64_t>(p.m) * p.n;
    const int nz = static_cast<int>(gridDim.y);
    float sum = 0.0f;
    if (p.batched_reduce) {
      // All loads of a batch of 16 splits in flight before the adds; the same order of adds.
      for (int z0 = 0; z0 < nz; z0 += 16) {
        float v[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (z0 + j < nz) v[j] = __ldcg(part + (z0 + j) * zstride);
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (z0 + j < nz) sum += v[j];
        }
      }
    } else {
      for (int z = 0; z < nz; ++z) sum += __ldcg(part + z * zstride);
    }
    float* yp = p.y + tok * p.ldy + row;
    *yp = p.accumulate ? *yp + sum : sum;
  }
  if (tid == 0) p.counters[blockIdx.x] = 0;
}

}  // namespace glm::kernels::detail
