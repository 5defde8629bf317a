// Device code of per_head_narrow (per_head_narrow.h has the contract).
//
// Both kernels: CTAs of 8 warps, grid (tiles of one head, heads). Weights are read with 16-byte
// loads (a "chunk": 4 fp32, 8 bf16 or 16 e4m3 elements of one row; an fp8 chunk never straddles
// a 128-column scale block because 16 divides 128) and widened in registers: bf16 -> fp32 by a
// shift, e4m3 -> f16 (cvt, exact) -> fp32, times the element's block scale. x of one token tile
// (kMT tokens x in_dim) is staged in shared memory once per tile (zero-padded to a multiple of
// 16 columns); the weights are streamed once per tile.
//
// kCols (W_UV, PerHeadColsKernel): a warp owns kColsRows consecutive weight rows (outputs) of its
// head; lane l reads chunks l, l + 32, ... of each row (coalesced 512-byte warp reads per row).
// When in_dim fits one segment of 32 * kColsChunks chunks (GLM-5: 512 columns in bf16 and fp8) a
// lane's chunks are loaded into registers once, before x is staged, and reused by every token
// tile; otherwise they are reloaded per segment. x is staged plane by plane (PhnXPos: float4
// group g of every chunk in plane g), so that per (chunk, group, token) a warp reads 32
// consecutive float4s, conflict-free, applied to all of the warp's rows (one float4 read per row
// would be 4-way bank-conflicted and bind W_UV at 8 tokens by shared memory). Per token and row: a lane sums its chunks in column order, then a butterfly
// over the warp; the lane (t * kColsRows + r) % 32 writes y.
//
// kRows (W_UK, PerHeadRowsKernel): a warp is 4 row lanes x 8 column threads; the 8 threads of a
// row lane read 8 consecutive chunks of one weight row (128 contiguous bytes) and own those
// columns (outputs). The CTA's 8 warps are (8 / ksplit) column groups x ksplit row slices; row
// lane rl of slice s reads rows s * 4 + rl, + 4 * ksplit, ... (the contraction). Per token and
// column: a thread sums its rows in order, the 4 row lanes are summed by two xor shuffles, then
// the ksplit slices in slice order through shared memory. ksplit is picked on the host from the
// SM count (enough CTAs to cover the device twice).
// No atomics anywhere: the summation order is fixed by the launch shape, so results are
// bit-identical from launch to launch.
// Limits (checked by the launcher): 16-byte aligned weight rows (ldw * element size % 16 == 0);
// the last chunk of a row may extend past the columns used but not past ldw; in_dim <= 8192
// (a token tile of x must fit kPhnMaxXSmemBytes). Columns past in_dim (kCols) are masked in the
// weight as well as in x, so a row's padding is never multiplied.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/launch.cuh"
#include "kernels/load_util.cuh"
#include "kernels/per_head_narrow.h"

namespace glm::kernels::detail {

inline constexpr int kPhnWarps = 8;
inline constexpr int kPhnThreads = 32 * kPhnWarps;
inline constexpr int kColsRows = 4;    // kCols: weight rows per warp
inline constexpr int kColsChunks = 2;  // kCols: chunks per lane per row held in registers
inline constexpr int kRowsLanes = 4;   // kRows: row lanes per warp
inline constexpr int kRowsColThreads = 8;  // kRows: column threads per row lane
inline constexpr int kRowsUnroll = 4;  // kRows: rows per lane loaded before their FMAs
inline constexpr int64_t kPhnMaxXSmemBytes = 32 * 1024;

struct PerHeadNarrowParams {
  const float* x;
  int64_t x_row_stride, x_head_stride;
  const uint8_t* w;
  int64_t ldw_bytes;
  const float* ws;
  int64_t ws_ld;
  int64_t head_rows, row_begin;
  float* y;
  int64_t y_row_stride, y_head_stride;
  int num_tokens;
  int64_t in_dim, out_dim;
  int64_t in_pad;  // x tile row stride in shared memory: in_dim rounded up to 16
  int ksplit;      // kRows: row slices per CTA (1, 2, 4, 8)
  int beside;      // PerHeadNarrowArgs::beside_previous (PhnEnter / PhnExit)
};

// The kernels' grid-dependency entry and exit (launch.cuh). Normally PdlEnter: wait for the
// previous kernel, then let the next one launch. Beside the previous kernel
// (PerHeadNarrowArgs::beside_previous): let the next kernel launch at once and do not wait, since
// x was complete before the previous kernel could start (it waited for its own predecessor before
// letting this one launch) and that kernel touches neither x nor y; x is read from L2 (PhnStageX),
// never from an SM's L1. PhnExit then waits for the previous kernel before this grid may
// complete, so the next kernel's wait still covers both.
__device__ __forceinline__ void PhnEnter(const PerHeadNarrowParams& p) {
  if (p.beside) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  } else {
    PdlEnter();
  }
}
__device__ __forceinline__ void PhnExit(const PerHeadNarrowParams& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.beside) asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

