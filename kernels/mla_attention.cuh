// MLA attention device code (mla_attention.h has the contract; mla_attention.cu the launch
// rule). fp32 queries and outputs; keys / values fp32 views or the fp8 latent cache rows of
// kv_fp8_layout.h.
//
// Split kernel (AttentionSplitKernel<G, CPT, kFp8, kStage = false>): flash-decoding. One CTA owns
// (query row t, a group of G heads, one split of the row's selected positions); it walks its
// split in tiles of kTile keys with an online softmax (running max m, running sum l, rescaled
// accumulators) and either writes out[t, h] directly (one split) or a partial (acc, m, l) that
// AttentionCombineKernel merges (several splits, so that a decode step with few rows still
// fills the GPU).
// Tiling: 256 threads = 8 warps. Scores: warp w takes keys w, w+8, ... of the tile, lanes stride
// the head dim in float4s, each lane dots one key chunk with the G queries held in shared memory;
// a reduce-scatter over the warp (16 shuffles for G = 16) leaves one head's score per lane pair.
// P.V: thread i owns value columns i, i+256, ... for all G heads (G x CPT register accumulators).
// G = 16 when k_a, k_b and v all broadcast (head_stride 0: MLA absorbed decode, k = v = c_kv):
// a key row is read once for 16 heads. Otherwise G = 1 (per-head keys, expanded prefill).
// fp8 latent cache (absorbed form): the key / value loads read e4m3 c_kv (4 bytes per lane per
// float4, times the 128-dim group's scale) and bf16 k_pe from the 656-byte rows; arithmetic stays
// fp32.
// Staged kernel (kStage = true, G = 16): the CTA copies each tile's T key rows (fp32 k_a | k_b,
// or the fp8 656-byte rows as stored) into shared memory with cp.async (all 16-byte chunks of the
// tile in flight at once, rows < 0 zero-filled), then scores and P.V read shared memory (V too
// when v aliases k_a: the absorbed form). T = 32 keys (16 when the device's shared memory is
// smaller). AttentionCombineWideKernel merges its partials with float4 loads, 4 warps over the
// splits (8 loads in flight per thread) and a fixed summation order (deterministic). Same
// arithmetic per key as the split kernel.
// Tensor-core kernel (AttentionTcKernel<MT>): see the comment above it.
// Combine: per-split weights e^(m_s - M) / L computed once per (row, head) in shared memory.
// Limits: da, db, dv multiples of 4 and every view 16-byte aligned with strides multiple of 4
// (float4 loads); dv <= 1024. Positions outside [0, num_keys(t)) are skipped; a row with no
// position gets zeros.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/kv_fp8_layout.h"
#include "kernels/launch.cuh"

namespace glm::kernels::mla_attention {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;       // keys per tile
constexpr int kMaxSplits = 64;  // partials per (row, head), split kernel
constexpr int kMaxSplitsWide = 128;  // partials per (row, head), staged path
constexpr int kCombineThreads = 128;

// 16-byte global -> shared copy without registers (cp.async, sm_80+); valid == false fills zeros.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  *reinterpret_cast<float4*>(dst) =
      valid ? *reinterpret_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}

__device__ __forceinline__ void CpAsyncWaitAll() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

struct Params {
  const float* q_a;
  int64_t q_a_rs, q_a_hs;
  const float* q_b;
  int64_t q_b_rs, q_b_hs;
  const float* k_a;
  int64_t k_a_rs, k_a_hs;
  const float* k_b;
  int64_t k_b_rs, k_b_hs;
  const float* v;
  int64_t v_rs, v_hs;
  float* out;
  int64_t out_rs, out_hs;
  const int32_t* slots;
  const int32_t* row_offset;
  const int32_t* row_num_keys;
  const int32_t* indices;
  int32_t index_width;
  int32_t num_heads, da, db, dv;
  float scale;
  int32_t head_groups, num_splits, split_len;
  int32_t tile;       // staged path: keys per tile (multiple of 16)
  int32_t v_staged;   // staged path: v is read from the staged k_a rows (v aliases k_a, or fp8)
  float* part_acc;  // [rows, heads, splits, dv]
  float* part_ml;   // [rows, heads, splits, 2]
  // fp8 latent cache (MlaAttentionArgs::latent_fp8; kv_fp8_layout.h): key row r at kv8 + r * kv8_rs
  // bytes: da e4m3 c_kv, fp32 scales at kv8_scale_off, db bf16 k_pe at kv8_rope_off.
  const uint8_t* kv8;
  int64_t kv8_rs;
  int32_t kv8_scale_off, kv8_rope_off;
};

// c_kv dims 4 d4 .. 4 d4 + 3 of an fp8 latent row, dequantized (exact).
__device__ __forceinline__ float4 LoadC4(const uint8_t* row, const Params& p, int d4) {
  __nv_fp8x4_e4m3 q;
  q.__x = *reinterpret_cast<const __nv_fp8x4_storage_t*>(row + 4 * d4);
  const float4 f = static_cast<float4>(q);
  const float s = reinterpret_cast<const float*>(row + p.kv8_scale_off)[d4 >> 5];
  return make_float4(f.x * s, f.y * s, f.z * s, f.w * s);
}

