// DSA indexer scores (dsa_indexer.h has the op's contract):
//   I[t, s] = sum_h w[t, h] * weight_scale * relu(q[t, h] . k[s] * score_scale),  s < num_keys(t)
// into the workspace [rows, ld], plus (when the select path wants it) the histogram of the top
// radix byte of OrderedKey(I) per row: the select's first pass. Two kernels, one CTA per (row,
// chunk of keys), chunks sized by the launcher so a batch-1 decode covers every SM.
//
// IndexerScoreKernel<kFp8> (fp32 keys, or fp8 keys the tensor-core kernel does not take): the
//   row's queries in shared memory (row stride dim + 1: conflict-free when lane = head); each warp
//   walks its keys 8 at a time through its own shared rows (float4 loads, all 8 in flight); lane
//   = head (32 heads per pass), the lane keeps its head's 32 query values of a 32-dim slice in
//   registers and reads the keys as broadcast float4s; relu, weight and a warp sum finish a key.
//   fp8 keys: lane k finds key k's page offset and scale once (32-bit division) and shuffles them;
//   the key is value * scale (exact in fp32), then the fp32 arithmetic. Shared memory: the
//   queries ceil(heads / 32) * 32 x (dim + 1) floats plus one key tile (GLM-5 32 x 128: ~49 KiB).
// IndexerScoreTcKernel (fp8 keys at index_head_dim 128, sm_80+): per row the GEMM
//   Q [heads x 128] x K^T [128 x keys] on mma.sync m16n8k16 bf16, fp32 accumulation. e4m3 values
//   are exact in bf16, the token's power-of-two scale multiplies the fp32 dot (exact), each query
//   value is split by truncation into three bf16 terms (hi + mid + lo == q exactly): every product
//   is exact, only the fp32 accumulation rounds (within ~1e-7 of an fp64 reference relative to
//   sum_h |w| sum_d |q k|, like the fp32 kernel; cuda_indexer_test). relu, weight and head sum in
//   fp32 in a fixed order: deterministic. A lane reads its key's 32 contiguous fp8 bytes straight
//   from the paged cache (key dims permuted alike in A and B), the query fragments sit in shared
//   memory in fragment order (24 KiB for 32 heads).
// NOTE: the tensor-core kernel is bound by its instruction stream's latency, not HBM (ncu, 1 x
//   128K: a warp issues every ~5 cycles, ~1 warp per scheduler). Hence two instantiations: {2,2,2}
//   keeps the next step's key words in flight (2 CTAs per SM, no spill), and {4,8,0} runs up to 4
//   CTAs per SM for calls where the score kernel is the bulk of the work (dsa_indexer.cu).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/dsa_indexer_common.cuh"
#include "kernels/launch.cuh"