template <PerHeadWeight W>
struct PhnTraits;
template <>
struct PhnTraits<PerHeadWeight::kF32> {
  static constexpr int kVec = 4;
  static constexpr int kBytes = 4;
};
template <>
struct PhnTraits<PerHeadWeight::kBF16> {
  static constexpr int kVec = 8;
  static constexpr int kBytes = 2;
};
template <>
struct PhnTraits<PerHeadWeight::kF8E4M3Block128> {
  static constexpr int kVec = 16;
  static constexpr int kBytes = 1;
};

// The fp8 block scale of weight row `row`, column `c` (1 for other dtypes).
template <PerHeadWeight W>
__device__ __forceinline__ float PhnScale(const PerHeadNarrowParams& p, int64_t row, int64_t c) {
  if constexpr (W == PerHeadWeight::kF8E4M3Block128) {
    return __ldg(p.ws + (row / 128) * p.ws_ld + c / 128);
  } else {
    return 1.0f;
  }
}

// The kVec weights of one 16-byte chunk, widened to fp32 (fp8: float(q) * scale).
template <PerHeadWeight W>
__device__ __forceinline__ void PhnWiden(const uint4& raw, float scale,
                                         float (&out)[PhnTraits<W>::kVec]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t word = Word4(raw, j);
    if constexpr (W == PerHeadWeight::kF32) {
      out[j] = __uint_as_float(word);
    } else if constexpr (W == PerHeadWeight::kBF16) {
      out[2 * j] = __uint_as_float(word << 16);
      out[2 * j + 1] = __uint_as_float(word & 0xffff0000u);
    } else {
      const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
      const __half2_raw hi =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
      const float2 a = __half22float2(__half2(lo));
      const float2 b = __half22float2(__half2(hi));
      out[4 * j] = a.x * scale;
      out[4 * j + 1] = a.y * scale;
      out[4 * j + 2] = b.x * scale;
      out[4 * j + 3] = b.y * scale;
    }
  }
}

// Position of x column k in a staged token row of the kCols kernel with kVec-element chunks:
// chunk q = k / kVec's float4 group g = (k % kVec) / 4 lives in plane g of in_pad / (kVec / 4)
// floats, at float4 q, so that the lanes of a warp (consecutive chunks) read one plane's
// consecutive float4s: conflict-free. kVec == 4 (fp32) is the plain layout; kVec 0: plain.
template <int kVec>
__device__ __forceinline__ int64_t PhnXPos(int64_t k, int64_t in_pad) {
  if constexpr (kVec <= 4) {
    return k;
  } else {
    return (k % kVec) / 4 * (in_pad / (kVec / 4)) + k / kVec * 4 + k % 4;
  }
}

// Stages x[t0 .. t0 + nt, h, :] into sx [nt][in_pad] (zeros past in_dim), each row in the
// PhnXPos<kVec> layout.
template <int kVec>
__device__ __forceinline__ void PhnStageX(const PerHeadNarrowParams& p, int64_t h, int t0, int nt,
                                          float* sx) {
  for (int t = 0; t < nt; ++t) {
    const float* xr = p.x + static_cast<int64_t>(t0 + t) * p.x_row_stride + h * p.x_head_stride;
    for (int64_t k = threadIdx.x; k < p.in_pad; k += kPhnThreads) {
      const float v = k >= p.in_dim ? 0.0f : p.beside ? __ldcg(xr + k) : __ldg(xr + k);
      sx[t * p.in_pad + PhnXPos<kVec>(k, p.in_pad)] = v;
    }
  }
}

