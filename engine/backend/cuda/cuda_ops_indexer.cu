// DSA lightning indexer: scores + causal top-k (IndexerTopKArgs, backend.h), fp32.
//
// Two kernels.
// IndexerScoreKernel: I[t, s] = sum_h w[t, h] * weight_scale * relu(q[t, h] . k[s] * score_scale)
//   for s < num_keys(t), into scratch [rows, ld]. One CTA per (row, chunk of keys; chunks sized
//   from the SM count so that a batch-1 decode covers every SM, 64..512 keys each); the
//   row's queries sit in shared memory (row stride dim + 1: conflict-free when lane = head). Each
//   warp walks its keys 8 at a time through its own shared rows (coalesced float4 loads through
//   slots, all 8 in flight). Lane = head (32 heads per pass, more heads loop): per 32-dim slice
//   the lane keeps its head's 32 query values in registers and reads the keys as broadcast
//   float4s; relu, weight and a warp sum finish each key. The CTA also adds the histogram of the
//   scores' top radix byte into [rows, 256] scratch (the select kernel's first pass).
// IndexerSelectKernel: one CTA (1024 threads) per row. Exact radix select on the order-preserving
//   uint32 image of the scores: pass 0 from the score kernel's histogram, then up to 3 more
//   8-bit passes over the row (16 scores per thread per step, float4 loads; warps with no key
//   matching the prefix skip the warp-aggregated histogram update; stops early when the chosen
//   bin is taken whole). That gives the k-th largest value T (at the resolved bits) and how many
//   keys equal to T are taken; a last ordered pass (block scan) writes every position above T
//   plus the lowest-position ties, in ascending position order: exactly the CPU backend's
//   output. Rows with num_keys <= top_k get 0..num_keys-1 then -1 without scoring.
// Limits: index_head_dim a multiple of 4 (float4 loads) with 16-byte aligned q / keys and
//   strides that are multiples of 4; the queries (ceil(heads / 32) * 32 x (dim + 1) floats) plus
//   one key tile must fit the device's shared memory (GLM-5: 32 x 128 -> ~49 KiB). num_keys up to
//   2^31 - 1; one CTA selects a row, so a decode step with few very long rows is bound by one SM
//   reading its row up to 4 times from L2. Scratch: rows x max_num_keys floats + rows x 1 KiB.
//   -0.0 ranks equal to +0.0; NaN ranks below -inf.
// Multi-CTA radix passes (default when rows < SM count and a row has more than 16K keys, i.e. more
//   than one select step per pass, and the short-row select below does not take it;
//   GLM_CUDA_INDEXER_LEGACY=1 in the environment, read once, forces the single-CTA passes above;
//   SetIndexerPathForBench picks either for tests / benches): IndexerHistKernel builds the
//   histogram of radix pass 1, 2, 3 (one launch each) over chunks of the row spread on the whole
//   GPU: each CTA re-derives the prefix of the earlier passes from their (complete) histograms,
//   counts its chunk's keys matching it (warp-aggregated shared atomics) and adds the counts into
//   [rows, 4, 256] with integer atomics (exact, so deterministic); it does nothing once an earlier
//   pass took its bin whole. The ordered output then runs over the whole GPU too
//   (IndexerOutputKernel: chunks of 1024 positions, each CTA derives the prefix from the 4
//   histograms, counts its keys above / equal to it and finds the counts of the chunks before it by
//   a decoupled look-back; SetIndexerOutputForBench(1) keeps IndexerSelectKernel's single-CTA
//   output pass instead). Same output, bit for bit, as the single-CTA passes. Measured (H200, ncu,
//   1 x 128K random scores): the single-CTA output pass 35 us of the whole IndexerTopK's ~66 (score
//   19, 3 histogram passes 11); with IndexerOutputKernel (cuda_indexer_bench, same process) the
//   select alone 48.3 -> 16.4 us, the whole IndexerTopK 63.9 -> 33.1 us, and the decode step
//   (glm-bench-cuda-decode --ab indexer, random KV) 0.285 -> 0.253 ms/layer at batch 1 x 128K.
// Short-row select (default while a row is at most kItems keys per select thread, i.e. 16K keys,
//   and fits the device's opt-in shared memory; SetIndexerPathForBench mode 3 forces it wherever
//   the row fits): IndexerSelectShortKernel, one 1024-thread CTA per row, loads the row once into
//   shared memory as OrderedKey words (building the pass-0 histogram itself: the score kernel then
//   skips its histogram and the memset), runs every radix pass there (thread j owns a contiguous
//   segment; two barriers per pass, warp 0 picks the digit without a block scan; stops when the
//   bin is taken whole) and writes the output after one block scan. Same output, bit for bit.
//   Measured (H200, cuda_indexer_bench, random data, top-2048, in one process): select alone
//   1 x 4K 12.8 -> 6.3 us, 64 x 4K 15.8 -> 7.5 us, all-equal scores 21.4 -> 10.5 us; the whole
//   IndexerTopK 1 x 4K 24.5 -> 17.9 us, 8 x 4K 34.1 -> 28.4 us. Rows of 50K keys: 58 us (the
//   per-key histogram aggregation, __match_any_sync, dominates), slower than the multi-CTA
//   passes' 36 us, hence the 16K bound.
// Score kernel: the queries are staged with float4 loads; chunks for ~2 CTAs per SM stay (1 / 4
//   / 8 measured no better at 4K..128K). Batch >= 8 is bound by this kernel (8 x 16K: ~67 of 90
//   us; 64 x 128K fp32: ~4 ms, ~26 % of the fp32 FMA peak: shared-memory bound).
// fp8 keys (IndexerTopKArgs::keys_fp8, engine/backend/kv_fp8_layout.h): the score kernel reads the
//   e4m3 values (4 bytes per lane; lane k of the warp finds key k's page offset and scale once,
//   with 32-bit division, and shuffles them to the others) and the token's scale and stores
//   value * scale (exact) in the same shared key rows; everything after is the fp32 path.
// Tensor-core score kernel (IndexerScoreTcKernel; default for fp8 keys at index_head_dim 128 on
//   sm_80+; GLM_CUDA_INDEXER_LEGACY=1 or GLM_CUDA_INDEXER_FP32_SCORE=1 keep the fp32 kernel above,
//   SetIndexerScorePathForBench picks either for tests / benches): per row the GEMM
//   Q [heads x 128] x K^T [128 x keys] on mma.sync m16n8k16 bf16 with fp32 accumulation. The e4m3
//   key values are exact in bf16 and the token's power-of-two scale multiplies the fp32 dot
//   (exact); each query value is split by truncation into three bf16 terms (hi + mid + lo == q
//   exactly), three mmas per k-step, so every product is exact and only the fp32 accumulation
//   rounds (cuda_indexer_test: within ~1e-7 of an fp64 reference, relative to the magnitude
//   sum_h |w| sum_d |q k|, like the fp32 kernel). relu, the weight and the head sum in fp32 in a
//   fixed order: deterministic. The key dims of each k-step are permuted (A and B alike) so a lane
//   reads its key's 32 contiguous fp8 bytes straight from the paged cache (two 16-byte loads; a
//   key feeds one warp only, so no shared-memory staging), the query fragments sit in shared
//   memory in fragment order (24 KiB for 32 heads; heads padded to a multiple of 32). CTA: 4 warps,
//   one row x a chunk of 128..2048 keys (same CTA-count target as above); also the top-byte
//   histogram when the select path takes it. Rows of one CTA share nothing (decode rows are
//   different sequences with different slots), so a key tile is read once per row. ncu (batch 1
//   x 128K): a warp issues every ~5 cycles and a scheduler holds ~1 warp, so the kernel is bound
//   by its instruction stream's latency, not by HBM. Hence: a warp of the {3,2} kernel keeps the
//   next step's key words in flight while a step computes (kAhead 2; 2 CTAs per SM, 255
//   registers, no spill; 8 x 128K 174 -> 148 us), and calls of many rows or long rows take the
//   {4,8} variant on chunks for up to 4 resident CTAs per SM (kTcVariants' comment; 8 x 128K
//   148 -> 119 us, 1 x 128K 33 -> 32 us warm, 23.3 -> 20.4 us with cold caches).
//   Measured (H200, IndexerTopK fp8 keys, select by shape, fp32 score kernel -> tensor core, in one
//   process): 8 x 4K 27.7 -> 17.4 us, 64 x 4K 136 -> 43, 8 x 16K 83 -> 39, 64 x 16K 515 -> 170,
//   8 x 128K 542 -> 201, 64 x 128K 3826 -> 896 (the {4,8} variant: 773; see kTcVariants).
// NOTE: shared memory is sized from the device's opt-in limit, never a fixed chip constant.
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/status_util.h"
#include "engine/backend/cuda/cuda_ops_util.h"
#include "engine/backend/kv_fp8_layout.h"