namespace glm::kernels::dsa_indexer {

inline constexpr int kScoreThreads = 256;
inline constexpr int kScoreWarps = kScoreThreads / 32;
inline constexpr int kKeysPerWarp = 8;
inline constexpr int kTileKeys = kScoreWarps * kKeysPerWarp;  // 64
inline constexpr int kMaxChunk = 8 * kTileKeys;  // keys per CTA at most (sized from the SM count)

struct ScoreParams {
  const float* q;
  int64_t q_rs, q_hs;
  const float* w;
  int64_t w_ld;
  const float* keys;
  int64_t keys_ld;
  const int32_t* slots;
  const int32_t* row_offset;
  const int32_t* row_num_keys;
  int32_t heads, dim, dim_pad, heads_pad, top_k, chunks, chunk_len;
  bool q_vec;  // q rows 16-byte aligned (float4 loads of the queries)
  // fp8 key cache (DsaIndexerArgs::keys_fp8; kernels/kv_fp8_layout.h), or null.
  const uint8_t* keys8;
  int32_t block_size;
  float weight_scale, score_scale;
  float* scores;   // [rows, ld]
  int64_t ld;
  uint32_t* hist;  // [rows, hist_stride]: top-byte histogram of the scores in the first 256,
                   // zeroed before the launch
  int32_t hist_stride;
};

// The score kernels' shared pieces (IndexerScoreKernel, IndexerScoreTcKernel).

// This CTA's keys [begin, end) of row t (chunk blockIdx.x % chunks); `skip` when the row needs no
// scores (num_keys <= top_k) or the chunk starts past its keys (uniform over the CTA).
struct ScoreChunk {
  int64_t t;
  int begin, end;
  bool skip;
};
__device__ __forceinline__ ScoreChunk ScoreChunkOfBlock(const ScoreParams& p) {
  ScoreChunk ch;
  ch.t = blockIdx.x / p.chunks;
  const int chunk = static_cast<int>(blockIdx.x % p.chunks);
  const int num_keys = p.row_num_keys[ch.t];
  ch.begin = chunk * p.chunk_len;
  ch.skip = num_keys <= p.top_k || ch.begin >= num_keys;
  ch.end = min(num_keys, ch.begin + p.chunk_len);
  return ch;
}

// Row t's head weights times weight_scale (0 for the padding heads) into w_s [heads_pad], and
// hist_s [256] zeroed when the launch keeps a histogram; returns that (uniform). The caller
// syncs the CTA before use.
template <int kThreads>
__device__ __forceinline__ bool LoadWeightsClearHist(const ScoreParams& p, int64_t t, float* w_s,
                                                     uint32_t* hist_s) {
  const int tid = threadIdx.x;
  for (int h = tid; h < p.heads_pad; h += kThreads) {
    w_s[h] = h < p.heads ? p.w[t * p.w_ld + h] * p.weight_scale : 0.f;
  }
  const bool with_hist = p.hist != nullptr;
  if (with_hist) {
    for (int i = tid; i < 256; i += kThreads) hist_s[i] = 0;
  }
  return with_hist;
}

// Key `slot` of the paged fp8 index cache (kv_fp8_layout.h) at width `dim`: the byte offset of
// its e4m3 values and its scale.
__device__ __forceinline__ void Fp8KeyAt(const ScoreParams& p, int slot, int dim, int64_t* voff,
                                         float* scale) {
  const int blk = slot / p.block_size, off = slot - blk * p.block_size;
  const int64_t base = int64_t{blk} * p.block_size * (dim + 4);
  *voff = base + int64_t{off} * dim;
  *scale = *reinterpret_cast<const float*>(p.keys8 + base + int64_t{p.block_size} * dim + 4 * off);
}

// After the CTA's keys: its histogram added into row t's (skips the zero bins).
template <int kThreads>
__device__ __forceinline__ void FlushHist(const ScoreParams& p, int64_t t,
                                          const uint32_t* hist_s) {
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += kThreads) {
    if (hist_s[i] != 0) atomicAdd(&p.hist[t * p.hist_stride + i], hist_s[i]);
  }
}

