// Device code of gemv_quant (gemv_quant.h has the contract).
//
// Algorithm: y[m, n] (+)= Σ_k bf16(x)[m, k] · W[n, k] for m <= 16 tokens, one launch, with W
// read in its packed form (INT4 / INT8 codes with bf16 group scales, or NVFP4 e2m1 codes with
// e4m3 16-input scales and a global scale) and widened in registers.
// Tiling (as gemv_narrow): a CTA is 8 warps over 128 consecutive weight rows, warp w owning
// rows 16w..16w+15, and one range of 64-byte row windows (grid.y splits K). The CTA stages its
// K range of x in shared memory as bf16 and synchronizes once. Tensor cores through mma.sync
// m16n8k16 bf16 (A = 16 weight rows, B = 8 tokens; m > 8 uses two 8-token tiles), fp32
// accumulators. Thread (g = lane/4, t = lane%4) loads 16 bytes at byte 16t of the window of
// rows g and g+8 (a quad reads a whole 64-byte segment of a row); its 32 (int4, nvfp4) or 16
// (int8) inputs feed the MMA's k slots {2t, 2t+1, 2t+8, 2t+9} over 8 or 4 k-steps in a fixed
// permutation of the physical order, and x is staged in that same permutation, so the dot
// products are unchanged. kGemvQuantDepth windows per warp are loaded before any is widened.
// Exact widening (every value the tensor cores see is a bf16 and every product is exact in the
// fp32 accumulator, so the only roundings are those of the fp32 sums):
// - int, window_scale (a group is whole 64-byte windows: int4 group % 128 == 0, int8 group %
//   64 == 0, the real checkpoints): the codes q (|q| <= 128) are bf16 exactly; each window's MMA
//   sums are multiplied by the rows' group scale in fp32 and added to the accumulators.
// - int, otherwise (group 16..64): w = q · s has up to 16 significant bits: hi = bf16(q · s)
//   and lo = q · s - hi (exact in bf16: at most 8 bits remain), two products per k-step.
// - nvfp4: 2·e2m1 (an integer, |.| <= 12) times s / 2 (e4m3, exact in bf16) is e2m1 · s, at
//   most 6 significant bits: exact in bf16; the global scale multiplies the final sums.
// Int4 codes widen as 0x4300 | u = 128 + u in bf16, minus 136 (two per instruction); nvfp4
// magnitudes go through a byte-permute table; int8 through the fp32 2^23 trick.
// Split K: each CTA writes fp32 partials [split, m, n] to the workspace, fences, and takes a
// ticket from the row block's counter; the last CTA sums the partials in split order
// (deterministic), writes y and resets the counter.
// Shared memory rows are padded so the B-fragment reads are conflict-free: int4 / nvfp4 lanes
// read four 16-byte units of a 64-byte slice, stored rotated by t (unit c at (c + t) % 4), rows
// ≡ 64 mod 128 bytes; int8 lanes read two units, rows ≡ 16 mod 128.
// Limits: m <= 16; k a multiple of 32 (int4, nvfp4) / 16 (int8); 16-byte aligned weight rows.
// Rows past n and windows past k contribute nothing (their loads are skipped and their x is 0).
// The warp's window loop (GqWarpWindows) is shared with moe_quant.cuh, whose CTAs gather their
// token rows per expert and then run the same arithmetic.
// NOTE: shared memory per CTA is m x (K range) x 2 bytes; the host caps the K range so that two
// CTAs fit an SM (GB10: ~49 KiB, H100/H200: ~113 KiB per CTA). No sm_90-only instructions:
// mma.sync, prmt and the bf16x2 arithmetic all exist on sm_80.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "kernels/load_util.cuh"

