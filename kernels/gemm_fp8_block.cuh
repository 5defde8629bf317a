// Device code of our fp8 block-scaled GEMM (gemm_fp8_block.h has the contract).
//
// Algorithm: y[m,n] = Σ_b sx[m,b]·sw[n/128,b]·Σ_{k∈b} xq[m,k]·w[n,k], b = 128-wide K blocks.
// Tensor cores through mma.sync.m16n8k16 with f16 inputs and fp32 accumulators: every e4m3
// value is exactly representable in f16 (cvt.rn.f16x2.e4m3x2 is exact), so the per-block dot
// products are the fp8 products accumulated in fp32. After each K block the block accumulator
// is added into the running one with sx (per row) · sw (per warp: its 32 columns lie inside one
// 128-row weight block) and cleared.
//
// Tiling: a CTA is 4 warps side by side in N (128 columns = one weight block row); a warp owns
// 16·MT rows × 32 columns (MT 16-row MMA tiles × 4 8-column tiles). K is walked in 64-wide
// chunks; fragments are loaded straight from global memory into registers, 16 bytes per thread
// per row: thread (g = lane/4, t = lane%4) loads k ∈ [t·16, t·16+16) of rows g and g+8 (A) and
// of weight row g (B). The four k16 MMA steps of a chunk then use, in step j, bytes 4j..4j+3 of
// each thread's 16: since A and B fragments map logical k to the same physical k (it depends
// only on t, j), the sum over k is unchanged — the mma's k order is permuted, not the math.
// This gives coalesced 64-byte row segments without shared memory or ldmatrix. DEPTH chunks
// are in flight per warp (register ring) to keep HBM busy at decode sizes; K is split across
// CTAs (grid.z) when N·M alone gives too few CTAs, and a second kernel sums the fp32 partials
// in split order (deterministic). The split count fills one wave of resident CTAs (occupancy
// queried for the kernel): a partial second wave would double the time of a memory-bound call.
//
// Limits: K % 16 == 0 (16-byte loads; rows of w contiguous), 16-byte aligned w and xq; any M, N.
// Rows/columns past M/N and k past K load zeros and are not stored.
// NOTE: uses no shared memory at all, so GB10's 99 KiB per-block cap and the H200's 227 KiB do
// not change the tiling; what scales with the device is the split count (SM count). mma.sync
// f16 runs at about 2/3 of Hopper's wgmma peak, so for prefill on sm_90 the cuBLASLt path is
// preferred; this kernel is the path for decode shapes cuBLASLt rejects (M % 4 != 0) and for
// sm_100 / sm_121, where cuBLASLt has no 128-block fp32 scaling.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "kernels/launch.cuh"
#include "kernels/load_util.cuh"

namespace glm::kernels::detail {

inline constexpr int kFp8Warps = 4;
inline constexpr int kFp8Threads = 32 * kFp8Warps;
inline constexpr int kFp8NTiles = 4;                           // 8-column MMA tiles per warp
inline constexpr int kFp8WarpCols = 8 * kFp8NTiles;            // 32
inline constexpr int kFp8CtaCols = kFp8Warps * kFp8WarpCols;   // 128: one weight block row
inline constexpr int kFp8Chunk = 64;                           // k per fragment load

__device__ __forceinline__ uint32_t E4m3x2ToHalf2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

__device__ __forceinline__ void MmaF16F32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int MT>
struct Fp8Frag {
  uint4 a[MT][2];        // rows g and g+8 of each m tile, 16 bytes of xq
  uint4 b[kFp8NTiles];   // weight row g of each n tile, 16 bytes of w
};

struct Fp8GemmArgs {
  const uint8_t* xq;       // [m, k] e4m3, row stride ldq
  int64_t ldq;
  const float* xs;         // [ceil(k/128), xs_ld] (M-major)
  int64_t xs_ld;
  const uint8_t* w;        // [n, k] e4m3
  const float* ws;         // [ceil(n/128), ws_ld]
  int64_t ws_ld;
  void* y;                 // [m, n] (ldy), out type per template
  int64_t ldy;
  float* partial;          // [splits, m, n] fp32 when splits > 1
  int64_t m, n, k;
  int kblocks_per_split;
  int accumulate;
};

template <int MT>
__device__ __forceinline__ void LoadFrag(Fp8Frag<MT>& f, const Fp8GemmArgs& p, int64_t row0,
                                         int64_t col0, int chunk, int g, int t) {
  const int64_t kk = static_cast<int64_t>(chunk) * kFp8Chunk + t * 16;
  const bool k_ok = kk < p.k;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + mt * 16 + h * 8 + g;
      f.a[mt][h] = (k_ok && r < p.m)
                       ? __ldg(reinterpret_cast<const uint4*>(p.xq + r * p.ldq + kk))
                       : make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int nt = 0; nt < kFp8NTiles; ++nt) {
    const int64_t r = col0 + nt * 8 + g;
    f.b[nt] = (k_ok && r < p.n) ? LoadStreaming16(p.w + r * p.k + kk) : make_uint4(0, 0, 0, 0);
  }
}

// rows_left = m - row0: m tiles (or their upper 8 rows) past M hold zeros; their conversions are
// skipped (warp-uniform branches), which matters at decode sizes (M <= 8).
template <int MT>
__device__ __forceinline__ void MmaChunk(const Fp8Frag<MT>& f, float (&blk)[MT][kFp8NTiles][4],
                                         int64_t rows_left) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t b0[kFp8NTiles], b1[kFp8NTiles];