// grid: rows * chunks; block kScoreThreads; dynamic smem ScoreSmemBytes. Each warp owns 8 key
// rows of shared memory and walks the chunk's keys 8 at a time (warp w: keys w*8 + 64i ...), so
// warps never wait for each other inside the chunk. Also adds the chunk's histogram of the top
// byte of OrderedKey(score) into hist[t] (the select kernel's first radix pass).
template <bool kFp8>
__global__ void __launch_bounds__(kScoreThreads) IndexerScoreKernel(ScoreParams p) {
  PdlEnter();
  extern __shared__ __align__(16) float smem[];
  __shared__ uint32_t hist_s[256];
  const int qstride = p.dim_pad + 1;
  float* k_s = smem;                                  // [kTileKeys][dim_pad]
  float* q_s = k_s + kTileKeys * p.dim_pad;           // [heads_pad][dim_pad + 1]
  float* w_s = q_s + p.heads_pad * qstride;           // [heads_pad]

  const ScoreChunk ch = ScoreChunkOfBlock(p);
  if (ch.skip) return;  // uniform over the CTA
  const int64_t t = ch.t;
  const int begin = ch.begin, end = ch.end;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const int dp4 = p.dim_pad / 4, d4 = p.dim / 4;
  // Queries: float4 loads (dim and the strides multiples of 4), scalar stores (odd row stride).
  for (int i = tid; i < p.heads_pad * dp4; i += kScoreThreads) {
    const int h = i / dp4, c4 = i - h * dp4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (h < p.heads && c4 < d4) {
      const float* src = p.q + t * p.q_rs + h * p.q_hs + 4 * c4;
      x = p.q_vec ? *reinterpret_cast<const float4*>(src)
                  : make_float4(src[0], src[1], src[2], src[3]);
    }
    float* dst = q_s + h * qstride + 4 * c4;
    dst[0] = x.x, dst[1] = x.y, dst[2] = x.z, dst[3] = x.w;
  }
  const bool with_hist = LoadWeightsClearHist<kScoreThreads>(p, t, w_s, hist_s);  // uniform
  __syncthreads();
  const int32_t* slots = p.slots + p.row_offset[t];
  float* k_w = k_s + warp * kKeysPerWarp * p.dim_pad;  // this warp's 8 key rows

  for (int key0 = begin + warp * kKeysPerWarp; key0 < end; key0 += kTileKeys) {
    const int my_slot = lane < kKeysPerWarp && key0 + lane < end ? slots[key0 + lane] : -1;
    // All lanes shuffle here: the copy loop below leaves lanes out when dim_pad < 128.
    int slot[kKeysPerWarp];
#pragma unroll
    for (int kk = 0; kk < kKeysPerWarp; ++kk) slot[kk] = __shfl_sync(0xffffffffu, my_slot, kk);
    __syncwarp();  // the previous keys' reads of k_w are done
    // fp8: lane kk < 8 finds key kk's value offset and scale in the paged layout (32-bit
    // division, once per key), then every lane gets them by shuffle.
    float kscale[kKeysPerWarp];
    int64_t kvoff[kKeysPerWarp];
    if constexpr (kFp8) {
      int64_t my_voff = 0;
      float my_scale = 0.f;
      if (my_slot >= 0) Fp8KeyAt(p, my_slot, p.dim, &my_voff, &my_scale);
#pragma unroll
      for (int kk = 0; kk < kKeysPerWarp; ++kk) {
        kvoff[kk] = __shfl_sync(0xffffffffu, my_voff, kk);
        kscale[kk] = __shfl_sync(0xffffffffu, my_scale, kk);
      }
    }
    for (int c4 = lane; c4 < dp4; c4 += 32) {
      float4 val[kKeysPerWarp];
#pragma unroll
      for (int kk = 0; kk < kKeysPerWarp; ++kk) {
        if constexpr (kFp8) {
          // key = e4m3 value * the token's scale (exact), then the fp32 path's arithmetic.
          if (slot[kk] >= 0 && c4 < d4) {
            __nv_fp8x4_e4m3 q;
            q.__x = *reinterpret_cast<const __nv_fp8x4_storage_t*>(p.keys8 + kvoff[kk] + 4 * c4);
            const float4 f = static_cast<float4>(q);
            const float sc = kscale[kk];
            val[kk] = make_float4(f.x * sc, f.y * sc, f.z * sc, f.w * sc);
          } else {
            val[kk] = make_float4(0.f, 0.f, 0.f, 0.f);
          }
        } else {
          val[kk] = slot[kk] >= 0 && c4 < d4
                        ? reinterpret_cast<const float4*>(p.keys +
                                                          int64_t{slot[kk]} * p.keys_ld)[c4]
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kKeysPerWarp; ++kk) {
        reinterpret_cast<float4*>(k_w + kk * p.dim_pad)[c4] = val[kk];
      }
    }
    __syncwarp();

    float score[kKeysPerWarp];
#pragma unroll
    for (int kk = 0; kk < kKeysPerWarp; ++kk) score[kk] = 0.f;
    for (int h0 = 0; h0 < p.heads_pad; h0 += 32) {
      const int h = h0 + lane;
      float part[kKeysPerWarp];
#pragma unroll
      for (int kk = 0; kk < kKeysPerWarp; ++kk) part[kk] = 0.f;
      for (int c = 0; c < p.dim_pad; c += 32) {
        float qr[32];
#pragma unroll
        for (int j = 0; j < 32; ++j) qr[j] = q_s[h * qstride + c + j];
#pragma unroll
        for (int kk = 0; kk < kKeysPerWarp; ++kk) {
          const float4* kp = reinterpret_cast<const float4*>(k_w + kk * p.dim_pad + c);
          float acc = part[kk];
#pragma unroll
          for (int j4 = 0; j4 < 8; ++j4) {
            const float4 kv = kp[j4];
            acc += qr[4 * j4] * kv.x + qr[4 * j4 + 1] * kv.y + qr[4 * j4 + 2] * kv.z +
                   qr[4 * j4 + 3] * kv.w;
          }
          part[kk] = acc;
        }
      }
      const float wh = w_s[h];
#pragma unroll
      for (int kk = 0; kk < kKeysPerWarp; ++kk) {
        float val = fmaxf(part[kk] * p.score_scale, 0.f) * wh;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) val += __shfl_xor_sync(0xffffffffu, val, o);
        score[kk] += val;
      }
    }
    float mine = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKeysPerWarp; ++kk) mine = lane == kk ? score[kk] : mine;
    uint32_t digit = 256;  // no bin
    if (lane < kKeysPerWarp && key0 + lane < end) {
      p.scores[t * p.ld + key0 + lane] = mine;
      digit = OrderedKey(mine) >> 24;
    }
    if (with_hist) WarpHistAdd(digit, lane, hist_s);
  }
  if (with_hist) FlushHist<kScoreThreads>(p, t, hist_s);  // uniform
}