namespace glm::engine::cuda {
namespace {

constexpr const char* kOp = "IndexerTopK";
constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
constexpr int kKeysPerWarp = 8;
constexpr int kTileKeys = kScoreWarps * kKeysPerWarp;  // 64
constexpr int kMaxChunk = 8 * kTileKeys;  // keys per CTA at most (sized from the SM count)
constexpr int kSelectThreads = 1024;
constexpr int kItems = 16;  // scores per thread per step of the select kernel
constexpr int kHistThreads = 256;
constexpr int kHistPasses = 4;  // radix passes (8 bits each) with a histogram in scratch
constexpr int kHistChunkAlign = 512;  // keys per IndexerHistKernel CTA: a multiple of this
constexpr int kOutThreads = 256;      // IndexerOutputKernel: the multi-CTA passes' ordered output
constexpr int kOutItems = 4;          // consecutive positions per thread (a multiple of 4)
constexpr int kOutChunk = kOutThreads * kOutItems;  // positions per output CTA

// Path choice: -1 = not read yet; 0 = by shape (default); 1 = legacy (GLM_CUDA_INDEXER_LEGACY=1 in the
// environment, read once); 2 = the new path wherever it applies (tests / benches only).
std::atomic<int> g_mode{-1};

int PathMode() { return detail::EnvPathMode("GLM_CUDA_INDEXER_LEGACY", g_mode); }

// Score-kernel CTAs per SM that the key chunks aim at (SetIndexerScoreCtasPerSmForBench): 0 = by
// shape (2; the wide variant's resident CTAs per SM, at most 4, where that takes the call).
std::atomic<int> g_score_ctas_per_sm{0};
// IndexerScoreTcKernel's launch code of the last tensor-core score launch
// (LastIndexerScoreKernelForTest): kMinBlocks * 100 + kKGroup * 10 + kAhead.
std::atomic<int> g_last_tc_kernel{0};

// IndexerScoreTcKernel's look-ahead (kAhead: the loads a warp keeps in flight while a step
// computes; SetIndexerScoreAheadForBench).
constexpr int kDefaultAhead = 2;
std::atomic<int> g_score_ahead{kDefaultAhead};

// Score path (SetIndexerScorePathForBench): 0 = by shape (the tensor-core kernel for fp8 keys at
// index_head_dim 128 unless GLM_CUDA_INDEXER_LEGACY=1 / path mode 1, or
// GLM_CUDA_INDEXER_FP32_SCORE=1 in the environment, read once; its variant by shape:
// kTcVariants' comment), 1 = the fp32 CUDA-core kernel always, 2 = the tensor-core kernel
// (kTcVariants[0]) wherever it applies (whatever the path mode), 3 / 4 = as 2 with the variants
// kTcVariants[1] / [2].
std::atomic<int> g_score_mode{-1};

int ScoreMode() { return detail::EnvPathMode("GLM_CUDA_INDEXER_FP32_SCORE", g_score_mode); }

// IndexerScoreTcKernel variants (kMinBlocks, kKGroup): score mode 2's (and mode 0's small
// calls'), and those of score modes 3 and 4 (mode 0 takes the first of them for wide calls).
// Measured (H200, cuda_indexer_bench, fp8 IndexerTopK, us, fp32 kernel / {3,2} / {4,8} / {3,8}):
// 8 x 4K 27.7 / 17.4 / 17.2 / 16.9; 64 x 16K 515 / 170 / 119 / 141; 8 x 128K 542 / 201 / 145 /
// 172; 64 x 128K 3826 / 896 / 773 / 779. Largest error / M (cuda_indexer_test, random data): fp32
// kernel ~1.3e-8, {3,2} ~1.5e-8, one chain (k_group 8) ~3.8e-8 (the tensor cores' fp32
// accumulation is not round-to-nearest); no chosen-set flips in any. By shape (score mode 0)
// {4,8} takes the calls where the score kernel is the bulk of the work (kWideRows / kWideKeys; on
// chunks for as many of its CTAs per SM as stay resident, at most 4) and {3,2} at look-ahead 2
// (registers for 2 CTAs per SM) the rest. Measured (H200, eleventh session): ncu with cold caches,
// 1 x 128K 20.4 us ({4,8}, 4 per SM) vs 23.3 ({2,2,2}, 2 per SM), 8 x 128K 94 vs 124; warm
// IndexerTopK 8 x 128K 119.2 vs 148.8, 1 x 4K 15.4 vs 14.9 (hence small calls stay); decode step
// (glm-bench-cuda-decode --ab idxwide) 8 x 128K 0.950 -> 0.914 ms/layer, 1 x 128K 0.252 -> 0.246.
struct TcVariant {
  int min_blocks, k_group;
};
constexpr TcVariant kTcVariants[3] = {{3, 2}, {4, 8}, {3, 8}};  // modes 2, 3, 4
constexpr int kWideVariant = 1;       // by shape: kTcVariants[1] where ...
constexpr int kWideRows = 8;          // ... a call has at least this many rows
constexpr int kWideKeys = 16 * 1024;  // ... or rows of more than this many keys
constexpr int kWideMaxCtasPerSm = 4;  // its registers allow no more

// Larger float -> larger key; -0.0 == +0.0; NaN lowest.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

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
  // fp8 key cache (IndexerTopKArgs::keys_fp8; kv_fp8_layout.h), or null.
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

// Adds the warp's digits (256: no bin) into hist_s [256]: one shared atomic per distinct digit
// (integer counts: the order does not matter). Used by the score and the select kernels.
__device__ __forceinline__ void WarpHistAdd(uint32_t digit, int lane, uint32_t* hist_s) {
  const uint32_t peers = __match_any_sync(0xffffffffu, digit);
  if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist_s[digit], __popc(peers));
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

// ---- Tensor-core score path (fp8 keys; IndexerScoreTcKernel) -------------------------------
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
constexpr int kTcDim = 128;           // index_head_dim the tensor-core path takes (GLM-5)
constexpr int kTcKsteps = kTcDim / 16;
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcNtiles = 4;                      // n-tiles of 8 keys per warp step
constexpr int kTcWarpKeys = 8 * kTcNtiles;        // 32
constexpr int kTcTileKeys = kTcWarps * kTcWarpKeys;  // 128 keys per CTA step
constexpr int kTcMaxChunk = 16 * kTcTileKeys;     // 2048 keys per CTA at most
constexpr int kTcSplits = 3;

// Query fragments: [kTcSplits][heads_pad / 16][kTcKsteps][32 lanes] uint4, then w [heads_pad].
int64_t TcSmemBytes(int heads_pad) {
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
  __trap();  // never launched below sm_80 (IndexerTopK checks the device)
#endif
}

// grid: rows * chunks; block kTcThreads; dynamic smem TcSmemBytes(heads_pad). Same output as
// IndexerScoreKernel<true> (scores row layout, optional top-byte histogram), dim == kTcDim.
// Warp w walks 32-key steps w * 32 + 128 i of the chunk on its own (no CTA barrier in the loop).
// kMinBlocks: registers capped for that many CTAs per SM (ptxas -v, sm_90a: {3,2} 168 registers,
// 20-byte spill; {4,8} 128, 12 bytes; {3,8} 168, none; {1,2} would take 252).
// kKGroup: k-steps (x 3 split terms) per tensor-core accumulation chain; the chains' sums are
// added in fp32 with round-to-nearest (the tensor cores' own fp32 accumulation may truncate, so
// shorter chains bound the error tighter). kTcKsteps = one chain.
// kAhead: what a warp has in flight while a step computes (the same arithmetic at every value):
// 0 nothing (each step waits for its slots, then for its key words); 1 the next step's slots and
// scales; 2 the next step's key words and the slots of the one after (32 more registers).
template <int kMinBlocks, int kKGroup, int kAhead>
__global__ void __launch_bounds__(kTcThreads, kMinBlocks) IndexerScoreTcKernel(ScoreParams p) {
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
  // kAhead (the loads in flight while a step computes): 0 = none; 1 = the next step's lookup;
  // 2 = the next step's key words and the lookup of the one after.
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
    } else if constexpr (kAhead == 1) {
      my_scale = next_scale;
      load_keys(next_voff, raw);
      lookup(key0 + kTcTileKeys, &next_voff, &next_scale);
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

// Exclusive scan of `v` over the block; *total gets the block sum. `warp_sums` holds 32 values.
__device__ __forceinline__ uint32_t BlockExclusiveScan(uint32_t v, uint32_t* warp_sums,
                                                       uint32_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x / 32;
    uint32_t ws = lane < nw ? warp_sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const uint32_t n = __shfl_up_sync(0xffffffffu, ws, o);
      if (lane >= o) ws += n;
    }
    if (lane < nw) warp_sums[lane] = ws;  // inclusive warp prefix
  }
  __syncthreads();
  const uint32_t warp_base = warp > 0 ? warp_sums[warp - 1] : 0u;
  *total = warp_sums[blockDim.x / 32 - 1];
  __syncthreads();  // warp_sums reusable
  return warp_base + incl - v;
}

// Loads the 16 scores [i0, i0 + 16) of a row of length n (i0 a multiple of 4, row 16-byte
// aligned); positions past n read as NaN (key 0, never counted: callers check i < n).
__device__ __forceinline__ void Load16(const float* s, int i0, int n, float (&v)[kItems]) {
#pragma unroll
  for (int j4 = 0; j4 < kItems / 4; ++j4) {
    const int i = i0 + 4 * j4;
    if (i + 3 < n) {
      const float4 x = *reinterpret_cast<const float4*>(s + i);
      v[4 * j4] = x.x, v[4 * j4 + 1] = x.y, v[4 * j4 + 2] = x.z, v[4 * j4 + 3] = x.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[4 * j4 + j] = i + j < n ? s[i + j] : __int_as_float(0x7fffffff);
    }
  }
}

// Given the histogram of the current digit (hist[d], d < 256, of the keys matching the prefix),
// picks the digit holding the `remaining`-th largest: *digit, the new remaining, and whether that
// bin holds exactly `remaining` keys (then the selection is complete). All threads call.
__device__ __forceinline__ void PickDigit(const uint32_t* hist, uint32_t remaining,
                                          uint32_t* warp_sums, uint32_t* sel) {
  const int tid = threadIdx.x;
  const uint32_t c = tid < 256 ? hist[255 - tid] : 0u;
  uint32_t total;
  const uint32_t before = BlockExclusiveScan(c, warp_sums, &total);
  if (tid < 256 && before < remaining && remaining <= before + c) {
    sel[0] = 255u - tid;
    sel[1] = remaining - before;
    sel[2] = c == remaining - before ? 1u : 0u;
  }
  __syncthreads();
}

// grid: rows; block kSelectThreads. row_hist: [rows, hist_passes, 256]: the histograms of the
// first hist_passes radix passes (1: the score kernel's top byte; 4: with IndexerHistKernel's).
__global__ void __launch_bounds__(kSelectThreads)
    IndexerSelectKernel(const float* scores, int64_t ld, const uint32_t* row_hist,
                        int hist_passes, const int32_t* row_num_keys, int top_k, int32_t* out) {
  PdlEnter();
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];  // digit, remaining, bin complete
  const int64_t t = blockIdx.x;
  const int n = row_num_keys[t];
  const int tid = threadIdx.x, lane = tid & 31;
  int32_t* o = out + t * top_k;
  if (n <= top_k) {
    for (int i = tid; i < top_k; i += kSelectThreads) o[i] = i < n ? i : -1;
    return;
  }
  const float* s = scores + t * ld;