namespace glm::kernels::detail {

inline constexpr int kGqWarps = 8;
inline constexpr int kGqThreads = 32 * kGqWarps;
inline constexpr int kGqRows = 16 * kGqWarps;  // rows per CTA
inline constexpr int kGqWindowBytes = 64;      // bytes of one row per window (4 lanes x 16)
template <int kNT>
inline constexpr int kGemvQuantDepth = kNT == 1 ? 4 : 2;  // windows in flight per warp

// Format codes of the kernels' template parameter.
inline constexpr int kGqInt4 = 0, kGqInt8 = 1, kGqNvfp4 = 2;

// Inputs per 16-byte lane chunk and per window.
__host__ __device__ constexpr int GqChunkElems(int fmt) { return fmt == kGqInt8 ? 16 : 32; }
__host__ __device__ constexpr int GqWindowElems(int fmt) { return 4 * GqChunkElems(fmt); }

struct GemvQuantParams {
  const float* x;  // [m, k] fp32, row stride ldx
  int64_t ldx;
  const uint8_t* w;  // packed [n, ld_bytes]
  int64_t ld_bytes;
  const void* scales;  // bf16 (int) / e4m3 (nvfp4) [n, scale_ld]
  int64_t scale_ld;
  int64_t group;      // inputs per scale
  float out_scale;    // nvfp4: global_scale; int: 1
  float* y;           // [m, n] fp32, row stride ldy
  int64_t ldy;
  float* partial;     // [splits, m, n] fp32 when splits > 1
  int* counters;      // [row blocks], zero on entry when splits > 1; left zero
  int64_t n, k;
  int m;
  int windows_per_split;
  int x_stride;  // bytes per token row of the staged x
  int accumulate;
};

// --- Exact scalar decoders shared by the host mirror, the widening kernel and the tests. ---

__host__ __device__ inline float GqBf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// e4m3 (fn: no infinities; 0x7f / 0xff are NaN) to float, exactly.
__host__ __device__ inline float GqE4m3ToFloat(uint8_t b) {
  const int e = (b >> 3) & 15, man = b & 7;
  float v;
  if ((b & 0x7f) == 0x7f) {
    const uint32_t nan = 0x7fc00000u;
    memcpy(&v, &nan, 4);
  } else if (e == 0) {
    v = static_cast<float>(man) * 0.001953125f;  // man / 8 * 2^-6
  } else {
    const uint32_t bits = (static_cast<uint32_t>(e + 120) << 23) | (static_cast<uint32_t>(man) << 20);
    memcpy(&v, &bits, 4);
  }
  return (b & 0x80) ? -v : v;
}

// e2m1 code (bit 3 sign) to its value.
__host__ __device__ inline float GqE2m1ToFloat(uint8_t code) {
  const int c = code & 7;
  const float mag = c < 2 ? 0.5f * c : static_cast<float>((2 + (c & 1)) << ((c >> 1) - 1)) * 0.5f;
  return (code & 8) ? -mag : mag;
}

// The exact fp32 value of element kk of row r of a packed weight (host or device pointers):
// int: q * scale; nvfp4: e2m1 * e4m3 (without the global scale).
template <int kFmt>
__host__ __device__ inline float GqDecode(const uint8_t* row, const void* scale_row, int64_t kk,
                                          int64_t group) {
  if constexpr (kFmt == kGqInt4) {
    const uint8_t byte = row[kk / 2];  // little-endian words: element kk at nibble kk % 8
    const int u = (kk & 1) ? byte >> 4 : byte & 15;
    const uint16_t s = static_cast<const uint16_t*>(scale_row)[kk / group];
    return static_cast<float>(u - 8) * GqBf16BitsToFloat(s);
  } else if constexpr (kFmt == kGqInt8) {
    const int u = row[kk];
    const uint16_t s = static_cast<const uint16_t*>(scale_row)[kk / group];
    return static_cast<float>(u - 128) * GqBf16BitsToFloat(s);
  } else {
    const uint8_t byte = row[kk / 2];
    const uint8_t code = (kk & 1) ? byte >> 4 : byte & 15;
    return GqE2m1ToFloat(code) * GqE4m3ToFloat(static_cast<const uint8_t*>(scale_row)[kk / 16]);
  }
}

#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t GqBits(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
__device__ __forceinline__ __nv_bfloat162 GqBf2(uint32_t u) {
  __nv_bfloat162 v;
  memcpy(&v, &u, 4);
  return v;
}

__device__ __forceinline__ void GqMma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                      uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// int4 nibbles i and i + 4 of word w as bf16x2 (q_i, q_{i+4}), q = u - 8, exact.
__device__ __forceinline__ uint32_t GqInt4Pair(uint32_t w, int i) {
  const uint32_t raw = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;  // 128 + u
  return GqBits(__hsub2(GqBf2(raw), GqBf2(0x43084308u)));             // - 136
}

// nvfp4 nibbles i and i + 4 of word w as bf16x2 (2 e2m1_i, 2 e2m1_{i+4}), exact.
__device__ __forceinline__ uint32_t GqFp4Pair(uint32_t w, int i) {
  const uint32_t sel = ((w >> (4 * i)) & 0x7u) | ((w >> (4 * i + 8)) & 0x700u);
  const uint32_t mag = __byte_perm(0x03020100u, 0x0C080604u, sel);  // bytes 0 and 2; 1, 3 = 0
  const uint32_t sign = (w << (12 - 4 * i)) & 0x80008000u;
  const uint32_t base = 0x43004300u | sign;  // ±128
  return GqBits(__hsub2(GqBf2(mag | base), GqBf2(base)));
}

// int8 bytes 2h and 2h + 1 of word w as bf16x2 (q, q'), q = u - 128, exact.
__device__ __forceinline__ uint32_t GqInt8Pair(uint32_t w, int h) {
  const float f0 = __int_as_float(static_cast<int>(__byte_perm(w, 0x4B00u, 0x5440u | (2 * h)))) -
                   8388736.0f;
  const float f1 =
      __int_as_float(static_cast<int>(__byte_perm(w, 0x4B00u, 0x5440u | (2 * h + 1)))) -
      8388736.0f;
  return GqBits(__floats2bfloat162_rn(f0, f1));
}

__device__ __forceinline__ uint16_t GqLoadU16(const void* p) {
  return __ldg(static_cast<const unsigned short*>(p));
}

// Packs 8 fp32 (elements 0..7 of a unit) to bf16 in the unit's staged order.
template <int kFmt>
__device__ __forceinline__ uint4 GqPackUnit(const float (&v)[8]) {
  uint4 r;
  if constexpr (kFmt == kGqInt8) {  // natural order
    r.x = GqBits(__floats2bfloat162_rn(v[0], v[1]));
    r.y = GqBits(__floats2bfloat162_rn(v[2], v[3]));
    r.z = GqBits(__floats2bfloat162_rn(v[4], v[5]));
    r.w = GqBits(__floats2bfloat162_rn(v[6], v[7]));
  } else {  // pairs (0,4), (1,5), (2,6), (3,7): the widening's order
    r.x = GqBits(__floats2bfloat162_rn(v[0], v[4]));
    r.y = GqBits(__floats2bfloat162_rn(v[1], v[5]));
    r.z = GqBits(__floats2bfloat162_rn(v[2], v[6]));
    r.w = GqBits(__floats2bfloat162_rn(v[3], v[7]));
  }
  return r;
}

// Byte offset in a staged token row of unit u (8 inputs) of the CTA's K range.
template <int kFmt>
__device__ __forceinline__ int GqUnitOffset(int u) {
  constexpr int kUnitsPerChunk = GqChunkElems(kFmt) / 8;  // 4 or 2
  constexpr int kUnitsPerWindow = 4 * kUnitsPerChunk;
  const int win = u / kUnitsPerWindow, uw = u % kUnitsPerWindow;
  const int t = uw / kUnitsPerChunk, c = uw % kUnitsPerChunk;
  const int cs = kUnitsPerChunk == 4 ? (c + t) & 3 : c;
  return win * (kUnitsPerWindow * 16) + t * (kUnitsPerChunk * 16) + cs * 16;
}

// One warp's MMAs over the staged windows [0, nwin) of the CTA's K range (global windows
// win_begin + i): acc[nt][e] += the products of weight rows lo = g, hi = g + 8 of its 16 (w_lo /
// w_hi: their packed rows, sc_lo / sc_hi: their scale rows, v_lo / v_hi: whether they exist) and
// the staged tokens nt * 8 + 2t + e % 2 (tok_ok[nt]: token nt * 8 + g exists). smem holds the
// staged bf16 x, x_stride bytes per token; k: the weight's inputs; group: inputs per scale
// (min(group_size, k)). The arithmetic of GemvQuantKernel (and of moe_quant's kernels, which
// gather their token rows and then call this): warp-uniform, no barriers.
template <int kFmt, bool kWindowScale, int kNT>
__device__ __forceinline__ void GqWarpWindows(float (&acc)[kNT][4], const uint8_t* smem,
                                              int x_stride, const uint8_t* w_lo,
                                              const uint8_t* w_hi, const uint8_t* sc_lo,
                                              const uint8_t* sc_hi, bool v_lo, bool v_hi,
                                              const bool (&tok_ok)[kNT], int64_t win_begin,
                                              int nwin, int64_t k, int64_t group, int g, int t) {
  constexpr int kE = GqChunkElems(kFmt);
  constexpr int kWE = GqWindowElems(kFmt);
  constexpr int kUnitsPerChunk = kE / 8;
  constexpr int kDepth = kGemvQuantDepth<kNT>;
  for (int wb = 0; wb < nwin; wb += kDepth) {
    uint4 wl[kDepth], wh[kDepth];
    // Scales: [d][0] row g / [d][1] row g + 8; index 0: the chunk's first half, 1: second.
    uint32_t sraw[kDepth][2][2];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t win = win_begin + wb + d;
      const int64_t kc = win * kWE + t * kE;  // the lane's first input
      const bool in = wb + d < nwin && kc < k;
      const int64_t byte = win * kGqWindowBytes + t * 16;
      wl[d] = in && v_lo ? LoadStreaming16(w_lo + byte) : make_uint4(0, 0, 0, 0);
      wh[d] = in && v_hi ? LoadStreaming16(w_hi + byte) : make_uint4(0, 0, 0, 0);
      // A window scale multiplies the MMA's sums, and lane t holds the sums of tokens 2t, 2t + 1
      // over the whole window: every lane loads it (from the window's first input) while the
      // window exists, also a lane whose own inputs lie past k.
      const bool scale_in = kWindowScale ? wb + d < nwin : in;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool ok = scale_in && (r == 0 ? v_lo : v_hi);
        const uint8_t* sr = r == 0 ? sc_lo : sc_hi;
        if constexpr (kFmt == kGqNvfp4) {
          const int64_t s0 = kc / 16;
          sraw[d][r][0] = ok ? __ldg(sr + s0) : 0u;
          sraw[d][r][1] = ok ? __ldg(sr + s0 + 1) : 0u;
        } else {
          const int64_t s0 = (kWindowScale ? win * kWE : kc) / group;
          sraw[d][r][0] = ok ? GqLoadU16(sr + 2 * s0) : 0u;
          if constexpr (!kWindowScale && kFmt == kGqInt4) {
            const int64_t s1 = (kc + kE / 2) / group;
            sraw[d][r][1] = ok ? GqLoadU16(sr + 2 * s1) : 0u;
          } else {
            sraw[d][r][1] = sraw[d][r][0];
          }
        }
      }
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (wb + d >= nwin) break;  // warp-uniform
      const int local_win = wb + d;
      // B fragments: the lane's kE staged inputs of tokens g and 8 + g.
      uint4 xb[kNT][kUnitsPerChunk];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const uint8_t* xs = smem + (nt * 8 + g) * x_stride +
                            local_win * (4 * kUnitsPerChunk * 16) + t * (kUnitsPerChunk * 16);
#pragma unroll
        for (int c = 0; c < kUnitsPerChunk; ++c) {
          const int cs = kUnitsPerChunk == 4 ? (c + t) & 3 : c;
          xb[nt][c] = tok_ok[nt] ? *reinterpret_cast<const uint4*>(xs + cs * 16)
                                 : make_uint4(0, 0, 0, 0);
        }
      }
      // Scales in the form the widening uses.
      uint32_t s2[2][2];  // bf16x2 (s, s): [row][half]
      float sf[2];        // window_scale: fp32 scale of rows g, g + 8
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (kFmt == kGqNvfp4) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float s = 0.5f * GqE4m3ToFloat(static_cast<uint8_t>(sraw[d][r][h]));
            s2[r][h] = GqBits(__float2bfloat162_rn(s));
          }
        } else {
          sf[r] = GqBf16BitsToFloat(static_cast<uint16_t>(sraw[d][r][0]));
#pragma unroll
          for (int h = 0; h < 2; ++h) s2[r][h] = sraw[d][r][h] * 0x10001u;
        }
      }
      float tmp[kNT][4];
      if constexpr (kWindowScale) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) tmp[nt][e] = 0.0f;
        }
      }
      const uint32_t wlw[4] = {wl[d].x, wl[d].y, wl[d].z, wl[d].w};
      const uint32_t whw[4] = {wh[d].x, wh[d].y, wh[d].z, wh[d].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // word j of the lane's chunk
        constexpr int kSteps = kFmt == kGqInt8 ? 1 : 2;
#pragma unroll
        for (int hs = 0; hs < kSteps; ++hs) {
          uint32_t a0, a1, a2, a3, b[kNT][2];
          if constexpr (kFmt == kGqInt8) {
            a0 = GqInt8Pair(wlw[j], 0);
            a1 = GqInt8Pair(whw[j], 0);
            a2 = GqInt8Pair(wlw[j], 1);
            a3 = GqInt8Pair(whw[j], 1);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              const uint4& u = xb[nt][j / 2];
              b[nt][0] = (j & 1) ? u.z : u.x;
              b[nt][1] = (j & 1) ? u.w : u.y;
            }
          } else {
            const int i = 2 * hs;
            if constexpr (kFmt == kGqInt4) {
              a0 = GqInt4Pair(wlw[j], i);
              a1 = GqInt4Pair(whw[j], i);
              a2 = GqInt4Pair(wlw[j], i + 1);
              a3 = GqInt4Pair(whw[j], i + 1);
            } else {
              a0 = GqFp4Pair(wlw[j], i);
              a1 = GqFp4Pair(whw[j], i);
              a2 = GqFp4Pair(wlw[j], i + 1);
              a3 = GqFp4Pair(whw[j], i + 1);
            }
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              const uint4& u = xb[nt][j];
              b[nt][0] = hs ? u.z : u.x;
              b[nt][1] = hs ? u.w : u.y;
            }
          }
          if constexpr (kWindowScale) {
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) GqMma(tmp[nt], a0, a1, a2, a3, b[nt][0], b[nt][1]);
          } else {
            const int half = kFmt == kGqInt8 ? 0 : j / 2;
            const __nv_bfloat162 slo = GqBf2(s2[0][half]), shi = GqBf2(s2[1][half]);
            const __nv_bfloat162 h0 = __hmul2(GqBf2(a0), slo), h1 = __hmul2(GqBf2(a1), shi);
            const __nv_bfloat162 h2 = __hmul2(GqBf2(a2), slo), h3 = __hmul2(GqBf2(a3), shi);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              GqMma(acc[nt], GqBits(h0), GqBits(h1), GqBits(h2), GqBits(h3), b[nt][0], b[nt][1]);
            }
            if constexpr (kFmt != kGqNvfp4) {
              const uint32_t l0 = GqBits(__hfma2(GqBf2(a0), slo, __hneg2(h0)));
              const uint32_t l1 = GqBits(__hfma2(GqBf2(a1), shi, __hneg2(h1)));
              const uint32_t l2 = GqBits(__hfma2(GqBf2(a2), slo, __hneg2(h2)));
              const uint32_t l3 = GqBits(__hfma2(GqBf2(a3), shi, __hneg2(h3)));
#pragma unroll
              for (int nt = 0; nt < kNT; ++nt) {
                GqMma(acc[nt], l0, l1, l2, l3, b[nt][0], b[nt][1]);
              }
            }
          }
        }
      }
      if constexpr (kWindowScale) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] = fmaf(tmp[nt][e], sf[e / 2], acc[nt][e]);
        }
      }
    }
  }
}

