// Device code of moe_quant (moe_quant.h has the contract).
//
// Algorithm: one weight pass of the routed experts over the device token lists (moe_common.h
// DecodeLists; units of up to kMoeQuantUnitRows rows of one expert, each row a (token, slot)
// pair). CTA (row block, unit): the unit's rows gathered (gate|up: the pair's token row of x;
// down: the pair's row of act) and staged in shared memory as bf16 in gemv_quant's permuted
// order, then gemv_quant's warp arithmetic (GqWarpWindows: packed weight rows read with 16-byte
// streaming loads, widened exactly in registers, mma.sync m16n8k16 bf16 with fp32 accumulators)
// against the unit's expert; the table gives each expert's pointers, strides and global scales.
// Units of more than 8 rows take the two-tile (16-token) instantiation, the others one tile.
// Tiling: 8 warps x 16 weight rows. Gate|up: warps 0-3 gate rows 64b .. 64b + 63, warps 4-7 the
// same up rows; the up sums go through shared memory to the gate warps, which write act =
// silu(g) * u (g, u with their global scales; silu as the bf16 expert kernels: g / (1 + e^-g)).
// Down: 128 rows, y written by pair. K is walked in chunks of whole 64-byte windows that fit the
// dynamic shared memory at the unit's row count (one chunk at decode widths on H100 / H200 for
// a single-row unit), with a barrier between chunks: no split-K, no workspace, no atomics.
// Limits: unit rows <= 16; k a multiple of 32 (int4, nvfp4) / 16 (int8); 16-byte weight rows.
// NOTE: shared memory per CTA is sized by the host from the device (half an SM, as gemv_quant:
// two CTAs per SM); at least 4 KiB for the gate|up exchange.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/gemv_quant.cuh"
#include "kernels/moe_common.h"
#include "kernels/moe_quant.h"

