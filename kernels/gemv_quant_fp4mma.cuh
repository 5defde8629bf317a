// Device code of the FP4-activation nvfp4 GEMV (gemv_quant_fp4.h has the contract; gemv_quant.cu
// launches it when LinearPolicy::nvfp4_path is kFp4Mma).
//
// Algorithm: y[m, n] (+)= global_scale * Σ_k xq[m, k] · W[n, k] with both operands nvfp4 on the
// block-scaled FP4 tensor cores: mma.sync m16n8k64 kind::mxf4nvf4 scale_vec::4X with ue4m3
// scales (A = 16 weight rows as stored, B = 8 tokens quantized here, one ue4m3 scale per 16
// inputs of each operand), fp32 accumulators.
// Tiling (as gemv_quant.cuh): a CTA is 8 warps over 128 weight rows, warp w owning rows
// 16w..16w+15, and one range of 64-byte row windows (128 inputs; grid.y splits K). The CTA first
// quantizes its K range of x (one thread per token and 16-input block, Fp4QuantizeBlock) into
// shared memory, then each warp streams its rows: lane (g = lane / 4, t = lane % 4) loads the 16
// bytes at byte 16t of the window of rows g and g + 8 (a quad reads a whole 64-byte segment).
// Fragments: the MMA's A register pair of lane t holds inputs [8t, 8t + 8) and [32 + 8t, 32 + 8t
// + 8) of a 64-input chunk, and its scale block j covers inputs [16j, 16j + 16) of the chunk,
// which two lanes share; the codes are kept in their stored order (so a scale block is a stored
// 16-input block) and moved to the lane that needs them by a 4x4 word transpose within the quad
// (two shuffle rounds): after it, word j of lane t is stored bytes [16j + 4t, 16j + 4t + 4) of
// the window, i.e. chunk j / 2's A register (j % 2 ? a2 : a0). The staged activations are written
// in that same transposed order, so lane t reads its B registers of both chunks with one 16-byte
// shared-memory load. Weight scales: lane t passes row (t odd ? g + 8 : g)'s 4 scale bytes of the
// chunk (byte j = block j), token scales are read by every lane of the quad for token g (the
// instruction's selectors are all 0).
// Split K and the deterministic reduction as gemv_quant.cuh (partials in split order by the row
// block's last CTA).
// Limits: m <= 16; k a multiple of 32; rows past n and inputs past k contribute 0 (codes and
// scales 0). NOTE: the instruction exists only on sm_120a / sm_121a; for every other device
// architecture the kernel body is a trap and the host never launches it there (Fp4MmaSupport on
// g_gqf4_compiled). Shared memory per CTA: m x (80 bytes per window + padding).
#pragma once

#include <cstdint>

#include "kernels/gemv_quant_fp4.h"
#include "kernels/load_util.cuh"

#if defined(__CUDA_ARCH__) && \
    (defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL))
#define GLM_FP4_MMA_DEVICE 1
#endif

namespace glm::kernels::detail {

inline constexpr int kGqf4Warps = 8;
inline constexpr int kGqf4Threads = 32 * kGqf4Warps;
inline constexpr int kGqf4Rows = 16 * kGqf4Warps;  // rows per CTA
inline constexpr int kGqf4WindowElems = 128;       // inputs per 64-byte row window
inline constexpr int kGqf4Depth = 4;               // windows in flight per warp
// Staged activations per token and window: 64 bytes of codes (transposed order), 8 scale bytes
// (block 0..7 of the window), 8 bytes padding (16-byte aligned windows).
inline constexpr int kGqf4StageWindowBytes = 80;

// Bytes per token row of the staged activations for `windows` windows: rows ≡ 64 mod 128 bytes so
// the 16-byte B loads of tokens g and g + 1 fall in different bank halves.
__host__ __device__ constexpr int Gqf4XStride(int windows) {
  return (windows * kGqf4StageWindowBytes + 127) / 128 * 128 + 64;
}

struct GemvQuantFp4Params {
  const float* x;  // [m, k] fp32, row stride ldx
  int64_t ldx;
  const uint8_t* w;  // packed e2m1 [n, ld_bytes]
  int64_t ld_bytes;
  const uint8_t* scales;  // e4m3 (bit 7 clear) [n, scale_ld]
  int64_t scale_ld;
  float out_scale;  // global_scale
  float* y;         // [m, n] fp32, row stride ldy
  int64_t ldy;
  float* partial;  // [splits, m, n] fp32 when splits > 1
  int* counters;   // [row blocks], zero on entry when splits > 1; left zero
  int64_t n, k;
  int m;
  int windows_per_split;
  int x_stride;  // Gqf4XStride(windows_per_split)
  int accumulate;
};

// 1 in device code that has the FP4 instruction; the host reads it for the current device
// (GemvQuantPlan::Create) to know whether this build can run the path there. Written by no one.
static __device__ int g_gqf4_compiled =
#if defined(GLM_FP4_MMA_DEVICE)
    1;
#else
    0;
#endif

#if defined(GLM_FP4_MMA_DEVICE)

__device__ __forceinline__ void Gqf4Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1, uint32_t sfa,
                                        uint32_t sfb) {
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1"
      ".f32.ue4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%12}, %13, "
      "{%14,%15};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(sfa), "h"(uint16_t{0}),
        "h"(uint16_t{0}), "r"(sfb), "h"(uint16_t{0}), "h"(uint16_t{0}));
}