// k_pe dims 4 d4 .. 4 d4 + 3 of an fp8 latent row (bf16, two 4-byte loads).
__device__ __forceinline__ float4 LoadPe4(const uint8_t* row, const Params& p, int d4) {
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(row + p.kv8_rope_off) + 2 * d4;
  const float2 lo = __bfloat1622float2(b[0]), hi = __bfloat1622float2(b[1]);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// c_kv dim `col` of an fp8 latent row (the value vector of the absorbed form).
__device__ __forceinline__ float LoadC1(const uint8_t* row, const Params& p, int col) {
  __nv_fp8_e4m3 q;
  q.__x = row[col];
  return static_cast<float>(q) * reinterpret_cast<const float*>(row + p.kv8_scale_off)[col >> 7];
}

__device__ __forceinline__ float Dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Sums vals[g] over the warp. On return, lanes whose low (5 - log2 G) bits are zero hold the
// total of head g = lane >> (5 - log2 G) in vals[0].
template <int G>
__device__ __forceinline__ void WarpReduceScatter(float (&vals)[G], int lane) {
  int offset = 16;
#pragma unroll
  for (int c = G; c > 1; c /= 2) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < c / 2; ++i) {
      const float send = upper ? vals[i] : vals[i + c / 2];
      const float keep = upper ? vals[i + c / 2] : vals[i];
      vals[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
    offset /= 2;
  }
  for (; offset > 0; offset /= 2) vals[0] += __shfl_xor_sync(0xffffffffu, vals[0], offset);
}

template <int G>
constexpr int HeadShift() {
  return G == 1 ? 5 : G == 2 ? 4 : G == 4 ? 3 : G == 8 ? 2 : G == 16 ? 1 : 0;
}

// grid: rows * head_groups * num_splits CTAs; block kThreads; dynamic smem SmemBytes(G, da+db)
// (split) or StagedSmemBytes (kStage: tiles of p.tile keys staged in shared memory).
template <int G, int CPT, bool kFp8, bool kStage>
__global__ void __launch_bounds__(kThreads) AttentionSplitKernel(Params p) {
  PdlEnter();
  extern __shared__ __align__(16) float smem[];
  const int dq = p.da + p.db;
  const int tile_n = kStage ? p.tile : kTile;
  // Staged key row: dq floats (k_a | k_b) or the fp8 cache row's kv8_rs bytes as stored.
  const int kv_row_bytes = kFp8 ? static_cast<int>(p.kv8_rs) : 4 * dq;
  float4* q_s = reinterpret_cast<float4*>(smem);  // [G][dq / 4]
  uint8_t* kv_s = reinterpret_cast<uint8_t*>(smem + G * dq);  // staged: [tile_n][kv_row_bytes]
  float* s_s = kStage ? reinterpret_cast<float*>(kv_s + tile_n * kv_row_bytes)
                      : smem + G * dq;            // [tile_n][G] scores, then probabilities
  int* row_s = reinterpret_cast<int*>(s_s + tile_n * G);  // [tile_n] key row or -1
  float* m_s = reinterpret_cast<float*>(row_s + tile_n);  // [G]
  float* l_s = m_s + G;                                  // [G]
  float* corr_s = l_s + G;                               // [G]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t bid = blockIdx.x;
  const int split = static_cast<int>(bid % p.num_splits);
  const int hg = static_cast<int>((bid / p.num_splits) % p.head_groups);
  const int64_t t = bid / (int64_t{p.num_splits} * p.head_groups);
  const int h0 = hg * G;

  // Queries of the group's heads (zeros for heads past num_heads).
  const int dq4 = dq / 4, da4 = p.da / 4, db4 = p.db / 4;
  for (int i = tid; i < G * dq4; i += kThreads) {
    const int g = i / dq4, d4 = i % dq4, h = h0 + g;
    if constexpr (kStage) {
      // All of the CTA's query loads in flight at once (waited for with the first tile).
      const int hc = min(h, p.num_heads - 1);
      const float* src = d4 < da4 ? p.q_a + t * p.q_a_rs + hc * p.q_a_hs + 4 * d4
                                  : p.q_b + t * p.q_b_rs + hc * p.q_b_hs + 4 * (d4 - da4);
      CpAsync16(q_s + i, src, h < p.num_heads);
    } else {
      float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
      if (h < p.num_heads) {
        val = d4 < da4
                  ? reinterpret_cast<const float4*>(p.q_a + t * p.q_a_rs + h * p.q_a_hs)[d4]
                  : reinterpret_cast<const float4*>(p.q_b + t * p.q_b_rs + h * p.q_b_hs)[d4 - da4];
      }
      q_s[i] = val;
    }
  }
  if (tid < G) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }

  const int num_keys = p.row_num_keys[t];
  const int n_pos = p.indices != nullptr ? p.index_width : num_keys;
  const int begin = split * p.split_len;
  const int end = min(n_pos, begin + p.split_len);
  const int32_t* slots = p.slots + p.row_offset[t];
  // G > 1 only with broadcast keys (head strides 0), so h0 * stride is the group's key head.
  const float* k_a = p.k_a + h0 * p.k_a_hs;
  const float* k_b = p.k_b + h0 * p.k_b_hs;
  const float* v = p.v + h0 * p.v_hs;

  float acc[G][CPT];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int c = 0; c < CPT; ++c) acc[g][c] = 0.f;

  for (int tile = begin; tile < end; tile += tile_n) {
    __syncthreads();  // previous tile's row_s / s_s / kv_s fully consumed (and q_s, m_s written)
    if (tid < tile_n) {
      const int i = tile + tid;
      int r = -1;
      if (i < end) {
        const int pos = p.indices != nullptr ? p.indices[t * p.index_width + i] : i;
        if (pos >= 0 && pos < num_keys) r = slots[pos];
      }
      row_s[tid] = r;
    }
    __syncthreads();
    if constexpr (kStage) {
      // The tile's key rows into shared memory, every 16-byte chunk in flight at once.
      const int chunks = kv_row_bytes / 16;
      for (int i = tid; i < tile_n * chunks; i += kThreads) {
        const int k = i / chunks, c = i - k * chunks;
        const int r = row_s[k];
        const int64_t rr = max(r, 0);
        const void* src;
        if constexpr (kFp8) {
          src = p.kv8 + rr * p.kv8_rs + 16 * c;
        } else {
          src = c < da4 ? static_cast<const void*>(k_a + rr * p.k_a_rs + 4 * c)
                        : static_cast<const void*>(k_b + rr * p.k_b_rs + 4 * (c - da4));
        }
        CpAsync16(kv_s + k * kv_row_bytes + 16 * c, src, r >= 0);
      }
      CpAsyncWaitAll();
      __syncthreads();
    }

    // Scores of the tile's keys: warp w takes keys w + 16i and w + 16i + 8 together, so two
    // keys' loads are in flight per lane and each shared query float4 serves both.
    for (int kt = warp; kt < tile_n; kt += 2 * kWarps) {
      const int r0 = row_s[kt], r1 = row_s[kt + kWarps];
      float part0[G], part1[G];
#pragma unroll
      for (int g = 0; g < G; ++g) part0[g] = part1[g] = 0.f;
      const float4* ka0;
      const float4* ka1;
      const float4* kb0;
      const float4* kb1;
      const uint8_t* row0;
      const uint8_t* row1;
      if constexpr (kStage) {
        const uint8_t* s0 = kv_s + kt * kv_row_bytes;
        const uint8_t* s1 = kv_s + (kt + kWarps) * kv_row_bytes;
        row0 = s0, row1 = s1;
        ka0 = reinterpret_cast<const float4*>(s0);
        ka1 = reinterpret_cast<const float4*>(s1);
        kb0 = ka0 + da4, kb1 = ka1 + da4;
      } else {
        ka0 = reinterpret_cast<const float4*>(k_a + max(r0, 0) * p.k_a_rs);
        ka1 = reinterpret_cast<const float4*>(k_a + max(r1, 0) * p.k_a_rs);
        row0 = p.kv8 + max(r0, 0) * p.kv8_rs;
        row1 = p.kv8 + max(r1, 0) * p.kv8_rs;
      }
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int d4 = lane; d4 < da4; d4 += 32) {
        float4 kv0, kv1;
        if constexpr (kFp8) {
          kv0 = r0 >= 0 ? LoadC4(row0, p, d4) : zero;
          kv1 = r1 >= 0 ? LoadC4(row1, p, d4) : zero;
        } else {
          kv0 = r0 >= 0 ? ka0[d4] : zero;
          kv1 = r1 >= 0 ? ka1[d4] : zero;
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float4 qv = q_s[g * dq4 + d4];
          part0[g] += Dot4(qv, kv0);
          part1[g] += Dot4(qv, kv1);
        }
      }
      if constexpr (!kStage) {  // formed here: not live across the c_kv loop
        kb0 = reinterpret_cast<const float4*>(k_b + max(r0, 0) * p.k_b_rs);
        kb1 = reinterpret_cast<const float4*>(k_b + max(r1, 0) * p.k_b_rs);
      }
      for (int d4 = lane; d4 < db4; d4 += 32) {
        float4 kv0, kv1;
        if constexpr (kFp8) {
          kv0 = r0 >= 0 ? LoadPe4(row0, p, d4) : zero;
          kv1 = r1 >= 0 ? LoadPe4(row1, p, d4) : zero;
        } else {
          kv0 = r0 >= 0 ? kb0[d4] : zero;
          kv1 = r1 >= 0 ? kb1[d4] : zero;
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float4 qv = q_s[g * dq4 + da4 + d4];
          part0[g] += Dot4(qv, kv0);
          part1[g] += Dot4(qv, kv1);
        }
      }
      WarpReduceScatter<G>(part0, lane);
      WarpReduceScatter<G>(part1, lane);
      constexpr int kShift = HeadShift<G>();
      if ((lane & ((1 << kShift) - 1)) == 0) {
        const int g = lane >> kShift;
        s_s[kt * G + g] = r0 >= 0 ? part0[0] * p.scale : -INFINITY;
        s_s[(kt + kWarps) * G + g] = r1 >= 0 ? part1[0] * p.scale : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax update, warp w owns heads w, w+8, ...
    for (int g = warp; g < G; g += kWarps) {
      float mx = -INFINITY;
      for (int kt = lane; kt < tile_n; kt += 32) mx = fmaxf(mx, s_s[kt * G + g]);
#pragma unroll
      for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int kt = lane; kt < tile_n; kt += 32) {
        const float s = s_s[kt * G + g];
        const float e = s == -INFINITY ? 0.f : expf(s - m_new);
        s_s[kt * G + g] = e;
        sum += e;
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();  // every lane has read m_s[g] before lane 0 rewrites it
      if (lane == 0) {
        const float corr = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
        corr_s[g] = corr;
        l_s[g] = l_s[g] * corr + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();

    // acc = acc * corr + P . V over the tile.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float corr = corr_s[g];
#pragma unroll
      for (int c = 0; c < CPT; ++c) acc[g][c] *= corr;
    }
    // Batches of kBatch keys: all value loads of a batch are issued before the FMAs.
    constexpr int kBatch = 8;
    for (int kt0 = 0; kt0 < tile_n; kt0 += kBatch) {
      float vv[kBatch][CPT];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = row_s[kt0 + u];
        const bool staged = kStage && (kFp8 || p.v_staged != 0);
        const float* vr = staged ? reinterpret_cast<const float*>(kv_s + (kt0 + u) * kv_row_bytes)
                                 : v + max(r, 0) * p.v_rs;
        const uint8_t* row =
            kStage ? kv_s + (kt0 + u) * kv_row_bytes : p.kv8 + max(r, 0) * p.kv8_rs;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
          const int col = tid + c * kThreads;
          if constexpr (kFp8) {
            vv[u][c] = r >= 0 && col < p.dv ? LoadC1(row, p, col) : 0.f;
          } else {
            vv[u][c] = r >= 0 && col < p.dv ? vr[col] : 0.f;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int kt = kt0 + u;
        float pr[G];
        if constexpr (G % 4 == 0) {
#pragma unroll
          for (int g4 = 0; g4 < G / 4; ++g4) {
            const float4 x = reinterpret_cast<const float4*>(s_s + kt * G)[g4];
            pr[4 * g4] = x.x;
            pr[4 * g4 + 1] = x.y;
            pr[4 * g4 + 2] = x.z;
            pr[4 * g4 + 3] = x.w;
          }
        } else {
#pragma unroll
          for (int g = 0; g < G; ++g) pr[g] = s_s[kt * G + g];
        }
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int c = 0; c < CPT; ++c) acc[g][c] += pr[g] * vv[u][c];
      }
    }
  }
  if constexpr (kStage) CpAsyncWaitAll();  // a split without keys still issued its query copies
  __syncthreads();

#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int h = h0 + g;
    if (h >= p.num_heads) break;
    if (p.num_splits == 1) {
      const float l = l_s[g];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      float* o = p.out + t * p.out_rs + h * p.out_hs;
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const int col = tid + c * kThreads;
        if (col < p.dv) o[col] = acc[g][c] * inv;
      }
    } else {
      const int64_t part = (t * p.num_heads + h) * p.num_splits + split;
      float* o = p.part_acc + part * p.dv;
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const int col = tid + c * kThreads;
        if (col < p.dv) o[col] = acc[g][c];
      }
      if (tid == 0) {
        p.part_ml[2 * part] = m_s[g];
        p.part_ml[2 * part + 1] = l_s[g];
      }
    }
  }
}