  // Radix select: pass 0 from the score kernel's histogram, then passes over the row that
  // count only keys matching the prefix (warps with no match skip the histogram update).
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(top_k);
  for (int shift = 24, pass = 0; shift >= 0; shift -= 8, ++pass) {
    if (pass < hist_passes) {
      if (tid < 256) hist[tid] = row_hist[(t * hist_passes + pass) * 256 + tid];
    } else {
      if (tid < 256) hist[tid] = 0;
      __syncthreads();
      for (int base = 0; base < n; base += kSelectThreads * kItems) {
        float v[kItems];
        const int i0 = base + tid * kItems;
        Load16(s, i0, n, v);
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          const uint32_t u = OrderedKey(v[j]);
          const uint32_t digit =
              i0 + j < n && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
          if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, hist);
        }
      }
    }
    __syncthreads();
    PickDigit(hist, remaining, warp_sums, sel);
    prefix |= sel[0] << shift;
    mask |= 255u << shift;
    remaining = sel[1];
    const bool complete = sel[2] != 0;
    __syncthreads();  // sel and hist read by all before they are rewritten
    if (complete) break;  // every key of the chosen bin is taken: no need to refine it
  }

  // Every key whose masked value is above the prefix, plus the first `remaining` equal to it,
  // in ascending position order (block scan over tiles of kSelectThreads * kItems positions).
  const uint32_t need = remaining;
  const uint32_t num_gt = static_cast<uint32_t>(top_k) - need;
  uint32_t base_gt = 0, base_eq = 0;
  for (int base = 0; base < n; base += kSelectThreads * kItems) {
    float v[kItems];
    const int i0 = base + tid * kItems;
    Load16(s, i0, n, v);
    uint32_t gt_flags = 0, eq_flags = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const uint32_t u = OrderedKey(v[j]) & mask;
      if (i0 + j < n) {
        gt_flags |= (u > prefix ? 1u : 0u) << j;
        eq_flags |= (u == prefix ? 1u : 0u) << j;
      }
    }
    const uint32_t packed = (static_cast<uint32_t>(__popc(gt_flags)) << 16) | __popc(eq_flags);
    uint32_t total;
    const uint32_t excl = BlockExclusiveScan(packed, warp_sums, &total);
    uint32_t gt_before = base_gt + (excl >> 16), eq_before = base_eq + (excl & 0xffffu);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if ((gt_flags >> j) & 1u) {
        o[gt_before + min(eq_before, need)] = i0 + j;
        ++gt_before;
      } else if ((eq_flags >> j) & 1u) {
        if (eq_before < need) o[gt_before + eq_before] = i0 + j;
        ++eq_before;
      }
    }
    base_gt += total >> 16;
    base_eq += total & 0xffffu;
    if (base_gt == num_gt && base_eq >= need) break;  // uniform: block totals
  }
}

// ---- Short-row select: the whole row in shared memory ----------------------------------------

// Shared-memory word of row position i: one pad word after every 32, so that the per-thread
// segments below (thread j reads positions j * seg ...) hit distinct banks for power-of-2 seg.
__device__ __forceinline__ int PadIdx(int i) { return i + (i >> 5); }

// Warp 0 only: picks from hist[256] the digit holding the `remaining`-th largest key (lane l
// sums bins 255 - 8l .. 248 - 8l, one warp scan, then the lane that holds it walks its 8 bins).
// Writes sel = {digit, new remaining, bin taken whole}. No block barrier.
__device__ __forceinline__ void PickDigitWarp(const uint32_t* hist, uint32_t remaining,
                                              uint32_t* sel) {
  const int lane = threadIdx.x & 31;
  uint32_t c[8], sum = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    c[k] = hist[255 - 8 * lane - k];
    sum += c[k];
  }
  uint32_t incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  uint32_t before = incl - sum;
  if (before < remaining && remaining <= incl) {  // exactly one lane: the total is >= remaining
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (before < remaining && remaining <= before + c[k]) {
        sel[0] = 255u - 8u * lane - k;
        sel[1] = remaining - before;
        sel[2] = c[k] == remaining - before ? 1u : 0u;
      }
      before += c[k];
    }
  }
}