// ---- Tensor-core score kernel (fp8 keys at index_head_dim 128) ------------------------------
// Per row a GEMM Q [heads x dim] x K^T [dim x keys] with mma.sync m16n8k16 bf16 (sm_80+), fp32
// accumulate. The e4m3 key values are exact in bf16 and the token's power-of-two scale is applied
// to the fp32 dot product (exact); each fp32 query value is split into three bf16 terms
// q = hi + mid + lo by truncation (exact: 3 x 8 significant bits, residuals exact in fp32), so
// every product is exact and only the fp32 accumulation rounds. The dims of a k-step are permuted
// (the same permutation for A and B leaves the dot product unchanged): lane (g, c) of an n-tile
// holds key n = g's dims [c * dim / 4, (c + 1) * dim / 4), one 32-bit word of e4m3 values per
// k-step, read straight from the paged cache with two 16-byte loads (no shared-memory staging of
// keys: each key feeds exactly one warp), and the query fragments sit in shared memory in that
// order (one 16-byte load per lane per m-tile, k-step and split term).
inline constexpr int kTcDim = 128;           // index_head_dim the tensor-core path takes (GLM-5)
inline constexpr int kTcKsteps = kTcDim / 16;
inline constexpr int kTcWarps = 4;
inline constexpr int kTcThreads = 32 * kTcWarps;
inline constexpr int kTcNtiles = 4;                      // n-tiles of 8 keys per warp step
inline constexpr int kTcWarpKeys = 8 * kTcNtiles;        // 32
inline constexpr int kTcTileKeys = kTcWarps * kTcWarpKeys;  // 128 keys per CTA step
inline constexpr int kTcMaxChunk = 16 * kTcTileKeys;     // 2048 keys per CTA at most
inline constexpr int kTcSplits = 3;

// Query fragments: [kTcSplits][heads_pad / 16][kTcKsteps][32 lanes] uint4, then w [heads_pad].
inline int64_t TcSmemBytes(int heads_pad) {
  return int64_t{16} * kTcSplits * (heads_pad / 16) * kTcKsteps * 32 + int64_t{4} * heads_pad;
}

__device__ __forceinline__ uint32_t PackBf16x2(uint16_t lo, uint16_t hi) {
  return uint32_t{lo} | (uint32_t{hi} << 16);
}

// x = hi + mid + lo, each bf16 (bits returned); non-finite x: hi = x (NaN stays NaN), mid = lo = 0.
__device__ __forceinline__ void SplitBf16x3(float x, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  if (!isfinite(x)) {
    *hi = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    *mid = 0, *lo = 0;
    return;
  }
  const uint32_t hb = __float_as_uint(x) & 0xffff0000u;
  const float r1 = x - __uint_as_float(hb);  // exact
  const uint32_t mb = __float_as_uint(r1) & 0xffff0000u;
  const float r2 = r1 - __uint_as_float(mb);  // exact, at most 8 significant bits
  *hi = static_cast<uint16_t>(hb >> 16);
  *mid = static_cast<uint16_t>(mb >> 16);
  *lo = __bfloat16_as_ushort(__float2bfloat16_rn(r2));
}