// One warp (lane = 0..31) turns the splits' (m_s, l_s) pairs `ml` into the combine weights
// w_s = e^(m_s - M) / L, M = max m_s, L = sum l_s e^(m_s - M) (0 where m_s = -inf or L = 0).
__device__ __forceinline__ void SplitWeights(const float* ml, int num_splits, int lane,
                                             float* w_s) {
  float m = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) m = fmaxf(m, ml[2 * s]);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float l = 0.f;
  for (int s = lane; s < num_splits; s += 32) {
    const float ms = ml[2 * s];
    const float e = ms == -INFINITY ? 0.f : expf(ms - m);
    w_s[s] = e;
    l += ml[2 * s + 1] * e;
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) l += __shfl_xor_sync(0xffffffffu, l, o);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int s = lane; s < num_splits; s += 32) w_s[s] *= inv;
}

// Merges the splits of one (row, head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// grid: rows * heads; block kThreads over dv. Warp 0 turns the splits' (m, l) into weights
// w_s = e^(m_s - M) / L in shared memory once; then each column is a plain weighted sum (no
// exponential per element), summed in split order (deterministic).
__global__ void __launch_bounds__(kThreads) AttentionCombineKernel(Params p) {
  PdlEnter();
  __shared__ float w_s[kMaxSplits];
  const int64_t rh = blockIdx.x;
  const int64_t t = rh / p.num_heads;
  const int h = static_cast<int>(rh % p.num_heads);
  const float* ml = p.part_ml + rh * p.num_splits * 2;
  if (threadIdx.x < 32) SplitWeights(ml, p.num_splits, threadIdx.x, w_s);
  __syncthreads();
  const float* acc = p.part_acc + rh * p.num_splits * p.dv;
  float* o = p.out + t * p.out_rs + h * p.out_hs;
  for (int col = threadIdx.x; col < p.dv; col += kThreads) {
    float sum = 0.f;
    for (int s = 0; s < p.num_splits; ++s) sum += acc[s * p.dv + col] * w_s[s];
    o[col] = sum;
  }
}