// grid: rows; block: a multiple of 32 in [256, 1024] (ShortSelectThreads); dynamic smem
// ShortSmemBytes(max num_keys), num_keys < 2^16. Loads the row once (float4, coalesced) as
// OrderedKey words into shared memory, building the pass-0 histogram on the way (no histogram
// from the score kernel, no memset). Then every radix pass and the ordered output read shared
// memory only: thread j owns positions [j * seg, (j + 1) * seg); per pass one barrier after the
// counting (warp-aggregated shared atomics into one of two alternating histograms) and one after
// warp 0 picks the digit (the other warps clear the next histogram meanwhile); stops when the
// chosen bin is taken whole. The output is one block scan of packed (greater, equal) counts per
// thread. Same output as IndexerSelectKernel, bit for bit.
__global__ void __launch_bounds__(1024)
    IndexerSelectShortKernel(const float* scores, int64_t ld, const int32_t* row_num_keys,
                             int top_k, int32_t* out) {
  PdlEnter();
  extern __shared__ uint32_t row_s[];  // [PadIdx(n)]
  __shared__ uint32_t hist[2][256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];  // digit, remaining, bin complete
  const int64_t t = blockIdx.x;
  const int n = row_num_keys[t];
  const int nt = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int32_t* o = out + t * top_k;
  if (n <= top_k) {
    for (int i = tid; i < top_k; i += nt) o[i] = i < n ? i : -1;
    return;
  }
  const float* s = scores + t * ld;
  for (int i = tid; i < 256; i += nt) hist[0][i] = 0;
  __syncthreads();
  // i0 < n <= ld and ld, i0 multiples of 4: the float4 stays inside the row's scratch.
  for (int base = 0; base < n; base += 4 * nt) {  // uniform trip count: full-warp shuffles
    const int i0 = base + 4 * tid;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i0 < n) x = *reinterpret_cast<const float4*>(s + i0);
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = i0 + j < n;
      const uint32_t u = OrderedKey(v[j]);
      if (ok) row_s[PadIdx(i0 + j)] = u;
      const uint32_t digit = ok ? u >> 24 : 256u;
      if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, hist[0]);
    }
  }
  __syncthreads();

  const int seg = (n + nt - 1) / nt;
  const int lo = tid * seg;  // may be >= n: then the thread owns nothing
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(top_k);
  for (int pass = 0, shift = 24;; ++pass, shift -= 8) {
    uint32_t* h = hist[pass & 1];
    if (pass > 0) {
      for (int j = 0; j < seg; ++j) {  // uniform trip count
        const int i = lo + j;
        const uint32_t u = i < n ? row_s[PadIdx(i)] : 0u;
        const uint32_t digit = i < n && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
        if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, h);
      }
      __syncthreads();
    }
    // hist[(pass + 1) & 1] was last read by the pick of pass - 1, before the last barrier.
    if (warp == 0) {
      PickDigitWarp(h, remaining, sel);
    } else {
      for (int i = tid - 32; i < 256; i += nt - 32) hist[(pass + 1) & 1][i] = 0;
    }
    __syncthreads();
    prefix |= sel[0] << shift;
    mask |= 255u << shift;
    remaining = sel[1];
    // sel is rewritten only after the next pass's counting barrier: every thread has read it.
    if (sel[2] != 0 || shift == 0) break;  // uniform
  }

  // Every key whose masked value is above the prefix, plus the first `need` equal to it, in
  // ascending position order: one block scan of (greater, equal) counts (n < 2^16: 16 bits each).
  const uint32_t need = remaining;
  uint32_t gt = 0, eq = 0;
  for (int j = 0; j < seg; ++j) {
    const int i = lo + j;
    if (i < n) {
      const uint32_t u = row_s[PadIdx(i)] & mask;
      gt += u > prefix ? 1u : 0u;
      eq += u == prefix ? 1u : 0u;
    }
  }
  uint32_t total;
  const uint32_t excl = BlockExclusiveScan((gt << 16) | eq, warp_sums, &total);
  uint32_t gt_before = excl >> 16, eq_before = excl & 0xffffu;
  if (gt == 0 && (eq == 0 || eq_before >= need)) return;
  for (int j = 0; j < seg; ++j) {
    const int i = lo + j;
    if (i >= n) break;
    const uint32_t u = row_s[PadIdx(i)] & mask;
    if (u > prefix) {
      o[gt_before + min(eq_before, need)] = i;
      ++gt_before;
    } else if (u == prefix) {
      if (eq_before < need) o[gt_before + eq_before] = i;
      ++eq_before;
    }
  }
}

// The radix select's prefix after the first `passes` 8-bit passes, from their complete
// histograms rh[pass][256] (the select kernel's derivation, PickDigit pass by pass): *prefix,
// *mask (the resolved bits) and *remaining (how many keys equal to the prefix are taken; in:
// top_k). Returns whether a pass took its bin whole (the selection is complete: it stops there).
// Every thread of a 256-thread CTA calls; h_s [256], warp_sums [32] and sel [3] are its scratch.
__device__ __forceinline__ bool PrefixFromHistograms(const uint32_t* rh, int passes, uint32_t* h_s,
                                                     uint32_t* warp_sums, uint32_t* sel,
                                                     uint32_t* prefix, uint32_t* mask,
                                                     uint32_t* remaining) {
  const int tid = threadIdx.x;
  uint32_t bins[kHistPasses];  // bin tid of every pass, loaded together (one L2 round trip)
#pragma unroll
  for (int q = 0; q < kHistPasses; ++q) bins[q] = q < passes ? rh[q * 256 + tid] : 0u;
#pragma unroll
  for (int q = 0; q < kHistPasses; ++q) {
    if (q >= passes) break;  // uniform
    const int sh = 24 - 8 * q;
    h_s[tid] = bins[q];
    __syncthreads();
    PickDigit(h_s, *remaining, warp_sums, sel);
    *prefix |= sel[0] << sh;
    *mask |= 255u << sh;
    *remaining = sel[1];
    const bool complete = sel[2] != 0;
    __syncthreads();            // sel and h_s read by all before they are rewritten
    if (complete) return true;  // uniform
  }
  return false;
}

// Radix pass `pass` (1..3, digit bits 24 - 8 pass ..) of the rows' selection, histogram built
// by many CTAs (pass 0 too, for IndexerSelectForTest). grid: rows * chunks; block kHistThreads.
// hist: [rows, row_passes, 256], passes before `pass` complete. Adds the counts of chunk c's
// keys (positions [c * chunk_len, ...)) that match the earlier passes' prefix into hist[t, pass];
// nothing once a pass before took its bin whole (then the select kernel stops there too).
__global__ void __launch_bounds__(kHistThreads)
    IndexerHistKernel(const float* scores, int64_t ld, uint32_t* hist,
                      const int32_t* row_num_keys, int top_k, int pass, int row_passes,
                      int chunks, int chunk_len) {
  PdlEnter();
  __shared__ uint32_t h_s[256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];
  const int64_t t = blockIdx.x / chunks;
  const int chunk = static_cast<int>(blockIdx.x % chunks);
  const int n = row_num_keys[t];
  const int64_t begin64 = int64_t{chunk} * chunk_len;
  if (n <= top_k || begin64 >= n) return;  // uniform over the CTA
  const int begin = static_cast<int>(begin64);
  const int end = static_cast<int>(min(int64_t{n}, begin64 + chunk_len));
  const int tid = threadIdx.x, lane = tid & 31;
  uint32_t* rh = hist + t * row_passes * 256;
  const float* s = scores + t * ld;
  // begin is a multiple of 4 and i0 < end <= ld (a multiple of 4): the float4 stays in the row.
  // The first step's scores are loaded before the prefix is derived (the two latencies overlap).
  float4 first = make_float4(0.f, 0.f, 0.f, 0.f);
  if (begin + 4 * tid < end) first = *reinterpret_cast<const float4*>(s + begin + 4 * tid);
  // The prefix of passes 0 .. pass - 1, as the select kernel derives it.
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(top_k);
  if (PrefixFromHistograms(rh, pass, h_s, warp_sums, sel, &prefix, &mask, &remaining)) return;
  h_s[tid] = 0;
  __syncthreads();
  const int shift = 24 - 8 * pass;
  for (int base = begin; base < end; base += 4 * kHistThreads) {
    const int i0 = base + 4 * tid;
    float4 x = first;
    if (base != begin) {
      x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i0 < end) x = *reinterpret_cast<const float4*>(s + i0);
    }
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t u = OrderedKey(v[j]);
      const uint32_t digit = i0 + j < end && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
      if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, h_s);
    }
  }
  __syncthreads();
  if (h_s[tid] != 0) atomicAdd(&rh[pass * 256 + tid], h_s[tid]);
}

