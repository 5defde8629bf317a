// fp8 routed experts on tensor cores (kernels/moe_mma.h): the default for fp8 experts at
// kMoeMmaMinPairs..kMoeGroupedMaxPairs pairs (decode batches 65..512 with top-8), reading the
// device token lists of moe_grouped.cuh.
//
// The token-group kernel (moe_grouped.cuh) is instruction-issue bound on fp8 (widening e4m3 to
// fp32 costs ~1.5 instructions per value, plus one FMA per value per token row, activations
// being fp32). Here the products run on the tensor cores: mma.sync.m16n8k16 f16 x f16 -> fp32, weights as the A
// operand (M = 16 expert output rows per tile), token rows as N (8 per n-tile; columns past the
// slot's rows are zero and not stored), K walked in 64-wide chunks inside 128-wide K blocks (the
// fp8 scale blocks).
// - Weights: every finite e4m3 value is exact in f16 (max 448, smallest subnormal 2^-9; f16
//   reaches 65504 and 2^-24), converted by cvt.rn.f16x2.e4m3x2 (one instruction per 2 values).
// - Activations: MoeSplitKernel writes each fp32 row as three f16 terms per 128-wide K block
//   with a power-of-two scale: x * 2^s = hi + mid + lo, s chosen so the block's max |x| * 2^s
//   lies in [2^14, 2^15). hi / mid / lo carry 11 bits each, so the three add back to x * 2^s to
//   33 bits relative, with an absolute floor of 2^-25 (f16 subnormals): within 2^-39 of the
//   block's max |x| (better than the 2^-24 of fp32 itself). The products of f16 terms with
//   e4m3 values (4 + 11 bits) are exact in fp32.
// - Sums: per k16 step and tile, the three terms' mmas chain from zero (lo, mid, hi) and the
//   result is added in fp32 (round-to-nearest) into the K block's accumulator; at the end of a
//   K block the block sum times (weight block scale x 2^-s of the token's K block) is added
//   (FMA) into the running sum, as the grouped kernel scales each partial. Fixed order, no
//   atomics: deterministic, graph replay = eager. A column's result does not depend on the
//   other columns of its n-tile (the mma sums each output independently).
// - Fragments straight from global memory (as kernels/gemm_fp8_block.cuh): thread (g = lane / 4,
//   q = lane % 4) loads bytes [16q, 16q + 16) of a 64-wide chunk of weight rows g and g + 8
//   (16-byte streaming loads; a row's 4 threads read 64 contiguous bytes), and f16 values
//   [16q, 16q + 16) of each term of token column g; k16 step j uses bytes 4j..4j+3 of each
//   thread's 16 on both operands, so the mma's k order is permuted, not the sum's terms. The
//   next chunk's weight loads are issued before the current one is used.
// Task = (slot, column group): fused 16 gate + 16 up rows (16 act columns), down 32 rows (two
// m-tiles); slots from MoeListRouteKernel, a slot's rows 8 at a time (an expert with more than
// 8 rows re-reads its weights per n-tile, mostly from L2). Persistent grid sized from the SM
// count and the occupancy; no shared memory. Limits: fp8 weights with 16-byte rows (k % 16 ==
// 0, 16-byte aligned rows); K past k loads zeros (weights) and the split pads with zeros.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/launch.cuh"
#include "kernels/load_util.cuh"
#include "kernels/moe_common.h"
#include "kernels/moe_mma.h"