// Four e4m3 values (one 32-bit word, byte i = value i) -> two bf16x2 (values 0,1 and 2,3), exact.
__device__ __forceinline__ void Fp8x4ToBf16x2(uint32_t w, uint32_t* b01, uint32_t* b23) {
  __nv_fp8x4_e4m3 v;
  v.__x = w;
  const float4 f = static_cast<float4>(v);
  const __nv_bfloat162 p01 = __floats2bfloat162_rn(f.x, f.y);
  const __nv_bfloat162 p23 = __floats2bfloat162_rn(f.z, f.w);
  *b01 = *reinterpret_cast<const uint32_t*>(&p01);
  *b23 = *reinterpret_cast<const uint32_t*>(&p23);
}

__device__ __forceinline__ void MmaBf16(float* d, const uint4& a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#else
  __trap();  // never launched below sm_80 (DsaIndexerTopK checks the device)
#endif
}

// grid: rows * chunks; block kTcThreads; dynamic smem TcSmemBytes(heads_pad). Same output as
// IndexerScoreKernel<true> (scores row layout, optional top-byte histogram), dim == kTcDim.
// Warp w walks 32-key steps w * 32 + 128 i of the chunk on its own (no CTA barrier in the loop).
// kMinBlocks: registers capped for that many CTAs per SM (ptxas -v, sm_90a: {2,2,2} no spill,
// {4,8,0} 128 registers, 12-byte spill).
// kKGroup: k-steps (x 3 split terms) per tensor-core accumulation chain; the chains' sums are
// added in fp32 with round-to-nearest (the tensor cores' own fp32 accumulation may truncate, so
// shorter chains bound the error tighter). kTcKsteps = one chain.
// kAhead: what a warp has in flight while a step computes (the same arithmetic at either value):
// 0 nothing (each step waits for its slots, then for its key words); 2 the next step's key words
// and the slots of the one after (32 more registers).
template <int kMinBlocks, int kKGroup, int kAhead>
__global__ void __launch_bounds__(kTcThreads, kMinBlocks) IndexerScoreTcKernel(ScoreParams p) {
  static_assert(kAhead == 0 || kAhead == 2, "look-ahead 0 or 2");
  PdlEnter();
  extern __shared__ __align__(16) uint4 qf[];  // [kTcSplits][mtiles][kTcKsteps][32]
  __shared__ uint32_t hist_s[256];
  const int mtiles = p.heads_pad / 16;
  float* w_s = reinterpret_cast<float*>(qf + kTcSplits * mtiles * kTcKsteps * 32);

  const ScoreChunk ch = ScoreChunkOfBlock(p);
  if (ch.skip) return;  // uniform over the CTA
  const int64_t t = ch.t;
  const int begin = ch.begin, end = ch.end;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int32_t* slots = p.slots + p.row_offset[t];

  // Query fragments. Entry (mt, ks, lane): dims d_e = c * 32 + 4 ks + e of heads mt*16 + g (.x:
  // e 0,1; .z: e 2,3) and mt*16 + g + 8 (.y: e 0,1; .w: e 2,3): a0..a7 of m16n8k16 with the
  // k index 2c + {0,1} -> d_{0,1}, 2c + 8 + {0,1} -> d_{2,3}.
  for (int i = tid; i < mtiles * kTcKsteps * 32; i += kTcThreads) {
    const int ln = i & 31, ks = (i >> 5) % kTcKsteps, mt = (i >> 5) / kTcKsteps;
    const int fg = ln >> 2, fc = ln & 3;
    uint16_t parts[kTcSplits][2][4];  // [split][row g / g + 8][e]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = mt * 16 + fg + 8 * r;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (h < p.heads) {
        const float* src = p.q + t * p.q_rs + h * p.q_hs + fc * (kTcDim / 4) + 4 * ks;
        x = p.q_vec ? *reinterpret_cast<const float4*>(src)
                    : make_float4(src[0], src[1], src[2], src[3]);
      }
      const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) SplitBf16x3(v[e], &parts[0][r][e], &parts[1][r][e], &parts[2][r][e]);
    }