// Opens the token tile at t0 (both kernels): waits until the previous tile's reads of shared
// memory (sx, and the kRows kernel's reduction buffer) are done, stages its x into sx (layout
// PhnXPos<kVec>) and syncs. Returns the tile's token count nt <= kMT.
template <int kMT, int kVec = 0>
__device__ __forceinline__ int PhnBeginTile(const PerHeadNarrowParams& p, int64_t h, int t0,
                                            float* sx) {
  const int nt = min(kMT, p.num_tokens - t0);
  __syncthreads();
  PhnStageX<kVec>(p, h, t0, nt, sx);
  __syncthreads();
  return nt;
}

// Elements 4g .. 4g + 3 of a 16-byte chunk widened to fp32 (the values PhnWiden gives them).
template <PerHeadWeight W>
__device__ __forceinline__ void PhnWidenGroup(const uint4& raw, float scale, int g,
                                              float (&out)[4]) {
  if constexpr (W == PerHeadWeight::kF32) {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __uint_as_float(Word4(raw, j));
  } else if constexpr (W == PerHeadWeight::kBF16) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t word = Word4(raw, 2 * g + j);
      out[2 * j] = __uint_as_float(word << 16);
      out[2 * j + 1] = __uint_as_float(word & 0xffff0000u);
    }
  } else {
    const uint32_t word = Word4(raw, g);
    const __half2_raw lo =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
    const __half2_raw hi =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo));
    const float2 b = __half22float2(__half2(hi));
    out[0] = a.x * scale;
    out[1] = a.y * scale;
    out[2] = b.x * scale;
    out[3] = b.y * scale;
  }
}