namespace glm::kernels::moe {

inline constexpr int kMqGateUpRows = kernels::detail::kGqRows / 2;  // gate (and up) rows per CTA
inline constexpr int kMqExchangeBytes = kMoeQuantUnitRows * kMqGateUpRows * 4;

struct MoeQuantParams {
  const MoeQuantExpert* experts;  // [num_experts]
  const int32_t* n_units;         // DecodeLists
  const int32_t* unit_expert;
  const int32_t* unit_off;
  const int32_t* row_pair;
  const float* a;  // gate|up: x [tokens, k] (row = pair / top_k); down: act [pairs, k]
  int64_t a_ld;
  int top_k;
  int64_t n, k;   // output rows of one projection, inputs
  int64_t group;  // min(group_size, k)
  int smem_bytes;  // dynamic shared memory of the CTA
  float* c;        // gate|up: act [pairs, n]; down: y [pairs, n] (row stride n)
};

template <int kFmt, bool kWindowScale, bool kGateUp, int kNT>
__device__ __forceinline__ void MoeQuantUnit(const MoeQuantParams& p, int unit, int r0, int ng,
                                             uint8_t* smem, int* s_pair) {
  using namespace kernels::detail;  // NOLINT: the gemv_quant device helpers
  constexpr int kWE = GqWindowElems(kFmt);
  constexpr int kWindowX = 2 * kWE;                       // staged bytes per token and window
  constexpr int kPad = kFmt == kGqInt8 ? 16 : 64;         // gemv_quant's conflict-free padding
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  if (tid < ng) s_pair[tid] = p.row_pair[r0 + tid];
  const MoeQuantExpert& ex = p.experts[p.unit_expert[unit]];
  const MoeQuantMatrix& mat = kGateUp ? (warp < 4 ? ex.gate : ex.up) : ex.down;
  const int64_t r0w = kGateUp ? static_cast<int64_t>(blockIdx.x) * kMqGateUpRows + (warp & 3) * 16
                              : static_cast<int64_t>(blockIdx.x) * kGqRows + warp * 16;
  const int64_t row_lo = r0w + g, row_hi = r0w + g + 8;
  const bool v_lo = row_lo < p.n, v_hi = row_hi < p.n;
  const uint8_t* wbase = static_cast<const uint8_t*>(mat.data);
  const uint8_t* w_lo = wbase + row_lo * mat.ld_bytes;
  const uint8_t* w_hi = wbase + row_hi * mat.ld_bytes;
  const int64_t sb = kFmt == kGqNvfp4 ? 1 : 2;
  const uint8_t* sc_lo = static_cast<const uint8_t*>(mat.scales) + row_lo * mat.scale_ld * sb;
  const uint8_t* sc_hi = static_cast<const uint8_t*>(mat.scales) + row_hi * mat.scale_ld * sb;
  const float out_scale = mat.global_scale;
  bool tok_ok[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) tok_ok[nt] = nt * 8 + g < ng;
  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  }
  const bool warp_active = r0w < p.n;
  const int64_t total_windows = (p.k + kWE - 1) / kWE;
  const int64_t fit = (p.smem_bytes / ng - kPad) / kWindowX;
  const int chunk = static_cast<int>(fit < 1 ? 1 : fit > total_windows ? total_windows : fit);
  const int x_stride = chunk * kWindowX + kPad;
  __syncthreads();  // s_pair
  for (int64_t wb0 = 0; wb0 < total_windows; wb0 += chunk) {
    const int nwin = static_cast<int>(min(static_cast<int64_t>(chunk), total_windows - wb0));
    const int64_t k0 = wb0 * kWE;
    if (wb0 > 0) __syncthreads();  // the previous chunk's reads are done
    const int units = nwin * (kWE / 8);
    for (int i = tid; i < ng * units; i += kGqThreads) {
      const int tok = i / units, u = i - tok * units;
      const int64_t kk = k0 + static_cast<int64_t>(u) * 8;
      const int pair = s_pair[tok];
      const float* xr = p.a + static_cast<int64_t>(kGateUp ? pair / p.top_k : pair) * p.a_ld + kk;
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = kk + j < p.k ? __ldg(xr + j) : 0.0f;
      *reinterpret_cast<uint4*>(smem + tok * x_stride + GqUnitOffset<kFmt>(u)) =
          GqPackUnit<kFmt>(v);
    }
    __syncthreads();
    if (warp_active) {
      GqWarpWindows<kFmt, kWindowScale, kNT>(acc, smem, x_stride, w_lo, w_hi, sc_lo, sc_hi, v_lo,
                                             v_hi, tok_ok, wb0, nwin, p.k, p.group, g, t);
    }
  }
  // acc[nt][e]: row r0w + g + 8 * (e / 2), unit row nt * 8 + 2t + e % 2.
  if constexpr (kGateUp) {
    float* s_up = reinterpret_cast<float*>(smem);  // [unit row][kMqGateUpRows]
    __syncthreads();                               // staging reads done
    if (warp >= 4 && warp_active) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = nt * 8 + 2 * t + (e % 2);
          const int local = (warp - 4) * 16 + g + 8 * (e / 2);
          if (tok < ng) s_up[tok * kMqGateUpRows + local] = acc[nt][e] * out_scale;
        }
      }
    }
    __syncthreads();
    if (warp < 4 && warp_active) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = nt * 8 + 2 * t + (e % 2);
          const int local = warp * 16 + g + 8 * (e / 2);
          const int64_t row = r0w + g + 8 * (e / 2);
          if (tok >= ng || row >= p.n) continue;
          const float gv = acc[nt][e] * out_scale;
          const float u = s_up[tok * kMqGateUpRows + local];
          p.c[static_cast<int64_t>(s_pair[tok]) * p.n + row] = gv / (1.0f + expf(-gv)) * u;
        }
      }
    }
  } else {
    if (!warp_active) return;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = nt * 8 + 2 * t + (e % 2);
        const int64_t row = r0w + g + 8 * (e / 2);
        if (tok >= ng || row >= p.n) continue;
        p.c[static_cast<int64_t>(s_pair[tok]) * p.n + row] = acc[nt][e] * out_scale;
      }
    }
  }
}

// grid (row blocks, max units), block kGqThreads, dynamic smem p.smem_bytes.
template <int kFmt, bool kWindowScale, bool kGateUp>
__global__ void __launch_bounds__(kernels::detail::kGqThreads, 2)
    MoeQuantKernel(MoeQuantParams p) {
  extern __shared__ __align__(16) uint8_t mq_smem[];
  __shared__ int s_pair[kMoeQuantUnitRows];
  static_assert(sizeof(s_pair) == kMoeQuantStaticSmemBytes);
  const int unit = blockIdx.y;
  if (unit >= *p.n_units) return;  // block-uniform
  const int r0 = p.unit_off[unit], ng = p.unit_off[unit + 1] - r0;  // 1..kMoeQuantUnitRows
  if (ng > 8) {
    MoeQuantUnit<kFmt, kWindowScale, kGateUp, 2>(p, unit, r0, ng, mq_smem, s_pair);
  } else {
    MoeQuantUnit<kFmt, kWindowScale, kGateUp, 1>(p, unit, r0, ng, mq_smem, s_pair);
  }
}

}  // namespace glm::kernels::moe