// Merges the splits of one (row, head) like AttentionCombineKernel, for many splits and few rows.
// grid: (rows * heads, ceil(dv / 128)); block kCombineThreads = 4 warps. Lane = one float4 of
// the CTA's 128 columns; warp w sums splits w, w + 4, ... (8 loads in flight), then warp 0 adds
// the other warps' sums in warp order: a fixed order, deterministic.
__global__ void __launch_bounds__(kCombineThreads) AttentionCombineWideKernel(Params p) {
  PdlEnter();
  __shared__ float w_s[kMaxSplitsWide];
  __shared__ float4 sum_s[kCombineThreads / 32 - 1][32];
  const int64_t rh = blockIdx.x;
  const int64_t t = rh / p.num_heads;
  const int h = static_cast<int>(rh % p.num_heads);
  const int S = p.num_splits;
  const float* ml = p.part_ml + rh * S * 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarpsC = kCombineThreads / 32;
  constexpr int kUnroll = 8;
  const int dv4 = p.dv / 4;
  const int c4 = blockIdx.y * 32 + lane;
  const float4* acc = reinterpret_cast<const float4*>(p.part_acc + rh * S * p.dv) + c4;
  float4 x[kUnroll];
  auto load = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int s = s0 + u * kWarpsC;
      x[u] = s < S ? acc[int64_t{s} * dv4] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  // The first batch of partials does not depend on the weights: its loads are in flight while
  // warp 0 derives them (one L2 round trip fewer on the decode step's chain).
  if (c4 < dv4) load(warp);
  if (warp == 0) SplitWeights(ml, S, lane, w_s);
  __syncthreads();
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c4 < dv4) {
    for (int s0 = warp; s0 < S; s0 += kWarpsC * kUnroll) {
      if (s0 != warp) load(s0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int s = s0 + u * kWarpsC;
        if (s < S) {
          const float w = w_s[s];
          sum.x += x[u].x * w;
          sum.y += x[u].y * w;
          sum.z += x[u].z * w;
          sum.w += x[u].w * w;
        }
      }
    }
  }
  if (warp > 0) sum_s[warp - 1][lane] = sum;
  __syncthreads();
  if (warp == 0 && c4 < dv4) {
#pragma unroll
    for (int w = 0; w < kWarpsC - 1; ++w) {
      const float4 o = sum_s[w][lane];
      sum.x += o.x;
      sum.y += o.y;
      sum.z += o.z;
      sum.w += o.w;
    }
    reinterpret_cast<float4*>(p.out + t * p.out_rs + h * p.out_hs)[c4] = sum;
  }
}