// ---- Parallel ordered output of the multi-CTA passes ------------------------------------------

// Look-back word of an output chunk (IndexerOutputKernel), zero before the launch: bits 63..62
// the status (0 not yet, 1 the chunk's own counts, 2 the inclusive prefix of the row's chunks up
// to it), bits 61..31 the keys above the prefix, bits 30..0 the keys equal to it.
constexpr uint64_t kLbOwn = uint64_t{1} << 62, kLbInclusive = uint64_t{2} << 62;

__device__ __forceinline__ uint64_t LbWord(uint64_t status, uint32_t gt, uint32_t eq) {
  return status | (uint64_t{gt} << 31) | eq;
}

// grid: rows * chunks (chunk c of row t: positions [c * kOutChunk, (c + 1) * kOutChunk)); block
// kOutThreads; lookback: [rows * chunks] zero on entry. The ordered output pass of
// IndexerSelectKernel spread over the GPU: every CTA derives the row's final prefix from the 4
// complete histograms (PrefixFromHistograms), counts its keys above and equal to it (thread j:
// kOutItems consecutive positions, one block scan), publishes the counts, learns the counts of
// the row's chunks before it by a decoupled look-back (warp 0 reads 32 predecessors at a time and
// stops at the nearest inclusive prefix; a predecessor that has not published yet has a lower
// block index, so it is already running, and nothing it waits on waits on this CTA), then writes
// its keys at the positions IndexerSelectKernel would: the same output, bit for bit.
__global__ void __launch_bounds__(kOutThreads)
    IndexerOutputKernel(const float* scores, int64_t ld, const uint32_t* row_hist,
                        const int32_t* row_num_keys, int top_k, int chunks,
                        unsigned long long* lookback, int32_t* out) {
  static_assert(kOutThreads == 256, "PrefixFromHistograms: one thread per bin");
  PdlEnter();
  __shared__ uint32_t h_s[256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];
  __shared__ uint32_t before_s[2];  // keys above / equal to the prefix in the chunks before
  const int64_t t = blockIdx.x / chunks;
  const int c = static_cast<int>(blockIdx.x % chunks);
  const int n = row_num_keys[t];
  const int tid = threadIdx.x, lane = tid & 31;
  int32_t* o = out + t * top_k;
  if (n <= top_k) {  // uniform; nothing of this row looks back
    if (c == 0) {
      for (int i = tid; i < top_k; i += kOutThreads) o[i] = i < n ? i : -1;
    }
    return;
  }
  // This thread's positions, loaded before the prefix is derived (the two latencies overlap);
  // past n: neither above nor equal. i0 and ld are multiples of 4 and i0 + 3 < n <= ld keeps the
  // float4 inside the row.
  const float* s = scores + t * ld;
  const int64_t i0 = int64_t{c} * kOutChunk + kOutItems * tid;
  float v[kOutItems];
#pragma unroll
  for (int j4 = 0; j4 < kOutItems; j4 += 4) {
    const int64_t i = i0 + j4;
    if (i + 3 < n) {
      const float4 x = *reinterpret_cast<const float4*>(s + i);
      v[j4] = x.x, v[j4 + 1] = x.y, v[j4 + 2] = x.z, v[j4 + 3] = x.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j4 + j] = i + j < n ? s[i + j] : 0.f;
    }
  }
  uint32_t prefix = 0, mask = 0, need = static_cast<uint32_t>(top_k);
  PrefixFromHistograms(row_hist + t * kHistPasses * 256, kHistPasses, h_s, warp_sums, sel, &prefix,
                       &mask, &need);
  uint32_t gt_flags = 0, eq_flags = 0;
#pragma unroll
  for (int j = 0; j < kOutItems; ++j) {
    if (i0 + j < n) {
      const uint32_t u = OrderedKey(v[j]) & mask;
      gt_flags |= (u > prefix ? 1u : 0u) << j;
      eq_flags |= (u == prefix ? 1u : 0u) << j;
    }
  }
  uint32_t total;
  const uint32_t excl = BlockExclusiveScan(
      (static_cast<uint32_t>(__popc(gt_flags)) << 16) | __popc(eq_flags), warp_sums, &total);
  const uint32_t own_gt = total >> 16, own_eq = total & 0xffffu;

  unsigned long long* row_lb = lookback + t * chunks;
  if (tid < 32) {
    uint32_t gt_before = 0, eq_before = 0;
    if (c == 0) {
      if (lane == 0) atomicExch(&row_lb[0], LbWord(kLbInclusive, own_gt, own_eq));
    } else {
      if (lane == 0) atomicExch(&row_lb[c], LbWord(kLbOwn, own_gt, own_eq));
      for (int top = c - 1;; top -= 32) {  // warp-uniform
        const int idx = top - lane;        // lane 0: the nearest predecessor
        uint64_t w = kLbInclusive;         // before chunk 0: an empty inclusive prefix
        if (idx >= 0) {
          const volatile unsigned long long* p = row_lb + idx;
          do {
            w = *p;
          } while ((w >> 62) == 0);
        }
        const uint32_t inclusive = __ballot_sync(0xffffffffu, (w >> 62) == 2);
        const int stop = inclusive != 0 ? __ffs(inclusive) - 1 : 31;
        uint32_t g = lane <= stop ? static_cast<uint32_t>(w >> 31) & 0x7fffffffu : 0u;
        uint32_t e = lane <= stop ? static_cast<uint32_t>(w) & 0x7fffffffu : 0u;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          g += __shfl_xor_sync(0xffffffffu, g, off);
          e += __shfl_xor_sync(0xffffffffu, e, off);
        }
        gt_before += g;
        eq_before += e;
        if (inclusive != 0) break;
      }
      if (lane == 0) {
        atomicExch(&row_lb[c], LbWord(kLbInclusive, gt_before + own_gt, eq_before + own_eq));
      }
    }
    if (lane == 0) before_s[0] = gt_before, before_s[1] = eq_before;
  }
  __syncthreads();
  uint32_t gt_before = before_s[0] + (excl >> 16), eq_before = before_s[1] + (excl & 0xffffu);
#pragma unroll
  for (int j = 0; j < kOutItems; ++j) {
    if ((gt_flags >> j) & 1u) {
      o[gt_before + min(eq_before, need)] = static_cast<int32_t>(i0 + j);
      ++gt_before;
    } else if ((eq_flags >> j) & 1u) {
      if (eq_before < need) o[gt_before + eq_before] = static_cast<int32_t>(i0 + j);
      ++eq_before;
    }
  }
}

int64_t ScoreSmemBytes(int heads_pad, int dim_pad) {
  return int64_t{4} * (int64_t{kTileKeys} * dim_pad + int64_t{heads_pad} * (dim_pad + 1) +
                       heads_pad);
}

// Short-row select sizing: dynamic shared memory for a row of n keys (PadIdx layout), its static
// shared memory, and the longest row it takes (16-bit counts in the output scan).
int64_t ShortSmemBytes(int64_t n) { return 4 * (n + n / 32 + 1); }
constexpr int64_t kShortStaticSmem = 4 * (2 * 256 + 32 + 3);
constexpr int64_t kShortMaxKeys = 65535;