namespace glm::kernels::moe {

using detail::LoadStreaming16;

// grid (rows, kblocks), block kMmaKB. dst [rows, kblocks, 3, kMmaKB] f16 (hi, mid, lo), inv
// [rows, kblocks] = 2^-s; values past k are zero.
__global__ void __launch_bounds__(kMmaKB)
    MoeSplitKernel(const float* src, int64_t ld, int k, int kblocks, __half* dst, float* inv) {
  PdlEnter();
  __shared__ float wmax[kMmaKB / 32];
  const int row = blockIdx.x, b = blockIdx.y, i = threadIdx.x;
  const int kk = b * kMmaKB + i;
  const float v = kk < k ? src[int64_t{row} * ld + kk] : 0.f;
  float m = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((i & 31) == 0) wmax[i >> 5] = m;
  __syncthreads();
  m = fmaxf(fmaxf(wmax[0], wmax[1]), fmaxf(wmax[2], wmax[3]));
  int shift = 0;  // NaN / inf blocks: unscaled (they stay NaN / inf)
  if (m > 0.f && m <= 3.4028235e38f) {
    int e;
    frexpf(m, &e);  // m in [2^(e-1), 2^e)
    shift = min(15 - e, 100);
  }
  const float xs = ldexpf(v, shift);
  const __half hi = __float2half_rn(xs);
  const float r1 = xs - __half2float(hi);  // exact
  const __half mid = __float2half_rn(r1);
  const __half lo = __float2half_rn(r1 - __half2float(mid));  // the difference is exact
  __half* d = dst + (int64_t{row} * kblocks + b) * kMmaSplitRow;
  d[i] = hi;
  d[kMmaKB + i] = mid;
  d[2 * kMmaKB + i] = lo;
  if (i == 0) inv[int64_t{row} * kblocks + b] = ldexpf(1.f, -shift);
}

__device__ __forceinline__ uint32_t E4m3x2ToF16x2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment of k16 step j from the 16-byte chunks of rows g (r0) and g + 8 (r8).
__device__ __forceinline__ void MmaAFrag(const uint4& r0, const uint4& r8, int j,
                                         uint32_t (&a)[4]) {
  const uint32_t w0 = kernels::detail::Word4(r0, j), w8 = kernels::detail::Word4(r8, j);
  a[0] = E4m3x2ToF16x2(w0);
  a[1] = E4m3x2ToF16x2(w8);
  a[2] = E4m3x2ToF16x2(w0 >> 16);
  a[3] = E4m3x2ToF16x2(w8 >> 16);
}

template <bool kFused>
__global__ void __launch_bounds__(kMmaWarps * 32, 2) MoeMmaKernel(MmaParams p, DecodeLists l) {
  PdlEnter();
  constexpr int kCols = kFused ? 16 : 32;  // output columns per task
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int gw = blockIdx.x * kMmaWarps + (threadIdx.x >> 5);
  const int num_warps = gridDim.x * kMmaWarps;
  const int groups = (p.n + kCols - 1) / kCols;
  const int tasks = *l.n_active * groups;
  const int nchunks = (p.k + kMmaChunk - 1) / kMmaChunk;
  const int64_t brow_halves = int64_t{p.kblocks} * kMmaSplitRow;
  for (int t = gw; t < tasks; t += num_warps) {
    const int slot = t / groups, n0 = (t - slot * groups) * kCols;
    const MoeExpert& ex = p.experts[l.slot_expert[slot]];
    // This thread's weight rows: tile 0 rows g, g + 8, tile 1 rows g, g + 8 (fused: gate / up
    // rows n0..; down: rows n0.. / n0 + 16..); rows past n read row n0 and are not stored.
    const char* wr[4];
    const float* srow[2];
    {
      const char* base[2];
      int64_t ld[2];
      int row0[2];
      if constexpr (kFused) {
        base[0] = static_cast<const char*>(ex.gate), ld[0] = ex.gate_ld, row0[0] = n0;
        base[1] = static_cast<const char*>(ex.up), ld[1] = ex.up_ld, row0[1] = n0;
        srow[0] = ex.gate_s + (n0 >> 7) * ex.gate_sld;
        srow[1] = ex.up_s + (n0 >> 7) * ex.up_sld;
      } else {
        base[0] = base[1] = static_cast<const char*>(ex.down);
        ld[0] = ld[1] = ex.down_ld;
        row0[0] = n0, row0[1] = n0 + 16;
        srow[0] = srow[1] = ex.down_s + (n0 >> 7) * ex.down_sld;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row0[h] + g + 8 * r;
          wr[2 * h + r] = base[h] + int64_t{row < p.n ? row : n0} * ld[h];
        }
      }
    }
    const int r0 = l.slot_off[slot], r1 = l.slot_off[slot + 1];
    for (int nb = r0; nb < r1; nb += 8) {
      const int ng = min(8, r1 - nb);
      // B: token column g; C: columns 2q, 2q + 1.
      const int pg = g < ng ? l.row_pair[nb + g] : -1;
      const uint4* bp = nullptr;
      if (pg >= 0) {
        const int64_t brow = kFused ? pg / p.top_k : pg;
        bp = reinterpret_cast<const uint4*>(p.bsplit + brow * brow_halves) + 2 * q;
      }
      int pc[2];
      const float* inv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 2 * q + h;
        pc[h] = col < ng ? l.row_pair[nb + col] : -1;
        inv[h] = pc[h] < 0 ? nullptr
                           : p.binv + int64_t{kFused ? pc[h] / p.top_k : pc[h]} * p.kblocks;
      }
      float acc[2][4], blk[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[h][i] = 0.f, blk[h][i] = 0.f;
      uint4 wc[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        wc[m] = 16 * q < p.k ? LoadStreaming16(wr[m] + 16 * q) : make_uint4(0, 0, 0, 0);
      }
      for (int c = 0; c < nchunks; ++c) {
        uint4 wn[4];
        const int kn = (c + 1) * kMmaChunk + 16 * q;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          wn[m] = kn < p.k ? LoadStreaming16(wr[m] + kn) : make_uint4(0, 0, 0, 0);
        }
        const int kb = c >> 1, half = c & 1;
        // B: 16 f16 of each term, in two halves of 8 (k16 steps 0-1, 2-3).
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          uint4 bt[3];
#pragma unroll
          for (int s = 0; s < 3; ++s) {
            bt[s] = bp != nullptr
                        ? __ldg(bp + (kb * kMmaSplitRow + s * kMmaKB + half * kMmaChunk) / 8 + jj)
                        : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int j2 = 0; j2 < 2; ++j2) {
            const int j = 2 * jj + j2;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              uint32_t a[4];
              MmaAFrag(wc[2 * h], wc[2 * h + 1], j, a);
              float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
              for (int s = 2; s >= 0; --s) {  // lo, mid, hi
                MmaF16(d, a, kernels::detail::Word4(bt[s], 2 * j2),
                       kernels::detail::Word4(bt[s], 2 * j2 + 1));
              }
#pragma unroll
              for (int i = 0; i < 4; ++i) blk[h][i] += d[i];
            }
          }
        }
        if (half == 1 || c + 1 == nchunks) {
          const float i0 = inv[0] != nullptr ? __ldg(inv[0] + kb) : 0.f;
          const float i1 = inv[1] != nullptr ? __ldg(inv[1] + kb) : 0.f;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float ws = __ldg(srow[h] + kb);
            const float s0 = ws * i0, s1 = ws * i1;
            acc[h][0] = fmaf(blk[h][0], s0, acc[h][0]);
            acc[h][1] = fmaf(blk[h][1], s1, acc[h][1]);
            acc[h][2] = fmaf(blk[h][2], s0, acc[h][2]);
            acc[h][3] = fmaf(blk[h][3], s1, acc[h][3]);
#pragma unroll
            for (int i = 0; i < 4; ++i) blk[h][i] = 0.f;
          }
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) wc[m] = wn[m];
      }
      // C element i of tile h: row g + 8 (i / 2), column 2q + i % 2.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int pair = pc[i & 1];
        if (pair < 0) continue;
        float* crow = p.c + int64_t{pair} * p.n;
        const int row = n0 + g + 8 * (i >> 1);
        if constexpr (kFused) {
          if (row < p.n) {
            const float gv = acc[0][i], uv = acc[1][i];
            crow[row] = gv / (1.0f + expf(-gv)) * uv;
          }
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (row + 16 * h < p.n) crow[row + 16 * h] = acc[h][i];
          }
        }
      }
    }
  }
}

}  // namespace glm::kernels::moe