// ---- Tensor-core path: fp8 latent cache, absorbed form, GLM-5 widths -------------------------
// A CTA owns (row t, a group of 16 MT heads, one split of the row's selected positions) and walks
// its split in tiles of kTcTile keys: the tile's 656-byte fp8 rows are copied to shared memory
// with cp.async (the next tile's copy overlaps this tile's math), dequantized to bf16 (exact:
// e4m3 x power-of-two scale; k_pe is bf16 already), then S = Q K^T and O += P V run on mma.sync
// m16n8k16 (bf16 in, fp32 accumulate; sm_80+, no wgmma / tcgen05). Queries and probabilities
// are split bf16 pairs (x = hi + lo, hi = bf16(x), lo = bf16(x - hi): ~2^-17 relative), two mmas
// each, so results stay within ~1e-5 relative of the fp32 path. Online softmax in fp32 with the
// same masking (positions outside [0, num_keys) and -1 indices) and the same partial (acc, m, l)
// format, merged by AttentionCombineWideKernel.
// Warps: score phase, warp w takes m-tile w / kWpm and kNts n-tiles of 8 keys (row max / sum
// exchanged through shared memory in warp order: deterministic); P.V phase, warp w owns value
// columns [w kCols, (w + 1) kCols) for all 16 MT heads (acc in registers).
// Shared memory (bytes; MT = 4, H200): Q hi/lo 149504, key tile bf16 37376, raw tile 20992, P
// hi/lo 10240, softmax exchange ~1.5K: ~219 KiB; MT = 1 (16 heads, ~97 KiB) fits a 99 KiB device.
constexpr int kTcKvr = 512, kTcRope = 64, kTcDq = kTcKvr + kTcRope;
constexpr int kTcTile = 32;          // keys per tile
constexpr int kTcLd = kTcDq + 8;     // bf16 row stride (1168 bytes: ldmatrix conflict-free)
constexpr int kTcPLd = kTcTile + 8;  // P row stride (80 bytes)
constexpr int kTcRawRow = static_cast<int>(kv_fp8::LatentRowBytes(kTcKvr, kTcRope));  // 656
constexpr int kTcScaleOff = static_cast<int>(kv_fp8::LatentScaleOffset(kTcKvr));
constexpr int kTcRopeOff = static_cast<int>(kv_fp8::LatentRopeOffset(kTcKvr));
static_assert(kTcRawRow % 16 == 0 && kTcRopeOff % 16 == 0, "fp8 latent row not 16-byte chunked");
static_assert(kTcDq % 32 == 0 && kTcKvr % 128 == 0, "score k-loop / P.V column split");

template <int MT>
struct TcCfg {
  static constexpr int kHeads = 16 * MT;
  static constexpr int kWarps = MT == 1 ? 4 : 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWpm = kWarps / MT;         // score-phase warps per m-tile
  static constexpr int kNts = kTcTile / 8 / kWpm;  // score n-tiles (8 keys) per warp
  static constexpr int kCols = kTcKvr / kWarps;    // P.V value columns per warp
  static constexpr int kNtv = kCols / 8;
  static constexpr int kSmem = 2 * kHeads * kTcLd * 2 + kTcTile * kTcLd * 2 +
                               kTcTile * kTcRawRow + 2 * kHeads * kTcPLd * 2 +
                               (2 * kHeads * kWpm + 3 * kHeads) * 4 + 3 * kTcTile * 4;
  static_assert(kNts == 1 || kNts == 2, "score tiling");
  static_assert(kNtv % 2 == 0, "P.V tiling");
};