// 4x4 transpose of 32-bit words within each quad: lane t holds row t (words v[0..3]) on entry and
// column t (v[j] = lane j's word t) on exit. Two rounds of two shuffles.
__device__ __forceinline__ void Gqf4QuadTranspose(uint32_t (&v)[4], int t) {
  // Round 1 (partner t ^ 2): swap the off-diagonal 2x2 blocks.
  const bool hi2 = (t & 2) != 0;
  {
    const uint32_t s0 = hi2 ? v[0] : v[2], s1 = hi2 ? v[1] : v[3];
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 2);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, s1, 2);
    if (hi2) {
      v[0] = r0;
      v[1] = r1;
    } else {
      v[2] = r0;
      v[3] = r1;
    }
  }
  // Now lane t (t & 2 == 0) holds [M[t][0], M[t][1], M[t^2][0], M[t^2][1]] and lane t (t & 2)
  // [M[t^2][2], M[t^2][3], M[t][2], M[t][3]]. Round 2 (partner t ^ 1): transpose each 2x2 block.
  const bool odd = (t & 1) != 0;
  {
    const uint32_t s0 = odd ? v[0] : v[1], s1 = odd ? v[2] : v[3];
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (odd) {
      v[0] = r0;
      v[2] = r1;
    } else {
      v[1] = r0;
      v[3] = r1;
    }
  }
  // Lane t now holds [M[0][t], M[1][t], M[2][t], M[3][t]].
}

#endif  // GLM_FP4_MMA_DEVICE

__global__ void __launch_bounds__(kGqf4Threads, 2) GemvQuantFp4MmaKernel(GemvQuantFp4Params p) {
#if defined(GLM_FP4_MMA_DEVICE)
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGqf4Rows;
  const int64_t total_windows = (p.k + kGqf4WindowElems - 1) / kGqf4WindowElems;
  const int64_t win_begin = static_cast<int64_t>(blockIdx.y) * p.windows_per_split;
  const int nwin =
      static_cast<int>(min(static_cast<int64_t>(p.windows_per_split), total_windows - win_begin));
  const int64_t k0 = win_begin * kGqf4WindowElems;

  // Quantize x[:, k0 : k0 + nwin * 128) per 16-input block into shared memory: block b of a
  // window is stored words 2b, 2b + 1; stored word s sits at 16 (s % 4) + 4 (s / 4) (the
  // transposed order), its scale at byte 64 + b.
  {
    const int blocks = nwin * (kGqf4WindowElems / kFp4BlockElems);
    for (int i = tid; i < p.m * blocks; i += kGqf4Threads) {
      const int tok = i / blocks, b = i - tok * blocks;
      const int64_t kk = k0 + static_cast<int64_t>(b) * kFp4BlockElems;
      const int count = static_cast<int>(min(static_cast<int64_t>(kFp4BlockElems), p.k - kk));
      float v[kFp4BlockElems];
      const float* xr = p.x + tok * p.ldx + kk;
#pragma unroll
      for (int j = 0; j < kFp4BlockElems; ++j) v[j] = j < count ? __ldg(xr + j) : 0.0f;
      uint8_t codes[kFp4BlockElems / 2];
      const uint8_t sb = count > 0 ? Fp4QuantizeBlock(v, kFp4BlockElems, codes) : 0;
      if (count <= 0) {
#pragma unroll
        for (int j = 0; j < kFp4BlockElems / 2; ++j) codes[j] = 0;
      }
      uint8_t* row = smem + tok * p.x_stride + (b / 8) * kGqf4StageWindowBytes;
      const int bw = b % 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * bw + h;
        uint32_t word;
        memcpy(&word, codes + 4 * h, 4);
        *reinterpret_cast<uint32_t*>(row + 16 * (s % 4) + 4 * (s / 4)) = word;
      }
      row[64 + bw] = sb;
    }
  }
  __syncthreads();

  const int64_t r0 = n0 + warp * 16;
  const int64_t row_lo = r0 + g, row_hi = r0 + g + 8;
  const bool v_lo = row_lo < p.n, v_hi = row_hi < p.n;
  const uint8_t* w_lo = p.w + row_lo * p.ld_bytes;
  const uint8_t* w_hi = p.w + row_hi * p.ld_bytes;
  // The row whose scales this lane passes to the instruction (lanes 4g, 4g + 2: row g; 4g + 1,
  // 4g + 3: row g + 8).
  const bool sc_valid = (t & 1) ? v_hi : v_lo;
  const uint8_t* sc_row = p.scales + ((t & 1) ? row_hi : row_lo) * p.scale_ld;
  bool tok_ok[2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) tok_ok[nt] = nt * 8 + g < p.m;
  const int num_nt = p.m > 8 ? 2 : 1;

  float acc[2][4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  }

  const bool warp_active = r0 < p.n;
  for (int wb = 0; warp_active && wb < nwin; wb += kGqf4Depth) {
    uint4 wl[kGqf4Depth], wh[kGqf4Depth];
    uint32_t sc[kGqf4Depth][2];  // scale words of chunks 0 and 1 of the window
#pragma unroll
    for (int d = 0; d < kGqf4Depth; ++d) {
      const int64_t win = win_begin + wb + d;
      const int64_t kc = win * kGqf4WindowElems + t * 32;  // the lane's first input
      const bool in = wb + d < nwin && kc < p.k;
      const int64_t byte = win * 64 + t * 16;
      wl[d] = in && v_lo ? LoadStreaming16(w_lo + byte) : make_uint4(0, 0, 0, 0);
      wh[d] = in && v_hi ? LoadStreaming16(w_hi + byte) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t kb = win * kGqf4WindowElems + c * 64;  // chunk's first input
        // Byte j: block j of the chunk; blocks past k (k is a multiple of 32 only) are 0.
        uint32_t word = 0;
        if (wb + d < nwin && sc_valid) {
          const uint8_t* s = sc_row + kb / kFp4BlockElems;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (kb + j * kFp4BlockElems < p.k)
              word |= static_cast<uint32_t>(__ldg(s + j)) << (8 * j);
          }
        }
        sc[d][c] = word;
      }
    }