#pragma unroll
    for (int s = 0; s < kTcSplits; ++s) {
      qf[(s * mtiles + mt) * kTcKsteps * 32 + ks * 32 + ln] =
          make_uint4(PackBf16x2(parts[s][0][0], parts[s][0][1]),
                     PackBf16x2(parts[s][1][0], parts[s][1][1]),
                     PackBf16x2(parts[s][0][2], parts[s][0][3]),
                     PackBf16x2(parts[s][1][2], parts[s][1][3]));
    }
  }
  const bool with_hist = LoadWeightsClearHist<kTcThreads>(p, t, w_s, hist_s);  // uniform
  __syncthreads();

  // Lane l: the value offset and scale of key k0 + l of a warp step (-1 / 0 past the chunk; 32-bit
  // division once per key).
  auto lookup = [&](int k0, int64_t* voff, float* scale) {
    const int slot = k0 + lane < end ? slots[k0 + lane] : -1;
    *voff = -1, *scale = 0.f;
    if (slot >= 0) Fp8KeyAt(p, slot, kTcDim, voff, scale);
  };
  // B of a warp step from the lanes' offsets: lane (g, c) of n-tile j holds key 8j + g's bytes
  // [32c, 32c + 32): word ks = k-step ks.
  auto load_keys = [&](int64_t lane_voff, uint32_t(&raw)[kTcNtiles][kTcKsteps]) {
#pragma unroll
    for (int j = 0; j < kTcNtiles; ++j) {
      const int64_t voff = __shfl_sync(0xffffffffu, lane_voff, 8 * j + g);
      uint4 lo4 = make_uint4(0u, 0u, 0u, 0u), hi4 = lo4;
      if (voff >= 0) {
        const uint4* src = reinterpret_cast<const uint4*>(p.keys8 + voff + c * (kTcDim / 4));
        lo4 = src[0];
        hi4 = src[1];
      }
      raw[j][0] = lo4.x, raw[j][1] = lo4.y, raw[j][2] = lo4.z, raw[j][3] = lo4.w;
      raw[j][4] = hi4.x, raw[j][5] = hi4.y, raw[j][6] = hi4.z, raw[j][7] = hi4.w;
    }
  };
  // kAhead (the loads in flight while a step computes): 0 = none; 2 = the next step's key words
  // and the lookup of the one after.
  int key0 = begin + warp * kTcWarpKeys;
  int64_t next_voff = -1;  // the lookup kAhead steps ahead (kAhead >= 1)
  float next_scale = 0.f;
  uint32_t next_raw[kTcNtiles][kTcKsteps];  // the next step's key words (kAhead == 2)
  float ahead_scale = 0.f;  // kAhead == 2: the scale of the step whose words are in next_raw
  if constexpr (kAhead >= 1) lookup(key0, &next_voff, &next_scale);
  if constexpr (kAhead == 2) {
    load_keys(next_voff, next_raw);
    ahead_scale = next_scale;
    lookup(key0 + kTcTileKeys, &next_voff, &next_scale);
  }
  for (; key0 < end; key0 += kTcTileKeys) {
    uint32_t raw[kTcNtiles][kTcKsteps];
    float my_scale;
    if constexpr (kAhead == 0) {
      int64_t my_voff;
      lookup(key0, &my_voff, &my_scale);
      load_keys(my_voff, raw);
    } else {
#pragma unroll
      for (int j = 0; j < kTcNtiles; ++j)
#pragma unroll
        for (int ks = 0; ks < kTcKsteps; ++ks) raw[j][ks] = next_raw[j][ks];
      my_scale = ahead_scale;
      ahead_scale = next_scale;
      load_keys(next_voff, next_raw);
      lookup(key0 + 2 * kTcTileKeys, &next_voff, &next_scale);
    }
    // Epilogue scales: this lane's accumulator columns are keys 8j + 2c and 8j + 2c + 1.
    float sc[kTcNtiles][2];
#pragma unroll
    for (int j = 0; j < kTcNtiles; ++j) {
      sc[j][0] = __shfl_sync(0xffffffffu, my_scale, 8 * j + 2 * c) * p.score_scale;
      sc[j][1] = __shfl_sync(0xffffffffu, my_scale, 8 * j + 2 * c + 1) * p.score_scale;
    }
    float score[kTcNtiles][2];
#pragma unroll
    for (int j = 0; j < kTcNtiles; ++j) score[j][0] = score[j][1] = 0.f;
    for (int mt0 = 0; mt0 < mtiles; mt0 += 2) {  // 32 heads per pass (heads_pad % 32 == 0)
      // acc: the tensor cores' running sum over a group of kKGroup k-steps; tot: the groups'
      // sums added in fp32 (round to nearest) when kKGroup < kTcKsteps.
      float acc[2][kTcNtiles][4], tot[2][kTcNtiles][4];
#pragma unroll
      for (int ks = 0; ks < kTcKsteps; ++ks) {
        if (ks % kKGroup == 0) {
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int j = 0; j < kTcNtiles; ++j)
#pragma unroll
              for (int r = 0; r < 4; ++r) acc[m][j][r] = 0.f;
        }
        uint32_t b[kTcNtiles][2];
#pragma unroll
        for (int j = 0; j < kTcNtiles; ++j) Fp8x4ToBf16x2(raw[j][ks], &b[j][0], &b[j][1]);
#pragma unroll
        for (int s = kTcSplits - 1; s >= 0; --s) {  // lo, mid, hi
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const uint4 a = qf[(s * mtiles + mt0 + m) * kTcKsteps * 32 + ks * 32 + lane];
#pragma unroll
            for (int j = 0; j < kTcNtiles; ++j) MmaBf16(acc[m][j], a, b[j][0], b[j][1]);
          }
        }
        if (ks % kKGroup == kKGroup - 1) {
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int j = 0; j < kTcNtiles; ++j)
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                tot[m][j][r] = ks == kKGroup - 1 ? acc[m][j][r] : tot[m][j][r] + acc[m][j][r];
              }
        }
      }
      // acc[m][j]: {0,1} head mt*16 + g, keys 2c, 2c + 1; {2,3} head mt*16 + g + 8. relu,
      // weight, then the sum over this pass's 32 heads in a fixed order.
      float wr[2][2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        wr[m][0] = w_s[(mt0 + m) * 16 + g];
        wr[m][1] = w_s[(mt0 + m) * 16 + g + 8];
      }