__device__ __forceinline__ unsigned SmemAddr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
#else
  __trap();
#endif
}

__device__ __forceinline__ void LdMatrixX2(uint32_t (&r)[2], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SmemAddr(p)));
#else
  __trap();
#endif
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
#else
  __trap();
#endif
}

// d += a (16 x 16, row) * b (16 x 8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

__device__ __forceinline__ uint32_t Bf16Bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// (x0, x1) as split bf16 pairs: hi = bf16(x), lo = bf16(x - hi).
__device__ __forceinline__ void SplitBf16(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  *hi = Bf16Bits(h);
  *lo = Bf16Bits(__floats2bfloat162_rn(x0 - hf.x, x1 - hf.y));
}

// grid: rows * head_groups * num_splits CTAs (head_groups = heads / (16 MT)); block
// TcCfg<MT>::kThreads; dynamic smem TcCfg<MT>::kSmem.
template <int MT>
__global__ void __launch_bounds__(TcCfg<MT>::kThreads) AttentionTcKernel(Params p) {
  PdlEnter();
  using C = TcCfg<MT>;
  extern __shared__ __align__(16) uint8_t smem_tc[];
  __nv_bfloat16* q_hi = reinterpret_cast<__nv_bfloat16*>(smem_tc);  // [kHeads][kTcLd]
  __nv_bfloat16* q_lo = q_hi + C::kHeads * kTcLd;                     // [kHeads][kTcLd]
  __nv_bfloat16* k_s = q_lo + C::kHeads * kTcLd;                      // [kTcTile][kTcLd]
  uint8_t* raw_s = reinterpret_cast<uint8_t*>(k_s + kTcTile * kTcLd);  // [kTcTile][656]
  __nv_bfloat16* p_hi = reinterpret_cast<__nv_bfloat16*>(raw_s + kTcTile * kTcRawRow);
  __nv_bfloat16* p_lo = p_hi + C::kHeads * kTcPLd;                     // [kHeads][kTcPLd]
  float* red_max = reinterpret_cast<float*>(p_lo + C::kHeads * kTcPLd);  // [kHeads][kWpm]
  float* red_sum = red_max + C::kHeads * C::kWpm;                        // [kHeads][kWpm]
  float* corr_s = red_sum + C::kHeads * C::kWpm;                         // [kHeads]
  float* m_fin = corr_s + C::kHeads;                                     // [kHeads]
  float* l_fin = m_fin + C::kHeads;                                      // [kHeads]
  int* rows_s = reinterpret_cast<int*>(l_fin + C::kHeads);  // [3][kTcTile] key rows or -1

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t bid = blockIdx.x;
  const int split = static_cast<int>(bid % p.num_splits);
  const int hg = static_cast<int>((bid / p.num_splits) % p.head_groups);
  const int64_t t = bid / (int64_t{p.num_splits} * p.head_groups);
  const int h0 = hg * C::kHeads;
  const int num_keys = p.row_num_keys[t];
  const int n_pos = p.indices != nullptr ? p.index_width : num_keys;
  const int begin = split * p.split_len;
  const int end = min(n_pos, begin + p.split_len);
  const int num_tiles = end > begin ? (end - begin + kTcTile - 1) / kTcTile : 0;
  const int32_t* slots = p.slots + p.row_offset[t];
  const int32_t* idx = p.indices != nullptr ? p.indices + t * p.index_width : nullptr;
  auto key_row = [&](int i) -> int {
    if (i >= end) return -1;
    const int pos = idx != nullptr ? idx[i] : i;
    return pos >= 0 && pos < num_keys ? slots[pos] : -1;
  };
  // The tile's raw rows into raw_s, every 16-byte chunk in flight at once (rows < 0: zeros).
  auto issue = [&](int j) {
    const int* rows = rows_s + (j % 3) * kTcTile;
    constexpr int kChunks = kTcRawRow / 16;
    for (int i = tid; i < kTcTile * kChunks; i += C::kThreads) {
      const int k = i / kChunks, c = i - k * kChunks;
      const int r = rows[k];
      CpAsync16(raw_s + k * kTcRawRow + 16 * c, p.kv8 + int64_t{max(r, 0)} * p.kv8_rs + 16 * c,
                r >= 0);
    }
  };

  if (num_tiles > 0 && tid < kTcTile) rows_s[tid] = key_row(begin + tid);
  __syncthreads();
  if (num_tiles > 0) issue(0);
  // Queries of the group's heads as split bf16 (overlaps the first tile's copy); loads in
  // batches of kQBatch so that they are in flight together.
  constexpr int kDq4 = kTcDq / 4, kDa4 = kTcKvr / 4;
  constexpr int kQIters = C::kHeads * kDq4 / C::kThreads, kQBatch = 6;
  static_assert(C::kHeads * kDq4 % C::kThreads == 0 && kQIters % kQBatch == 0, "query load");
  for (int b0 = 0; b0 < kQIters; b0 += kQBatch) {
    float4 v[kQBatch];
#pragma unroll
    for (int u = 0; u < kQBatch; ++u) {
      const int i = tid + (b0 + u) * C::kThreads;
      const int g = i / kDq4, d4 = i - g * kDq4, h = h0 + g;
      v[u] = d4 < kDa4
                 ? reinterpret_cast<const float4*>(p.q_a + t * p.q_a_rs + h * p.q_a_hs)[d4]
                 : reinterpret_cast<const float4*>(p.q_b + t * p.q_b_rs + h * p.q_b_hs)[d4 - kDa4];
    }
#pragma unroll
    for (int u = 0; u < kQBatch; ++u) {
      const int i = tid + (b0 + u) * C::kThreads;
      const int g = i / kDq4, d4 = i - g * kDq4;
      uint2 hi, lo;
      SplitBf16(v[u].x, v[u].y, &hi.x, &lo.x);
      SplitBf16(v[u].z, v[u].w, &hi.y, &lo.y);
      *reinterpret_cast<uint2*>(q_hi + g * kTcLd + 4 * d4) = hi;
      *reinterpret_cast<uint2*>(q_lo + g * kTcLd + 4 * d4) = lo;
    }
  }

  const int mt = warp / C::kWpm, ng = warp % C::kWpm;  // score phase
  const int r0 = lane >> 2;
  const int col0 = warp * C::kCols;                     // P.V phase
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float acc[MT][C::kNtv][4];
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int n = 0; n < C::kNtv; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][n][e] = 0.f;

  const __nv_bfloat16* qa_hi = q_hi + (mt * 16 + (lane & 15)) * kTcLd + (lane >> 4) * 8;
  const __nv_bfloat16* qa_lo = q_lo + (mt * 16 + (lane & 15)) * kTcLd + (lane >> 4) * 8;
  const __nv_bfloat16* kb =
      k_s + (ng * C::kNts * 8 + ((lane >> 4) & (C::kNts - 1)) * 8 + (lane & 7)) * kTcLd +
      ((lane >> 3) & 1) * 8;

  for (int j = 0; j < num_tiles; ++j) {
    const int tile0 = begin + j * kTcTile;
    if (tid < kTcTile) rows_s[((j + 1) % 3) * kTcTile + tid] = key_row(tile0 + kTcTile + tid);
    CpAsyncWaitAll();
    __syncthreads();  // raw tile j landed; the previous tile's k_s / P reads are done

    // Dequantize: 8 c_kv (e4m3 x scale) or 8 k_pe (bf16 copy) per 16-byte store.
    constexpr int kC8 = kTcKvr / 8, kRow8 = kC8 + kTcRope / 8;
    for (int i = tid; i < kTcTile * kRow8; i += C::kThreads) {
      const int k = i / kRow8, c = i - k * kRow8;
      const uint8_t* row = raw_s + k * kTcRawRow;
      uint4 o;
      if (c < kC8) {
        const uint2 b = *reinterpret_cast<const uint2*>(row + 8 * c);
        const float s = reinterpret_cast<const float*>(row + kTcScaleOff)[c / 16];
        uint32_t w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          __nv_fp8x2_e4m3 q;
          q.__x = static_cast<__nv_fp8x2_storage_t>(((u < 2 ? b.x : b.y) >> (16 * (u & 1))) &
                                                    0xffffu);
          const float2 f = static_cast<float2>(q);
          w[u] = Bf16Bits(__floats2bfloat162_rn(f.x * s, f.y * s));
        }
        o = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        o = *reinterpret_cast<const uint4*>(row + kTcRopeOff + 16 * (c - kC8));
      }
      *reinterpret_cast<uint4*>(k_s + k * kTcLd + 8 * c) = o;
    }
    __syncthreads();  // k_s ready, raw_s free
    if (j + 1 < num_tiles) issue(j + 1);

    // S = Q K^T: m-tile mt, n-tiles ng kNts .. +kNts. Four independent accumulator chains per
    // n-tile (even / odd k-step x query hi / lo: mma latency, not a 72-deep chain), summed in
    // a fixed order at the end.
    float sc[C::kNts][4][4];