template <PerHeadWeight W, int kMT>
__global__ void __launch_bounds__(kPhnThreads) PerHeadColsKernel(PerHeadNarrowParams p) {
  using T = PhnTraits<W>;
  constexpr int kVec = T::kVec;
  extern __shared__ float4 phn_smem[];
  float* sx = reinterpret_cast<float*>(phn_smem);  // [kMT][in_pad]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = blockIdx.y;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kPhnWarps + warp) * kColsRows;
  const int64_t base = h * p.head_rows + p.row_begin;
  constexpr int64_t kSegCols = int64_t{32} * kVec * kColsChunks;
  const int64_t num_segs = (p.in_dim + kSegCols - 1) / kSegCols;

  uint4 wr[kColsRows][kColsChunks];
  float sc[kColsRows][kColsChunks];
  auto load_seg = [&](int64_t s) {
#pragma unroll
    for (int r = 0; r < kColsRows; ++r) {
#pragma unroll
      for (int kc = 0; kc < kColsChunks; ++kc) {
        const int64_t c = s * kSegCols + (int64_t{kc} * 32 + lane) * kVec;
        const int64_t j = j0 + r;
        if (j < p.out_dim && c < p.in_dim) {
          const int64_t row = base + j;
          wr[r][kc] = LoadStreaming16(p.w + row * p.ldw_bytes + c * T::kBytes);
          sc[r][kc] = PhnScale<W>(p, row, c);
        } else {
          wr[r][kc] = make_uint4(0, 0, 0, 0);
          sc[r][kc] = 0.0f;
        }
      }
    }
  };
  if (num_segs == 1) load_seg(0);  // in flight while x is staged
  // The weights are immutable: their loads above may overlap the previous kernel; x and y only
  // after it completed (launch.cuh), or beside it (PhnEnter).
  PhnEnter(p);

  for (int t0 = 0; t0 < p.num_tokens; t0 += kMT) {
    const int nt = PhnBeginTile<kMT, kVec>(p, h, t0, sx);
    float acc[kMT][kColsRows];
#pragma unroll
    for (int t = 0; t < kMT; ++t) {
#pragma unroll
      for (int r = 0; r < kColsRows; ++r) acc[t][r] = 0.0f;
    }
    for (int64_t s = 0; s < num_segs; ++s) {
      if (num_segs > 1) load_seg(s);
#pragma unroll
      for (int kc = 0; kc < kColsChunks; ++kc) {
        const int64_t q = s * 32 * kColsChunks + int64_t{kc} * 32 + lane;  // chunk of the row
        const int64_t c = q * kVec;
        if (c >= p.in_dim) continue;
        // Per float4 group of the chunk: its 4 weights of every row, then per token one
        // conflict-free float4 of x (PhnXPos) applied to all rows. Each (token, row) sum still
        // runs over the chunk's columns in order: the same FMAs in the same order as a row at a
        // time.
#pragma unroll
        for (int g = 0; g < kVec / 4; ++g) {
          float wf[kColsRows][4];
#pragma unroll
          for (int r = 0; r < kColsRows; ++r) {
            PhnWidenGroup<W>(wr[r][kc], sc[r][kc], g, wf[r]);
            if (c + kVec > p.in_dim) {  // the row's tail: padding is never multiplied
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                if (c + 4 * g + e >= p.in_dim) wf[r][e] = 0.0f;
              }
            }
          }
          const float* xg = sx + PhnXPos<kVec>(c + 4 * g, p.in_pad);
#pragma unroll
          for (int t = 0; t < kMT; ++t) {
            if (t < nt) {
              const float4 v = *reinterpret_cast<const float4*>(xg + t * p.in_pad);
#pragma unroll
              for (int r = 0; r < kColsRows; ++r) {
                acc[t][r] = fmaf(v.x, wf[r][0], acc[t][r]);
                acc[t][r] = fmaf(v.y, wf[r][1], acc[t][r]);
                acc[t][r] = fmaf(v.z, wf[r][2], acc[t][r]);
                acc[t][r] = fmaf(v.w, wf[r][3], acc[t][r]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kMT; ++t) {
#pragma unroll
      for (int r = 0; r < kColsRows; ++r) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          acc[t][r] += __shfl_xor_sync(0xffffffffu, acc[t][r], off);
        }
        const int64_t j = j0 + r;
        if (t < nt && j < p.out_dim && lane == (t * kColsRows + r) % 32) {
          p.y[static_cast<int64_t>(t0 + t) * p.y_row_stride + h * p.y_head_stride + j] = acc[t][r];
        }
      }
    }
  }
  PhnExit(p);
}

template <PerHeadWeight W, int kMT>
__global__ void __launch_bounds__(kPhnThreads) PerHeadRowsKernel(PerHeadNarrowParams p) {
  using T = PhnTraits<W>;
  constexpr int kVec = T::kVec;
  extern __shared__ float4 phn_smem[];
  const int ks = p.ksplit;
  const int cta_cols = (kPhnWarps / ks) * kRowsColThreads * kVec;
  float* sx = reinterpret_cast<float*>(phn_smem);  // [kMT][in_pad]
  float* red = sx + kMT * p.in_pad;                // [ksplit][kMT][cta_cols]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slice = warp % ks, group = warp / ks;
  const int rl = lane / kRowsColThreads, cl = lane % kRowsColThreads;
  const int64_t h = blockIdx.y;
  const int col_local = (group * kRowsColThreads + cl) * kVec;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * cta_cols + col_local;
  const int64_t base = h * p.head_rows + p.row_begin;
  const int64_t d0 = static_cast<int64_t>(slice) * kRowsLanes + rl;
  const int64_t d_step = static_cast<int64_t>(ks) * kRowsLanes;
  const bool active = c < p.out_dim;
  const uint8_t* wcol = p.w + c * T::kBytes;
  // The weights are immutable: this thread's weight chunks go into L2 while the previous kernel
  // finishes (prefetches change no value); x and y only after it completed (launch.cuh).
  if (active) {
    for (int64_t d = d0; d < p.in_dim; d += d_step) {
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(wcol + (base + d) * p.ldw_bytes));
    }
  }
  PhnEnter(p);

  for (int t0 = 0; t0 < p.num_tokens; t0 += kMT) {
    const int nt = PhnBeginTile<kMT>(p, h, t0, sx);
    float acc[kMT][kVec];
#pragma unroll
    for (int t = 0; t < kMT; ++t) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[t][e] = 0.0f;
    }
    if (active) {
      for (int64_t d = d0; d < p.in_dim; d += kRowsUnroll * d_step) {
        uint4 raw[kRowsUnroll];
        float sc[kRowsUnroll];
#pragma unroll
        for (int u = 0; u < kRowsUnroll; ++u) {
          const int64_t du = d + u * d_step;
          if (du < p.in_dim) {
            const int64_t row = base + du;
            raw[u] = LoadStreaming16(wcol + row * p.ldw_bytes);
            sc[u] = PhnScale<W>(p, row, c);
          } else {
            raw[u] = make_uint4(0, 0, 0, 0);
            sc[u] = 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < kRowsUnroll; ++u) {
          const int64_t du = d + u * d_step;
          if (du >= p.in_dim) break;
          float wf[kVec];
          PhnWiden<W>(raw[u], sc[u], wf);
#pragma unroll
          for (int t = 0; t < kMT; ++t) {
            if (t < nt) {
              const float xv = sx[t * p.in_pad + du];
#pragma unroll
              for (int e = 0; e < kVec; ++e) acc[t][e] = fmaf(xv, wf[e], acc[t][e]);
            }
          }
        }
      }
    }
    // Row lanes rl = 0..3 are lanes cl + 8 rl: two xor shuffles sum them (every lane gets it).
#pragma unroll
    for (int t = 0; t < kMT; ++t) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        acc[t][e] += __shfl_xor_sync(0xffffffffu, acc[t][e], 8);
        acc[t][e] += __shfl_xor_sync(0xffffffffu, acc[t][e], 16);
      }
    }
    if (rl == 0) {
#pragma unroll
      for (int t = 0; t < kMT; ++t) {
        if (t < nt) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            red[(slice * kMT + t) * cta_cols + col_local + e] = acc[t][e];
          }
        }
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nt * cta_cols; i += kPhnThreads) {
      const int t = i / cta_cols, cc = i % cta_cols;
      const int64_t col = static_cast<int64_t>(blockIdx.x) * cta_cols + cc;
      if (col >= p.out_dim) continue;
      float s = 0.0f;
      for (int sl = 0; sl < ks; ++sl) s += red[(sl * kMT + t) * cta_cols + cc];
      p.y[static_cast<int64_t>(t0 + t) * p.y_row_stride + h * p.y_head_stride + col] = s;
    }
  }
  PhnExit(p);
}