template <int kFmt, bool kWindowScale, int kNT>
__global__ void __launch_bounds__(kGqThreads, 2) GemvQuantKernel(GemvQuantParams p) {
  constexpr int kWE = GqWindowElems(kFmt);
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGqRows;
  const int64_t total_windows = (p.k + kWE - 1) / kWE;
  const int64_t win_begin = static_cast<int64_t>(blockIdx.y) * p.windows_per_split;
  const int nwin = static_cast<int>(min(static_cast<int64_t>(p.windows_per_split),
                                        total_windows - win_begin));
  const int64_t k0 = win_begin * kWE;

  // Stage x[:, k0 : k0 + nwin * kWE) as bf16 (0 past k), in the widening's order.
  {
    const int units = nwin * (kWE / 8);
    for (int i = tid; i < p.m * units; i += kGqThreads) {
      const int tok = i / units, u = i - tok * units;
      const int64_t kk = k0 + static_cast<int64_t>(u) * 8;
      const float* xr = p.x + tok * p.ldx + kk;
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = kk + j < p.k ? __ldg(xr + j) : 0.0f;
      *reinterpret_cast<uint4*>(smem + tok * p.x_stride + GqUnitOffset<kFmt>(u)) =
          GqPackUnit<kFmt>(v);
    }
  }
  __syncthreads();

  const int64_t r0 = n0 + warp * 16;
  const int64_t row_lo = r0 + g, row_hi = r0 + g + 8;
  const bool v_lo = row_lo < p.n, v_hi = row_hi < p.n;
  const uint8_t* w_lo = p.w + row_lo * p.ld_bytes;
  const uint8_t* w_hi = p.w + row_hi * p.ld_bytes;
  const uint8_t* sc_lo = static_cast<const uint8_t*>(p.scales) +
                         row_lo * p.scale_ld * (kFmt == kGqNvfp4 ? 1 : 2);
  const uint8_t* sc_hi = static_cast<const uint8_t*>(p.scales) +
                         row_hi * p.scale_ld * (kFmt == kGqNvfp4 ? 1 : 2);
  bool tok_ok[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) tok_ok[nt] = nt * 8 + g < p.m;

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  }

  const bool warp_active = r0 < p.n;
  if (warp_active) {
    GqWarpWindows<kFmt, kWindowScale, kNT>(acc, smem, p.x_stride, w_lo, w_hi, sc_lo, sc_hi, v_lo,
                                           v_hi, tok_ok, win_begin, nwin, p.k, p.group, g, t);
  }

  // acc[nt][e]: row r0 + g + 8 * (e / 2), token nt * 8 + 2t + e % 2.
  const bool split = gridDim.y > 1;
  if (warp_active) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
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
  const int rows = static_cast<int>(min(static_cast<int64_t>(kGqRows), p.n - n0));
  const int64_t zstride = static_cast<int64_t>(p.m) * p.n;
  const int nz = static_cast<int>(gridDim.y);
  for (int i = tid; i < p.m * kGqRows; i += kGqThreads) {
    const int tok = i / kGqRows, r = i - tok * kGqRows;
    if (r >= rows) continue;
    const int64_t row = n0 + r;
    const float* part = p.partial + static_cast<int64_t>(tok) * p.n + row;
    float sum = 0.0f;
    // All loads of a batch of 8 splits in flight before the adds, added in split order.
    for (int z0 = 0; z0 < nz; z0 += 8) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = z0 + j < nz ? __ldcg(part + (z0 + j) * zstride) : 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (z0 + j < nz) sum += v[j];
      }
    }
    float* yp = p.y + tok * p.ldy + row;
    *yp = p.accumulate ? *yp + sum : sum;
  }
  if (tid == 0) p.counters[blockIdx.x] = 0;
}