#pragma unroll
    for (int n = 0; n < C::kNts; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][c][e] = 0.f;
#pragma unroll 2
    for (int kk = 0; kk < kTcDq; kk += 32) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int k = kk + 16 * half;
        uint32_t ah[4], al[4];
        LdMatrixX4(ah, qa_hi + k);
        LdMatrixX4(al, qa_lo + k);
        if constexpr (C::kNts == 2) {
          uint32_t b[4];
          LdMatrixX4(b, kb + k);
          MmaBf16(sc[0][2 * half], ah, b[0], b[1]);
          MmaBf16(sc[0][2 * half + 1], al, b[0], b[1]);
          MmaBf16(sc[1][2 * half], ah, b[2], b[3]);
          MmaBf16(sc[1][2 * half + 1], al, b[2], b[3]);
        } else {
          uint32_t b[2];
          LdMatrixX2(b, kb + k);
          MmaBf16(sc[0][2 * half], ah, b[0], b[1]);
          MmaBf16(sc[0][2 * half + 1], al, b[0], b[1]);
        }
      }
    }
    float s[C::kNts][4];
#pragma unroll
    for (int n = 0; n < C::kNts; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = (sc[n][0][e] + sc[n][1][e]) + (sc[n][2][e] + sc[n][3][e]);
      }

    // Online softmax (rows r0 and r0 + 8 of the m-tile; partial max / sum per warp exchanged
    // through shared memory and combined in warp order).
    const int* rows = rows_s + (j % 3) * kTcTile;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < C::kNts; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = (ng * C::kNts + n) * 8 + (lane & 3) * 2 + (e & 1);
        s[n][e] = rows[key] >= 0 ? s[n][e] * p.scale : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      if ((lane & 3) == 0) red_max[(mt * 16 + r0 + 8 * i) * C::kWpm + ng] = mx[i];
    }
    __syncthreads();  // partial maxima
    float m_new[2], corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m = m_run[i];
