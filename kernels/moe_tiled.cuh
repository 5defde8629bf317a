// Tiled grouped GEMM of the routed experts (kernels/moe_tiled.h): the default past
// kMoeGroupedMaxPairs pairs (prefill chunks), the path of shapes without 16-byte weight rows, and
// the reference every other path is tested against (MoePolicy::Path::kTiled).
// 1. MoeRouteKernel (one CTA): tokens per expert (shared-memory counts), exclusive scans into
//    row offsets and kBM-row tile offsets per expert, then each (token, slot) pair gets a row in
//    expert order (row_pair / pair_row). The order of rows inside an expert depends on atomics,
//    but no result does: every row is computed independently and the combine reads by pair.
// 2. MoeGemmKernel<fused = true>: act[row] = silu(x[token(row)] . gate[e]^T) * (x . up[e]^T).
// 3. MoeGemmKernel<fused = false>: y[row] = act[row] . down[e]^T.
//    Grid.x covers the worst-case tile count (ceil(pairs / kBM) + min(experts, pairs)), each CTA
//    finds its expert by binary search over the device tile offsets and exits when past the last
//    tile; experts without tokens have no tiles. Tile kBM x kBN x kBK = 64 x 128 x 32, 256
//    threads, 4-stage cp.async ring (2 stages where shared memory is short), 16-byte copies with
//    zero-fill at the edges. Warp w computes rows 8w..8w+7 (only the rows its expert has: a tile
//    with one row costs one warp-row of FMAs), lane l columns l, l+32, l+64, l+96; shared rows
//    are padded to kBK + 4 floats so the float4 reads of 8 lanes hit 32 distinct banks.
//    fp32 tiles come in by cp.async; bf16 / fp8 tiles are loaded 4 elements at a time (8 / 4
//    bytes), widened to fp32 (fp8: times the block's scale, the same product as the CPU's
//    dequantization) and stored into the same fp32 shared-memory stage, so the FMA loop and
//    every limit are the same for all weight types.
// 4. MoeCombineKernel: out[t] += sum_j w[t, j] * y[pair_row[t, j]], j in fixed order (no float
//    atomics: deterministic).
// Limits: hidden and moe_inter multiples of 4, x / fp32 weights 16-byte aligned (bf16 8, fp8 4)
// with row strides multiple of 4; num_experts <= kMoeMaxExperts (one-CTA scan).
// NOTE: a stage of the fused kernel is (64 + 2 * 128) x 36 floats = 46 KiB: 4 stages (184 KiB)
// fit an H100 / H200's 227 KiB opt-in shared memory, GB10's 99 KiB takes 2 (read from the device).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/launch.cuh"
#include "kernels/moe_common.cuh"
#include "kernels/moe_tiled.h"

namespace glm::kernels::moe {

// grid 1, block kRouteThreads. expert_off/tile_off: [E + 1]; row_pair/pair_row: [pairs].
__global__ void __launch_bounds__(kRouteThreads)
    MoeRouteKernel(const int32_t* ids, int pairs, int num_experts, int32_t* expert_off,
                   int32_t* tile_off, int32_t* row_pair, int32_t* pair_row) {
  PdlEnter();
  __shared__ int cnt[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  for (int e = tid; e < num_experts; e += kRouteThreads) cnt[e] = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = ids[i];
    if (e >= 0 && e < num_experts) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  const int c = tid < num_experts ? cnt[tid] : 0;
  int total_rows, total_tiles;
  const int row0 = BlockExclusiveScan(c, warp_sums, &total_rows);
  const int tile0 = BlockExclusiveScan((c + kBM - 1) / kBM, warp_sums, &total_tiles);
  if (tid < num_experts) {
    expert_off[tid] = row0;
    tile_off[tid] = tile0;
    cursor[tid] = row0;
  }
  if (tid == 0) {
    expert_off[num_experts] = total_rows;
    tile_off[num_experts] = total_tiles;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = ids[i];
    int row = -1;
    if (e >= 0 && e < num_experts) {
      row = atomicAdd(&cursor[e], 1);
      row_pair[row] = i;
    }
    pair_row[i] = row;
  }
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_size));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float Dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Weight elements k..k+3 of one row at byte address p, widened to fp32; fp8 times the row's
// block scale srow[k / 128] (k % 4 == 0, so the 4 share a block).
template <int kWT>
__device__ __forceinline__ float4 LoadW4(const char* p, const float* srow, int k) {
  if constexpr (kWT == kWBF16) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    __nv_bfloat162 lo, hi;
    memcpy(&lo, &v.x, 4);
    memcpy(&hi, &v.y, 4);
    const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
    return make_float4(a.x, a.y, b.x, b.y);
  } else {
    __nv_fp8x4_e4m3 q;
    q.__x = *reinterpret_cast<const __nv_fp8x4_storage_t*>(p);
    const float4 f = static_cast<float4>(q);
    const float sc = srow[k >> 7];
    return make_float4(f.x * sc, f.y * sc, f.z * sc, f.w * sc);
  }
}