#pragma unroll
      for (int j = 0; j < kTcNtiles; ++j) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float v = 0.f;
#pragma unroll
          for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              v += fmaxf(tot[m][j][2 * r + k] * sc[j][k], 0.f) * wr[m][r];
            }
          }
#pragma unroll
          for (int o = 4; o < 32; o *= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
          score[j][k] += v;
        }
      }
    }
    // Lane (g < 4, c) writes keys 8g + 2c, 8g + 2c + 1 (lanes 0..15: 32 consecutive scores).
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int j = 0; j < kTcNtiles; ++j) {
      s0 = g == j ? score[j][0] : s0;
      s1 = g == j ? score[j][1] : s1;
    }
    const int k0 = key0 + 8 * g + 2 * c;
    uint32_t d0 = 256, d1 = 256;  // no bin
    if (g < kTcNtiles && k0 < end) {
      float* dst = p.scores + t * p.ld + k0;
      if (k0 + 1 < end) {
        *reinterpret_cast<float2*>(dst) = make_float2(s0, s1);
        d1 = OrderedKey(s1) >> 24;
      } else {
        dst[0] = s0;
      }
      d0 = OrderedKey(s0) >> 24;
    }
    if (with_hist) {
#pragma unroll
      for (int k = 0; k < 2; ++k) WarpHistAdd(k == 0 ? d0 : d1, lane, hist_s);
    }
  }
  if (with_hist) FlushHist<kTcThreads>(p, t, hist_s);  // uniform
}


// Dynamic shared memory of IndexerScoreKernel: the key tile, the queries, the weights.
inline int64_t ScoreSmemBytes(int heads_pad, int dim_pad) {
  return int64_t{4} * (int64_t{kTileKeys} * dim_pad + int64_t{heads_pad} * (dim_pad + 1) +
                       heads_pad);
}

}  // namespace glm::kernels::dsa_indexer