#pragma unroll
    for (int d = 0; d < kGqf4Depth; ++d) {
      if (wb + d >= nwin) break;  // warp-uniform
      const int local_win = wb + d;
      uint32_t lo[4] = {wl[d].x, wl[d].y, wl[d].z, wl[d].w};
      uint32_t hi[4] = {wh[d].x, wh[d].y, wh[d].z, wh[d].w};
      Gqf4QuadTranspose(lo, t);
      Gqf4QuadTranspose(hi, t);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        if (nt >= num_nt) break;  // warp-uniform
        const uint8_t* xs = smem + (nt * 8 + g) * p.x_stride + local_win * kGqf4StageWindowBytes;
        const uint4 xb =
            tok_ok[nt] ? *reinterpret_cast<const uint4*>(xs + 16 * t) : make_uint4(0, 0, 0, 0);
        const uint2 xsc = tok_ok[nt] ? *reinterpret_cast<const uint2*>(xs + 64) : make_uint2(0, 0);
        Gqf4Mma(acc[nt], lo[0], hi[0], lo[1], hi[1], xb.x, xb.y, sc[d][0], xsc.x);
        Gqf4Mma(acc[nt], lo[2], hi[2], lo[3], hi[3], xb.z, xb.w, sc[d][1], xsc.y);
      }
    }
  }

  // acc[nt][e]: row r0 + g + 8 * (e / 2), token nt * 8 + 2t + e % 2.
  const bool split = gridDim.y > 1;
  if (warp_active) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = r0 + g + 8 * (e / 2);
        const int tok = nt * 8 + 2 * t + (e % 2);
        if (row >= p.n || tok >= p.m) continue;
        const float v = acc[nt][e] * p.out_scale;
        if (split) {
          p.partial[(static_cast<int64_t>(blockIdx.y) * p.m + tok) * p.n + row] = v;
        } else {
          float* yp = p.y + tok * p.ldy + row;
          *yp = p.accumulate ? *yp + v : v;
        }
      }
    }
  }
  if (!split) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(p.counters + blockIdx.x, 1) == static_cast<int>(gridDim.y) - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int rows = static_cast<int>(min(static_cast<int64_t>(kGqf4Rows), p.n - n0));
  const int64_t zstride = static_cast<int64_t>(p.m) * p.n;
  const int nz = static_cast<int>(gridDim.y);
  for (int i = tid; i < p.m * kGqf4Rows; i += kGqf4Threads) {
    const int tok = i / kGqf4Rows, r = i - tok * kGqf4Rows;
    if (r >= rows) continue;
    const int64_t row = n0 + r;
    const float* part = p.partial + static_cast<int64_t>(tok) * p.n + row;
    float sum = 0.0f;
    for (int z = 0; z < nz; ++z) sum += __ldcg(part + z * zstride);  // split order
    float* yp = p.y + tok * p.ldy + row;
    *yp = p.accumulate ? *yp + sum : sum;
  }
  if (tid == 0) p.counters[blockIdx.x] = 0;
#else
  __trap();  // never launched: the host checks g_gqf4_compiled first
#endif
}

}  // namespace glm::kernels::detail