// W widened to bf16: one thread per 16-byte chunk (kE inputs) of a row.
struct DequantParams {
  const uint8_t* w;
  int64_t ld_bytes;
  const void* scales;
  int64_t scale_ld;
  int64_t group;
  float global_scale;
  int64_t n, k;
  __nv_bfloat16* out;
  int64_t ld_out;
};

template <int kFmt>
__global__ void __launch_bounds__(256) GemvQuantDequantKernel(DequantParams p) {
  constexpr int kE = GqChunkElems(kFmt);
  const int64_t chunks = p.k / kE;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks * p.n) return;
  const int64_t r = i / chunks, c = i - r * chunks;
  const uint8_t* row = p.w + r * p.ld_bytes;
  const void* srow = static_cast<const uint8_t*>(p.scales) +
                     r * p.scale_ld * (kFmt == kGqNvfp4 ? 1 : 2);
  __nv_bfloat16* out = p.out + r * p.ld_out + c * kE;
#pragma unroll 4
  for (int j = 0; j < kE; ++j) {
    float v = GqDecode<kFmt>(row, srow, c * kE + j, p.group);
    if constexpr (kFmt == kGqNvfp4) v *= p.global_scale;
    out[j] = __float2bfloat16_rn(v);
  }
}

#endif  // __CUDACC__

}  // namespace glm::kernels::detail