// PerHeadWidenF32: one element per thread (grid-stride), index i over [heads][out][in] with the
// weight's column index fastest in the source (coalesced reads): kCols: k fastest; kRows: n.
template <PerHeadWeight W>
__global__ void PerHeadWidenKernel(PerHeadNarrowParams p, bool contract_rows, int64_t heads,
                                   float* dst) {
  PdlEnter();
  const int64_t total = heads * p.out_dim * p.in_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t h, n, k, row, col;
    if (contract_rows) {  // i = (h * in + k) * out + n: source row base + k, column n
      n = i % p.out_dim;
      k = (i / p.out_dim) % p.in_dim;
      h = i / (p.out_dim * p.in_dim);
      row = h * p.head_rows + p.row_begin + k;
      col = n;
    } else {  // i = (h * out + n) * in + k: source row base + n, column k
      k = i % p.in_dim;
      n = (i / p.in_dim) % p.out_dim;
      h = i / (p.out_dim * p.in_dim);
      row = h * p.head_rows + p.row_begin + n;
      col = k;
    }
    const uint8_t* src = p.w + row * p.ldw_bytes + col * PhnTraits<W>::kBytes;
    float v;
    if constexpr (W == PerHeadWeight::kF32) {
      v = __ldg(reinterpret_cast<const float*>(src));
    } else if constexpr (W == PerHeadWeight::kBF16) {
      v = __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(src)))
                          << 16);
    } else {
      const __half_raw hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(__ldg(src)),
                                                    __NV_E4M3);
      v = __half2float(__half(hr)) * PhnScale<W>(p, row, col);
    }
    dst[(h * p.out_dim + n) * p.in_dim + k] = v;
  }
}

}  // namespace glm::kernels::detail