// Threads of the short-row select CTA: 0 = kSelectThreads (measured, H200, select alone on
// random scores, 1 x 4K keys: 256 / 512 / 1024 threads 9.7 / 7.0 / 6.3 us; 16K: 41.6 / 25.2 /
// 20.8 us); else forced by SetIndexerShortThreadsForBench.
std::atomic<int> g_short_threads{0};

int ShortSelectThreads() {
  const int forced = g_short_threads.load(std::memory_order_relaxed);
  return forced > 0 ? forced : kSelectThreads;
}

enum class SelectPath {
  kSingle,  // IndexerSelectKernel: radix passes 1..3 over the row from global memory
  kMulti,   // IndexerHistKernel x 3 over the whole GPU, then IndexerSelectKernel's output pass
  kShort,   // IndexerSelectShortKernel: the row once into shared memory, everything from there
};

// Modes (PathMode): 0 by shape, 1 legacy single-CTA passes, 2 multi-CTA passes, 3 short-row
// select wherever the row fits (else as 4), 4 the choice by shape before the short-row select
// existed (multi-CTA passes when rows < SM count and a row has more than one select step, else
// single-CTA passes).
SelectPath ChooseSelect(int64_t rows, int64_t max_keys, const detail::DeviceInfo& info) {
  const SelectPath before = rows < info.num_sms && max_keys > int64_t{kSelectThreads} * kItems
                                ? SelectPath::kMulti
                                : SelectPath::kSingle;
  // The row must fit the device's opt-in shared memory (H200: ~56K keys).
  const bool short_fits = max_keys <= kShortMaxKeys &&
                          ShortSmemBytes(max_keys) + kShortStaticSmem <= info.smem_optin;
  switch (PathMode()) {
    case 1:
      return SelectPath::kSingle;
    case 2:
      return SelectPath::kMulti;
    case 3:
      return short_fits ? SelectPath::kShort : before;
    case 4:
      return before;
    default:
      // By shape: the short-row select while a thread owns at most kItems keys (its passes cost
      // about 1 us per key a thread owns: measured, H200, select alone, 1 x 50K keys: 58 us vs
      // 36 us for the multi-CTA passes; 1 x 16K: 20.8 vs 21.6; 1 x 4K: 6.3 vs 12.8 single-CTA).
      return short_fits && detail::CeilDiv(max_keys, ShortSelectThreads()) <= kItems
                 ? SelectPath::kShort
                 : before;
  }
}

// Whether the tensor-core score kernel takes this call: fp8 keys, index_head_dim == kTcDim, a
// block_size that keeps every key row 16-byte aligned (a multiple of 4: 132-byte tokens), an
// sm_80+ device (mma.sync bf16), its query fragments within the opt-in shared memory, and the
// score mode (g_score_mode; by shape it stays off under GLM_CUDA_INDEXER_LEGACY=1).
bool UseTcScore(bool fp8, int dim, int block_size, int heads_pad, const detail::DeviceInfo& info) {
  const int mode = ScoreMode();
  if (!fp8 || dim != kTcDim || block_size % 4 != 0 || mode == 1 ||
      (mode == 0 && PathMode() == 1)) {
    return false;
  }
  if (TcSmemBytes(heads_pad) + 4 * 256 > info.smem_optin) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 8;
}

template <int kMinBlocks, int kKGroup, int kAhead>
absl::Status LaunchTcScoreAs(const ScoreParams& p, int64_t ctas, int64_t smem,
                             const detail::DeviceInfo& info, cudaStream_t stream) {
  static_assert(kTcKsteps % kKGroup == 0, "k-step groups must tile the k-steps");
  const auto kernel = IndexerScoreTcKernel<kMinBlocks, kKGroup, kAhead>;
  GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(kernel, smem, info, kOp));
  LaunchKernel(kernel, static_cast<unsigned>(ctas), kTcThreads, smem, stream, p);
  GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
  g_last_tc_kernel.store(kMinBlocks * 100 + kKGroup * 10 + kAhead, std::memory_order_relaxed);
  return absl::OkStatus();
}

// CTAs per SM of the wide variant that stay resident at `smem` bytes of dynamic shared memory
// (occupancy query: registers, shared memory per SM; a GB10 keeps 3 of its 25.7 KiB CTAs), in
// [1, kWideMaxCtasPerSm].
absl::StatusOr<int> WideResidentCtas(int64_t smem, const detail::DeviceInfo& info) {
  constexpr TcVariant v = kTcVariants[kWideVariant];
  const auto kernel = IndexerScoreTcKernel<v.min_blocks, v.k_group, 0>;
  GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(kernel, smem, info, kOp));
  // Cached per (kernel, device, smem): eager steps make no occupancy query per call.
  return std::clamp(detail::CachedCtasPerSm(kernel, kTcThreads, smem), 1, kWideMaxCtasPerSm);
}

// kTcVariants[variant]; the default variant at look-ahead `ahead` (g_score_ahead; 2 runs at 2
// CTAs per SM: ptxas -v, sm_90a, {3,2} spills 20 / 68 / 408 bytes at look-ahead 0 / 1 / 2, {2,2}
// none at 2), the others without (as measured in kTcVariants' comment).
absl::Status LaunchTcScore(int variant, int ahead, const ScoreParams& p, int64_t ctas, int64_t smem,
                           const detail::DeviceInfo& info, cudaStream_t stream) {
  constexpr TcVariant v0 = kTcVariants[0], v1 = kTcVariants[1], v2 = kTcVariants[2];
  switch (variant) {
    case 1:
      return LaunchTcScoreAs<v1.min_blocks, v1.k_group, 0>(p, ctas, smem, info, stream);
    case 2:
      return LaunchTcScoreAs<v2.min_blocks, v2.k_group, 0>(p, ctas, smem, info, stream);
    default:
      switch (ahead) {
        case 0:
          return LaunchTcScoreAs<v0.min_blocks, v0.k_group, 0>(p, ctas, smem, info, stream);
        case 1:
          return LaunchTcScoreAs<v0.min_blocks, v0.k_group, 1>(p, ctas, smem, info, stream);
        default:  // its second key buffer needs the registers of 2 CTAs per SM
          return LaunchTcScoreAs<2, v0.k_group, 2>(p, ctas, smem, info, stream);
      }
  }
}

int HistPasses(SelectPath path) { return path == SelectPath::kMulti ? kHistPasses : 1; }

// The multi-CTA passes' ordered output (SetIndexerOutputForBench): 0 = IndexerOutputKernel over
// the whole GPU (default), 1 = IndexerSelectKernel's single-CTA output pass (the previous one).
std::atomic<int> g_output_mode{0};
std::atomic<int64_t> g_indexer_generation{0};  // IndexerSettingsGeneration

bool ParallelOutput(SelectPath path) {
  return path == SelectPath::kMulti && g_output_mode.load(std::memory_order_relaxed) == 0;
}

int64_t OutputChunks(int64_t max_keys) { return detail::CeilDiv(max_keys, kOutChunk); }

// Zeroed scratch of a selection: the histograms [rows, HistPasses(path), 256] u32, then (parallel
// output) the look-back words [rows, OutputChunks] u64.
size_t SelectScratchBytes(SelectPath path, int64_t rows, int64_t max_keys) {
  size_t bytes = static_cast<size_t>(rows) * HistPasses(path) * 256 * 4;
  if (ParallelOutput(path)) bytes += static_cast<size_t>(rows) * OutputChunks(max_keys) * 8;
  return bytes;
}

// IndexerHistKernel chunks: ~2 CTAs per SM over all rows, a multiple of kHistChunkAlign keys each.
void HistChunks(int64_t rows, int64_t max_keys, const detail::DeviceInfo& info, int64_t* len,
                int64_t* chunks) {
  const int64_t per_row = std::max<int64_t>(1, detail::CeilDiv(int64_t{2} * info.num_sms, rows));
  *len = detail::CeilDiv(detail::CeilDiv(max_keys, per_row), kHistChunkAlign) * kHistChunkAlign;
  *chunks = detail::CeilDiv(max_keys, *len);
}