#pragma unroll
      for (int w = 0; w < C::kWpm; ++w) m = fmaxf(m, red_max[(mt * 16 + r0 + 8 * i) * C::kWpm + w]);
      m_new[i] = m;
    }
#pragma unroll
    for (int n = 0; n < C::kNts; ++n) {
      const int key = (ng * C::kNts + n) * 8 + (lane & 3) * 2;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float s0 = s[n][2 * i], s1 = s[n][2 * i + 1];
        const float e0 = s0 == -INFINITY ? 0.f : expf(s0 - m_new[i]);
        const float e1 = s1 == -INFINITY ? 0.f : expf(s1 - m_new[i]);
        sum[i] += e0 + e1;
        uint32_t hi, lo;
        SplitBf16(e0, e1, &hi, &lo);
        const int off = (mt * 16 + r0 + 8 * i) * kTcPLd + key;
        *reinterpret_cast<uint32_t*>(p_hi + off) = hi;
        *reinterpret_cast<uint32_t*>(p_lo + off) = lo;
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
      const int row = mt * 16 + r0 + 8 * i;
      corr[i] = m_run[i] == -INFINITY ? 0.f : expf(m_run[i] - m_new[i]);
      if ((lane & 3) == 0) {
        red_sum[row * C::kWpm + ng] = sum[i];
        if (ng == 0) corr_s[row] = corr[i];
      }
      m_run[i] = m_new[i];
    }
    __syncthreads();  // P, partial sums, corrections
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = mt * 16 + r0 + 8 * i;
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < C::kWpm; ++w) l += red_sum[row * C::kWpm + w];
      l_run[i] = l_run[i] * corr[i] + l;
    }

    // O = O * corr + P V over the tile (V = the c_kv columns of k_s; P hi and lo).
#pragma unroll
    for (int a = 0; a < MT; ++a) {
      const float c_lo = corr_s[a * 16 + r0], c_hi = corr_s[a * 16 + r0 + 8];
#pragma unroll
      for (int n = 0; n < C::kNtv; ++n) {
        acc[a][n][0] *= c_lo;
        acc[a][n][1] *= c_lo;
        acc[a][n][2] *= c_hi;
        acc[a][n][3] *= c_hi;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kTcTile; kk += 16) {
      uint32_t ph[MT][4], pl[MT][4];
#pragma unroll
      for (int a = 0; a < MT; ++a) {
        const int off = (a * 16 + (lane & 15)) * kTcPLd + kk + (lane >> 4) * 8;
        LdMatrixX4(ph[a], p_hi + off);
        LdMatrixX4(pl[a], p_lo + off);
      }
      const __nv_bfloat16* vb =
          k_s + (kk + ((lane >> 3) & 1) * 8 + (lane & 7)) * kTcLd + col0 + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < C::kNtv / 2; ++np) {
        uint32_t b[4];
        LdMatrixX4Trans(b, vb + np * 16);
#pragma unroll
        for (int a = 0; a < MT; ++a) {
          MmaBf16(acc[a][2 * np], ph[a], b[0], b[1]);
          MmaBf16(acc[a][2 * np], pl[a], b[0], b[1]);
          MmaBf16(acc[a][2 * np + 1], ph[a], b[2], b[3]);
          MmaBf16(acc[a][2 * np + 1], pl[a], b[2], b[3]);
        }
      }
    }
  }

  if (ng == 0 && (lane & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m_fin[mt * 16 + r0 + 8 * i] = m_run[i];
      l_fin[mt * 16 + r0 + 8 * i] = l_run[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int a = 0; a < MT; ++a) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int g = a * 16 + r0 + 8 * i, h = h0 + g;
      if (p.num_splits == 1) {
        const float l = l_fin[g];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        float* o = p.out + t * p.out_rs + h * p.out_hs + col0 + (lane & 3) * 2;
#pragma unroll
        for (int n = 0; n < C::kNtv; ++n) {
          *reinterpret_cast<float2*>(o + n * 8) =
              make_float2(acc[a][n][2 * i] * inv, acc[a][n][2 * i + 1] * inv);
        }
      } else {
        const int64_t part = (t * p.num_heads + h) * p.num_splits + split;
        float* o = p.part_acc + part * p.dv + col0 + (lane & 3) * 2;
#pragma unroll
        for (int n = 0; n < C::kNtv; ++n) {
          *reinterpret_cast<float2*>(o + n * 8) = make_float2(acc[a][n][2 * i], acc[a][n][2 * i + 1]);
        }
      }
    }
  }
  if (p.num_splits > 1 && tid < C::kHeads) {
    const int64_t part = (t * p.num_heads + h0 + tid) * p.num_splits + split;
    p.part_ml[2 * part] = m_fin[tid];
    p.part_ml[2 * part + 1] = l_fin[tid];
  }
}

}  // namespace glm::kernels::mla_attention