#pragma unroll
    for (int nt = 0; nt < kFp8NTiles; ++nt) {
      const uint32_t wv = Word4(f.b[nt], j);
      b0[nt] = E4m3x2ToHalf2(wv);
      b1[nt] = E4m3x2ToHalf2(wv >> 16);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (mt * 16 >= rows_left) break;
      const uint32_t lo = Word4(f.a[mt][0], j);
      const uint32_t a0 = E4m3x2ToHalf2(lo), a2 = E4m3x2ToHalf2(lo >> 16);
      uint32_t a1 = 0, a3 = 0;
      if (mt * 16 + 8 < rows_left) {
        const uint32_t hi = Word4(f.a[mt][1], j);
        a1 = E4m3x2ToHalf2(hi);
        a3 = E4m3x2ToHalf2(hi >> 16);
      }
#pragma unroll
      for (int nt = 0; nt < kFp8NTiles; ++nt) {
        MmaF16F32(blk[mt][nt], a0, a1, a2, a3, b0[nt], b1[nt]);
      }
    }
  }
}

template <typename OutT>
__device__ __forceinline__ void StoreOut(OutT* y, float v, bool accumulate);
template <>
__device__ __forceinline__ void StoreOut<float>(float* y, float v, bool accumulate) {
  *y = accumulate ? *y + v : v;
}
template <>
__device__ __forceinline__ void StoreOut<__nv_bfloat16>(__nv_bfloat16* y, float v,
                                                        bool accumulate) {
  *y = __float2bfloat16_rn(accumulate ? __bfloat162float(*y) + v : v);
}

// grid: (ceil(n/128), ceil(m/(16·MT)), splits); block: kFp8Threads.
template <int MT, int DEPTH, typename OutT>
__global__ void __launch_bounds__(kFp8Threads) GemmFp8BlockKernel(const Fp8GemmArgs p) {
  PdlEnter();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kFp8CtaCols + warp * kFp8WarpCols;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 16 * MT;
  if (col0 >= p.n) return;  // no block-wide synchronization below
  const int num_kblocks = static_cast<int>((p.k + 127) / 128);
  const int num_chunks = static_cast<int>((p.k + kFp8Chunk - 1) / kFp8Chunk);
  const int kb_begin = blockIdx.z * p.kblocks_per_split;
  const int kb_end = min(num_kblocks, kb_begin + p.kblocks_per_split);
  const int c_begin = kb_begin * 2, c_end = min(kb_end * 2, num_chunks);
  const float* ws_row = p.ws + blockIdx.x * p.ws_ld;  // the warp's columns share one block row

  float acc[MT][kFp8NTiles][4], blk[MT][kFp8NTiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kFp8NTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = blk[mt][nt][i] = 0.0f;

  Fp8Frag<MT> ring[DEPTH];
#pragma unroll
  for (int s = 0; s < DEPTH; ++s) {
    if (c_begin + s < c_end) LoadFrag(ring[s], p, row0, col0, c_begin + s, g, t);
  }
  for (int c0 = c_begin; c0 < c_end; c0 += DEPTH) {
#pragma unroll
    for (int s = 0; s < DEPTH; ++s) {
      const int c = c0 + s;
      if (c < c_end) {
        MmaChunk<MT>(ring[s], blk, p.m - row0);
        if (c + DEPTH < c_end) LoadFrag(ring[s], p, row0, col0, c + DEPTH, g, t);
        if ((c & 1) != 0 || c + 1 == c_end) {  // end of K block c/2: apply both scales
          const int kb = c >> 1;
          const float sw = __ldg(ws_row + kb);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int64_t r0 = row0 + mt * 16 + g, r1 = r0 + 8;
            const float f0 = r0 < p.m ? __ldg(p.xs + kb * p.xs_ld + r0) * sw : 0.0f;
            const float f1 = r1 < p.m ? __ldg(p.xs + kb * p.xs_ld + r1) * sw : 0.0f;
#pragma unroll
            for (int nt = 0; nt < kFp8NTiles; ++nt) {
              acc[mt][nt][0] += blk[mt][nt][0] * f0;
              acc[mt][nt][1] += blk[mt][nt][1] * f0;
              acc[mt][nt][2] += blk[mt][nt][2] * f1;
              acc[mt][nt][3] += blk[mt][nt][3] * f1;
              blk[mt][nt][0] = blk[mt][nt][1] = blk[mt][nt][2] = blk[mt][nt][3] = 0.0f;
            }
          }
        }
      }
    }
  }

  const bool split = gridDim.z > 1;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + mt * 16 + h * 8 + g;
      if (r >= p.m) continue;
#pragma unroll
      for (int nt = 0; nt < kFp8NTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t col = col0 + nt * 8 + 2 * t + e;
          if (col >= p.n) continue;
          const float v = acc[mt][nt][2 * h + e];
          if (split) {
            p.partial[(static_cast<int64_t>(blockIdx.z) * p.m + r) * p.n + col] = v;
          } else {
            StoreOut(static_cast<OutT*>(p.y) + r * p.ldy + col, v, p.accumulate != 0);
          }
        }
      }
    }
  }
}

// y[m, n] (+)= Σ_s partial[s, m, n], summed in split order.
template <typename OutT>
__global__ void SplitKReduceKernel(const float* __restrict__ partial, int splits, int64_t m,
                                   int64_t n, OutT* __restrict__ y, int64_t ldy, int accumulate) {
  PdlEnter();
  const int64_t total = m * n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += partial[z * total + i];
    const int64_t r = i / n, c = i % n;
    StoreOut(y + r * ldy + c, s, accumulate != 0);
  }
}

}  // namespace glm::kernels::detail