// The selection over scores [rows, ld] (ld a multiple of 4, rows 16-byte aligned, every row's
// num_keys <= ld). hist: SelectScratchBytes(path, ...) zeroed but for pass 0's histogram, complete
// (kSingle / kMulti; unused by kShort).
absl::Status LaunchSelect(SelectPath path, const float* scores, int64_t ld, uint32_t* hist,
                          int64_t rows, const int32_t* row_num_keys, int64_t max_keys, int top_k,
                          int32_t* out, const detail::DeviceInfo& info, cudaStream_t stream) {
  if (path == SelectPath::kShort) {
    const int threads = ShortSelectThreads();
    const int64_t smem = ShortSmemBytes(max_keys);
    GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(IndexerSelectShortKernel, smem, info, kOp));
    LaunchKernel(IndexerSelectShortKernel, static_cast<unsigned>(rows), threads, smem, stream,
                 scores, ld, row_num_keys, top_k, out);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    return absl::OkStatus();
  }
  if (path == SelectPath::kMulti) {
    int64_t hchunk_len = 0, hchunks = 0;
    HistChunks(rows, max_keys, info, &hchunk_len, &hchunks);
    for (int pass = 1; pass < kHistPasses; ++pass) {
      LaunchKernel(IndexerHistKernel, static_cast<unsigned>(rows * hchunks), kHistThreads, 0,
                   stream, scores, ld, hist, row_num_keys, top_k, pass, kHistPasses,
                   static_cast<int>(hchunks), static_cast<int>(hchunk_len));
      GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    }
    if (ParallelOutput(path)) {
      const int64_t chunks = OutputChunks(max_keys);
      if (rows * chunks > 0x7fffffff) {
        return absl::InvalidArgumentError(absl::StrCat("cuda IndexerTopK: ", rows * chunks,
                                                       " output CTAs exceed the grid limit"));
      }
      auto* lookback = reinterpret_cast<unsigned long long*>(hist + rows * kHistPasses * 256);
      LaunchKernel(IndexerOutputKernel, static_cast<unsigned>(rows * chunks), kOutThreads, 0,
                   stream, scores, ld, hist, row_num_keys, top_k, static_cast<int>(chunks),
                   lookback, out);
      GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
      return absl::OkStatus();
    }
  }
  LaunchKernel(IndexerSelectKernel, static_cast<unsigned>(rows), kSelectThreads, 0, stream, scores,
               ld, hist, HistPasses(path), row_num_keys, top_k, out);
  GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

// A/B hook for benches and tests (not in cuda_ops.h; declare it where used): mode 0 = by shape
// (the default), 1 = legacy single-CTA passes, 2 = multi-CTA passes wherever they apply, 3 = the
// short-row select wherever the row fits, 4 = the choice by shape before the short-row select;
// -1 = back to the environment's choice (GLM_CUDA_INDEXER_LEGACY).
void SetIndexerPathForBench(int mode) {
  const int v = mode < 0 ? -1 : mode;
  if (g_mode.exchange(v) != v) g_indexer_generation.fetch_add(1);
}

// A/B hook for benches and tests (not in cuda_ops.h): the multi-CTA passes' ordered output. 0 =
// IndexerOutputKernel over the whole GPU (the default), 1 = IndexerSelectKernel's single-CTA
// output pass; other values: back to 0.
void SetIndexerOutputForBench(int mode) {
  if (g_output_mode.exchange(mode == 1 ? 1 : 0) != (mode == 1 ? 1 : 0)) {
    g_indexer_generation.fetch_add(1);
  }
}

int64_t IndexerSettingsGeneration() { return g_indexer_generation.load(); }

// Bench hook: threads of the short-row select CTA (a multiple of 32 in [256, 1024]); 0 = the
// default (kSelectThreads).
void SetIndexerShortThreadsForBench(int threads) {
  const int v = threads >= 256 && threads <= 1024 && threads % 32 == 0 ? threads : 0;
  if (g_short_threads.exchange(v) != v) g_indexer_generation.fetch_add(1);
}

// Bench hook: IndexerScoreTcKernel's look-ahead, 0 / 1 / 2 (else back to kDefaultAhead).
void SetIndexerScoreAheadForBench(int ahead) {
  const int v = ahead >= 0 && ahead <= 2 ? ahead : kDefaultAhead;
  if (g_score_ahead.exchange(v) != v) g_indexer_generation.fetch_add(1);
}

// Bench hook: score-kernel CTAs per SM the key chunks aim at (1..16; else back to by shape).
void SetIndexerScoreCtasPerSmForBench(int ctas) {
  const int v = ctas >= 1 && ctas <= 16 ? ctas : 0;
  if (g_score_ctas_per_sm.exchange(v) != v) g_indexer_generation.fetch_add(1);
}

// Test hook: kMinBlocks * 100 + kKGroup * 10 + kAhead of the last tensor-core score launch.
int LastIndexerScoreKernelForTest() { return g_last_tc_kernel.load(std::memory_order_relaxed); }

// A/B hook for benches and tests (not in cuda_ops.h): the score kernel. 0 = by shape (the
// tensor-core kernel for fp8 keys at index_head_dim 128, except under GLM_CUDA_INDEXER_LEGACY=1 or
// path mode 1), 1 = the fp32 CUDA-core kernel always, 2 = the tensor-core kernel wherever it
// applies, 3 / 4 = as 2 with the kernel variants kTcVariants[1] / [2]; -1 = back to the
// environment's choice (GLM_CUDA_INDEXER_FP32_SCORE=1: mode 1, else 0).
void SetIndexerScorePathForBench(int mode) {
  const int v = mode >= 0 && mode <= 4 ? mode : -1;
  if (g_score_mode.exchange(v) != v) g_indexer_generation.fetch_add(1);
}

// Test hook (not in cuda_ops.h): the top-k selection alone, on given device scores [rows, ld]
// (the path of the current mode; pass 0's histogram from IndexerHistKernel where the path needs
// one). Same output contract as IndexerTopK for those scores.
absl::Status IndexerSelectForTest(const float* scores, int64_t ld, int64_t rows,
                                  const int32_t* row_num_keys, int32_t max_num_keys, int top_k,
                                  int32_t* out, Scratch& scratch, cudaStream_t stream) {
  if (rows == 0 || top_k <= 0) return absl::OkStatus();
  if (rows > 0x7fffffff || ld % 4 != 0 || ld < max_num_keys || !detail::Aligned16(scores)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda IndexerSelectForTest: scores [", rows, ", ", ld, "] need ld a multiple of 4 and >= ",
        "max_num_keys (", max_num_keys, "), 16-byte aligned data, rows < 2^31"));
  }
  GLM_ASSIGN_OR_RETURN(const detail::DeviceInfo info, detail::CurrentDeviceInfo(kOp));
  if (max_num_keys <= top_k) {
    LaunchKernel(IndexerSelectKernel, static_cast<unsigned>(rows), kSelectThreads, 0, stream,
                 nullptr, 0, nullptr, 1, row_num_keys, top_k, out);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    return absl::OkStatus();
  }
  const SelectPath path = ChooseSelect(rows, max_num_keys, info);
  uint32_t* hist = nullptr;
  if (path != SelectPath::kShort) {
    const size_t bytes = SelectScratchBytes(path, rows, max_num_keys);
    GLM_ASSIGN_OR_RETURN(void* h, scratch.Get(1, bytes));
    hist = static_cast<uint32_t*>(h);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaMemsetAsync(hist, 0, bytes, stream));
    int64_t len = 0, chunks = 0;
    HistChunks(rows, max_num_keys, info, &len, &chunks);
    LaunchKernel(IndexerHistKernel, static_cast<unsigned>(rows * chunks), kHistThreads, 0, stream,
                 scores, ld, hist, row_num_keys, top_k, 0, HistPasses(path),
                 static_cast<int>(chunks), static_cast<int>(len));
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
  }
  return LaunchSelect(path, scores, ld, hist, rows, row_num_keys, max_num_keys, top_k, out, info,
                      stream);
}