// grid (max tiles, ceil(n / kBN)); block kThreads; dynamic smem GemmSmemFloats<...>() * 4.
// kStages-deep cp.async ring: kStages - 1 k-tiles in flight while one is computed.
template <bool kFused, int kStages, int kWT>
__global__ void __launch_bounds__(kThreads) MoeGemmKernel(GemmParams p) {
  PdlEnter();
  extern __shared__ __align__(16) float smem[];
  const int m_tile = blockIdx.x;
  if (m_tile >= p.tile_off[p.num_experts]) return;
  int lo = 0, hi = p.num_experts - 1;  // last e with tile_off[e] <= m_tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.tile_off[mid] <= m_tile) lo = mid; else hi = mid - 1;
  }
  const int e = lo;
  const int row0 = p.expert_off[e] + (m_tile - p.tile_off[e]) * kBM;
  const int rows = min(kBM, p.expert_off[e + 1] - row0);
  const int n0 = blockIdx.y * kBN;
  const MoeExpert ex = p.experts[e];
  constexpr int kEB = ElemBytes(kWT);
  const char* b0 = static_cast<const char*>(kFused ? ex.gate : ex.down);
  const int64_t b0_ld = kFused ? ex.gate_ld : ex.down_ld;
  const float* b0_s = kFused ? ex.gate_s : ex.down_s;
  const int64_t b0_sld = kFused ? ex.gate_sld : ex.down_sld;

  constexpr int kStageFloats = (kBM + (kFused ? 2 : 1) * kBN) * kRowF;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // This thread's copy sources: 2 A chunks, 4 B chunks (per B matrix), fixed rows over k.
  constexpr int kChunksPerRow = kBK / 4;
  const float* a_src[2];
  bool a_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = (tid + i * kThreads) / kChunksPerRow;
    a_ok[i] = r < rows;
    const int row = row0 + (a_ok[i] ? r : 0);
    const int64_t a_row = kFused ? p.row_pair[row] / p.top_k : row;
    a_src[i] = p.a + a_row * p.a_ld;
  }
  const char* b_src[4];
  const char* u_src[4];
  const float* b_srow[4];  // fp8: this row's block scales
  const float* u_srow[4];
  bool b_ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = (tid + i * kThreads) / kChunksPerRow;
    b_ok[i] = n0 + r < p.n;
    const int64_t n = b_ok[i] ? n0 + r : 0;
    b_src[i] = b0 + n * b0_ld * kEB;
    u_src[i] = kFused ? static_cast<const char*>(ex.up) + n * ex.up_ld * kEB : nullptr;
    b_srow[i] = kWT == kWFP8 ? b0_s + (n >> 7) * b0_sld : nullptr;
    u_srow[i] = kWT == kWFP8 && kFused ? ex.up_s + (n >> 7) * ex.up_sld : nullptr;
  }
  const int kc = (tid % kChunksPerRow) * 4;

  auto load_stage = [&](int stage, int k0) {
    float* s = smem + stage * kStageFloats;
    const int k = k0 + kc;
    const bool k_ok = k < p.k;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = (tid + i * kThreads) / kChunksPerRow;
      const bool ok = a_ok[i] && k_ok;
      CpAsync16(s + r * kRowF + kc, ok ? a_src[i] + k : p.a, ok);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (tid + i * kThreads) / kChunksPerRow;
      const bool ok = b_ok[i] && k_ok;
      if constexpr (kWT == kWF32) {
        CpAsync16(s + (kBM + r) * kRowF + kc, ok ? b_src[i] + k * kEB : b0, ok);
        if constexpr (kFused) {
          CpAsync16(s + (kBM + kBN + r) * kRowF + kc, ok ? u_src[i] + k * kEB : ex.up, ok);
        }
      } else {  // widen in registers; the stage's slot is free (see the loop's __syncthreads)
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(s + (kBM + r) * kRowF + kc) =
            ok ? LoadW4<kWT>(b_src[i] + k * kEB, b_srow[i], k) : zero;
        if constexpr (kFused) {
          *reinterpret_cast<float4*>(s + (kBM + kBN + r) * kRowF + kc) =
              ok ? LoadW4<kWT>(u_src[i] + k * kEB, u_srow[i], k) : zero;
        }
      }
    }
  };

  const int my_rows = max(0, min(kRowsPerWarp, rows - warp * kRowsPerWarp));  // warp-uniform
  float acc[kRowsPerWarp][4];
  float acc_u[kRowsPerWarp][4];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[r][i] = acc_u[r][i] = 0.f;

  const int num_k_tiles = (p.k + kBK - 1) / kBK;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_k_tiles) load_stage(st, st * kBK);
    CpAsyncCommit();  // empty groups keep the group count uniform
  }
  for (int kt = 0; kt < num_k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();  // k-tile kt has landed (this thread's copies)
    __syncthreads();             // ... everyone's; and slot (kt - 1) % kStages is free
    const int next = kt + kStages - 1;
    if (next < num_k_tiles) load_stage(next % kStages, next * kBK);
    CpAsyncCommit();
    if (my_rows > 0) {
      const float* s = smem + (kt % kStages) * kStageFloats;
      const float* a_s = s + warp * kRowsPerWarp * kRowF;
      const float* b_s = s + (kBM + lane) * kRowF;
      const float* u_s = s + (kBM + kBN + lane) * kRowF;
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 4) {
        float4 b[4], u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          b[i] = *reinterpret_cast<const float4*>(b_s + i * 32 * kRowF + kk);
          if constexpr (kFused) u[i] = *reinterpret_cast<const float4*>(u_s + i * 32 * kRowF + kk);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          if (r < my_rows) {
            const float4 a = *reinterpret_cast<const float4*>(a_s + r * kRowF + kk);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc[r][i] += Dot4(a, b[i]);
              if constexpr (kFused) acc_u[r][i] += Dot4(a, u[i]);
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (r >= my_rows) break;
    const int64_t row = row0 + warp * kRowsPerWarp + r;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n0 + lane + 32 * i;
      if (n < p.n) {
        float v = acc[r][i];
        if constexpr (kFused) v = v / (1.0f + expf(-v)) * acc_u[r][i];
        p.c[row * p.n + n] = v;
      }
    }
  }
}

// grid (tokens, ceil(hidden / kCombineThreads)).
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* y, const int32_t* pair_row, const float* weights, int top_k,
                     int hidden, float* out, int64_t out_ld) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int col = blockIdx.y * kCombineThreads + threadIdx.x;
  if (col >= hidden) return;
  float* o = out + t * out_ld + col;
  float acc = *o;
  for (int j = 0; j < top_k; ++j) {
    const int row = pair_row[t * top_k + j];
    if (row >= 0) acc += weights[t * top_k + j] * y[int64_t{row} * hidden + col];
  }
  *o = acc;
}

}  // namespace glm::kernels::moe