absl::Status IndexerTopK(const IndexerTopKArgs& a, Scratch& scratch, cudaStream_t stream) {
  const int64_t rows = a.q.rows;
  if (rows == 0 || a.top_k <= 0) return absl::OkStatus();
  if (a.keys.cols != a.q.dim || a.weights.cols < a.q.heads || a.weights.rows < rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda IndexerTopK: mismatched shapes: q [", rows, ", ", a.q.heads, ", ", a.q.dim,
        "], keys cols ", a.keys.cols, ", weights [", a.weights.rows, ", ", a.weights.cols, "]"));
  }
  if (rows > 0x7fffffff) {
    return absl::InvalidArgumentError("cuda IndexerTopK: more than 2^31 - 1 rows");
  }
  const int64_t max_keys = a.table.max_num_keys;
  const bool fp8 = a.keys_fp8.data != nullptr;
  if (fp8 && (a.keys_fp8.dim != a.q.dim || a.keys_fp8.block_size <= 0 ||
              !kv_fp8::IndexShapeOk(a.keys_fp8.dim) || !detail::Aligned16(a.keys_fp8.data))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda IndexerTopK: the fp8 key cache (dim ", a.keys_fp8.dim, ", block_size ",
        a.keys_fp8.block_size, ") needs dim == index_head_dim (", a.q.dim,
        "), a multiple of 4, and 16-byte aligned data"));
  }
  if (max_keys > a.top_k) {
    if (a.q.dim % 4 != 0 || a.q.dim == 0 ||
        (!fp8 && (a.keys.ld % 4 != 0 || !detail::Aligned16(a.keys.data)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda IndexerTopK: index_head_dim (", a.q.dim, ") and the key row stride (", a.keys.ld,
          ") must be multiples of 4 with 16-byte aligned keys (float4 loads)"));
    }
    GLM_ASSIGN_OR_RETURN(const detail::DeviceInfo info, detail::CurrentDeviceInfo(kOp));
    ScoreParams p{};
    p.q = a.q.data, p.q_rs = a.q.row_stride, p.q_hs = a.q.head_stride;
    p.q_vec = detail::Aligned16(a.q.data) && a.q.row_stride % 4 == 0 && a.q.head_stride % 4 == 0;
    p.w = a.weights.data, p.w_ld = a.weights.ld;
    p.keys = a.keys.data, p.keys_ld = a.keys.ld;
    p.slots = a.table.slots, p.row_offset = a.table.row_offset;
    p.row_num_keys = a.table.row_num_keys;
    p.heads = static_cast<int32_t>(a.q.heads), p.dim = static_cast<int32_t>(a.q.dim);
    p.dim_pad = static_cast<int32_t>(detail::CeilDiv(a.q.dim, 32) * 32);
    p.heads_pad = static_cast<int32_t>(detail::CeilDiv(a.q.heads, 32) * 32);
    p.top_k = a.top_k;
    // Chunks sized so that rows * chunks covers ~2 CTAs per SM (a batch-1 decode spreads its
    // row over the whole GPU), kTileKeys..kMaxChunk keys each.
    const int forced_ctas = g_score_ctas_per_sm.load(std::memory_order_relaxed);  // 0: by shape
    auto chunks_for = [&](int ctas_per_sm) {
      return std::max<int64_t>(1, detail::CeilDiv(int64_t{ctas_per_sm} * info.num_sms, rows));
    };
    const int64_t want_chunks = chunks_for(forced_ctas > 0 ? forced_ctas : 2);
    const int64_t chunk_len = std::clamp<int64_t>(
        detail::CeilDiv(detail::CeilDiv(max_keys, want_chunks), kTileKeys) * kTileKeys,
        kTileKeys, kMaxChunk);
    p.chunk_len = static_cast<int32_t>(chunk_len);
    p.chunks = static_cast<int32_t>(detail::CeilDiv(max_keys, chunk_len));
    p.keys8 = fp8 ? a.keys_fp8.data : nullptr;
    p.block_size = fp8 ? a.keys_fp8.block_size : 1;
    p.weight_scale = a.weight_scale, p.score_scale = a.score_scale;
    p.ld = detail::CeilDiv(max_keys, 4) * 4;
    GLM_ASSIGN_OR_RETURN(void* scores,
                         scratch.Get(0, static_cast<size_t>(rows * p.ld) * sizeof(float)));
    p.scores = static_cast<float*>(scores);
    // Measured, H200, batch 1: multi-CTA passes 128K keys 159 -> 96 us; at 4K keys the 3 extra
    // launches cost more than one select step saves. The short-row select takes every row that
    // fits shared memory and builds its own pass-0 histogram (no memset, no histogram here).
    const SelectPath path = ChooseSelect(rows, max_keys, info);
    p.hist = nullptr;
    p.hist_stride = 256 * HistPasses(path);
    if (path != SelectPath::kShort) {
      const size_t hist_bytes = SelectScratchBytes(path, rows, max_keys);
      GLM_ASSIGN_OR_RETURN(void* hist, scratch.Get(1, hist_bytes));
      p.hist = static_cast<uint32_t*>(hist);
      GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaMemsetAsync(hist, 0, hist_bytes, stream));
    }
    if (UseTcScore(fp8, p.dim, p.block_size, p.heads_pad, info)) {
      // Tensor-core path: chunks of kTcTileKeys..kTcMaxChunk keys for the variant's CTA target
      // (by shape: the wide variant for calls of many rows or long rows; kTcVariants' comment).
      const int mode = ScoreMode();
      const bool wide = mode == 0 && (rows >= kWideRows || max_keys > kWideKeys);
      const int variant = mode >= 3 ? mode - 2 : wide ? kWideVariant : 0;
      const int64_t tc_smem = TcSmemBytes(p.heads_pad);
      int64_t tc_want = want_chunks;
      if (wide && forced_ctas == 0) {
        GLM_ASSIGN_OR_RETURN(const int resident, WideResidentCtas(tc_smem, info));
        tc_want = chunks_for(resident);
      }
      const int64_t tc_len = std::clamp<int64_t>(
          detail::CeilDiv(detail::CeilDiv(max_keys, tc_want), kTcTileKeys) * kTcTileKeys,
          kTcTileKeys, kTcMaxChunk);
      ScoreParams tp = p;
      tp.chunk_len = static_cast<int32_t>(tc_len);
      tp.chunks = static_cast<int32_t>(detail::CeilDiv(max_keys, tc_len));
      const int64_t tc_ctas = rows * tp.chunks;
      if (tc_ctas > 0x7fffffff) {
        return absl::InvalidArgumentError(absl::StrCat("cuda IndexerTopK: ", tc_ctas,
                                                       " score CTAs exceed the grid limit"));
      }
      GLM_RETURN_IF_ERROR(LaunchTcScore(variant, g_score_ahead.load(std::memory_order_relaxed), tp,
                                        tc_ctas, tc_smem, info, stream));
      return LaunchSelect(path, p.scores, p.ld, p.hist, rows, a.table.row_num_keys, max_keys,
                          a.top_k, a.out, info, stream);
    }
    const int64_t smem = ScoreSmemBytes(p.heads_pad, p.dim_pad);
    GLM_RETURN_IF_ERROR(fp8 ? detail::UseDynamicSmem(IndexerScoreKernel<true>, smem, info, kOp)
                            : detail::UseDynamicSmem(IndexerScoreKernel<false>, smem, info, kOp));
    const int64_t ctas = rows * p.chunks;
    if (ctas > 0x7fffffff) {
      return absl::InvalidArgumentError(absl::StrCat("cuda IndexerTopK: ", ctas,
                                                     " score CTAs exceed the grid limit"));
    }
    if (fp8) {
      LaunchKernel(IndexerScoreKernel<true>, static_cast<unsigned>(ctas), kScoreThreads, smem,
                   stream, p);
    } else {
      LaunchKernel(IndexerScoreKernel<false>, static_cast<unsigned>(ctas), kScoreThreads, smem,
                   stream, p);
    }
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    return LaunchSelect(path, p.scores, p.ld, p.hist, rows, a.table.row_num_keys, max_keys,
                        a.top_k, a.out, info, stream);
  }
  LaunchKernel(IndexerSelectKernel, static_cast<unsigned>(rows), kSelectThreads, 0, stream, nullptr,
               0, nullptr, 1, a.table.row_num_keys, a.top_k, a.out);
  GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace glm::engine::cuda
