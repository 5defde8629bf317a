// DSA lightning indexer: scores + causal top-k (IndexerTopKArgs, backend.h), fp32.
//
// Two kernels.
// IndexerScoreKernel: I[t, s] = sum_h w[t, h] * weight_scale * relu(q[t, h] . k[s] * score_scale)
//   for s < num_keys(t), into scratch [rows, ld]. One CTA per (row, chunk of kChunk keys); the
//   row's queries sit in shared memory (row stride dim + 1: conflict-free when lane = head), the
//   chunk goes through shared memory kTileKeys keys at a time (coalesced float4 loads through
//   slots). Lane = head (32 heads per pass, more heads loop), each warp scores 8 keys of the tile:
//   per 32-dim slice the lane keeps its head's 32 query values in registers and reads the keys
//   as broadcast float4s; relu, weight and a warp sum finish each key.
// IndexerSelectKernel: one CTA (1024 threads) per row. Exact radix select on the order-preserving
//   uint32 image of the scores (4 passes of 8 bits, warp-aggregated shared-memory histograms)
//   finds the k-th largest value T and how many of the values equal to T are taken; a last
//   ordered pass (block scan) writes every position with score > T plus the lowest-position ties,
//   in ascending position order: exactly the CPU backend's output, ties to the lower position.
//   Rows with num_keys <= top_k get 0..num_keys-1 then -1 without scoring.
// Limits: index_head_dim a multiple of 4 (float4 loads) with 16-byte aligned q / keys and
//   strides that are multiples of 4; the queries (ceil(heads / 32) * 32 x (dim + 1) floats) plus
//   one key tile must fit the device's shared memory (GLM-5: 32 x 128 -> ~49 KiB). num_keys up to
//   2^31 - 1; one CTA selects a row, so a decode step with few very long rows is bound by one SM
//   reading its row 5 times from L2 (~20 us for 128K keys on an H200, see bench). -0.0 ranks
//   equal to +0.0; NaN ranks below -inf.
// NOTE: shared memory is sized from the device's opt-in limit, never a fixed chip constant.
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>

#include "common/status_util.h"
#include "engine/backend/cuda/cuda_ops_util.h"

namespace glm::engine::cuda {
namespace {

constexpr const char* kOp = "IndexerTopK";
constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
constexpr int kKeysPerWarp = 8;
constexpr int kTileKeys = kScoreWarps * kKeysPerWarp;  // 64
constexpr int kChunk = 8 * kTileKeys;                   // keys per CTA
constexpr int kSelectThreads = 1024;
constexpr int kItemsPerThread = 4;

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
  int32_t heads, dim, dim_pad, heads_pad, top_k, chunks;
  float weight_scale, score_scale;
  float* scores;  // [rows, ld]
  int64_t ld;
};

// grid: rows * chunks; block kScoreThreads; dynamic smem ScoreSmemBytes.
__global__ void __launch_bounds__(kScoreThreads) IndexerScoreKernel(ScoreParams p) {
  extern __shared__ __align__(16) float smem[];
  const int qstride = p.dim_pad + 1;
  float* k_s = smem;                                  // [kTileKeys][dim_pad]
  float* q_s = k_s + kTileKeys * p.dim_pad;           // [heads_pad][dim_pad + 1]
  float* w_s = q_s + p.heads_pad * qstride;           // [heads_pad]

  const int64_t t = blockIdx.x / p.chunks;
  const int chunk = static_cast<int>(blockIdx.x % p.chunks);
  const int num_keys = p.row_num_keys[t];
  const int begin = chunk * kChunk;
  if (num_keys <= p.top_k || begin >= num_keys) return;  // uniform over the CTA
  const int end = min(num_keys, begin + kChunk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int i = tid; i < p.heads_pad * qstride; i += kScoreThreads) {
    const int h = i / qstride, d = i % qstride;
    q_s[i] = h < p.heads && d < p.dim ? p.q[t * p.q_rs + h * p.q_hs + d] : 0.f;
  }
  for (int h = tid; h < p.heads_pad; h += kScoreThreads) {
    w_s[h] = h < p.heads ? p.w[t * p.w_ld + h] * p.weight_scale : 0.f;
  }
  const int32_t* slots = p.slots + p.row_offset[t];
  const int dp4 = p.dim_pad / 4, d4 = p.dim / 4;

  for (int tile = begin; tile < end; tile += kTileKeys) {
    __syncthreads();  // previous tile consumed; q_s / w_s written
    for (int i = tid; i < kTileKeys * dp4; i += kScoreThreads) {
      const int kk = i / dp4, c = i % dp4, s = tile + kk;
      float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s < end && c < d4) {
        val = reinterpret_cast<const float4*>(p.keys + int64_t{slots[s]} * p.keys_ld)[c];
      }
      reinterpret_cast<float4*>(k_s)[i] = val;
    }
    __syncthreads();

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
          const float4* kp =
              reinterpret_cast<const float4*>(k_s + (warp * kKeysPerWarp + kk) * p.dim_pad + c);
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
#pragma unroll
    for (int kk = 0; kk < kKeysPerWarp; ++kk) {
      const int s = tile + warp * kKeysPerWarp + kk;
      if (lane == kk && s < end) p.scores[t * p.ld + s] = score[kk];
    }
  }
}

// Larger float -> larger key; -0.0 == +0.0; NaN lowest.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
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

// grid: rows; block kSelectThreads.
__global__ void __launch_bounds__(kSelectThreads)
    IndexerSelectKernel(const float* scores, int64_t ld, const int32_t* row_num_keys, int top_k,
                        int32_t* out) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel_digit, sel_remaining;
  const int64_t t = blockIdx.x;
  const int n = row_num_keys[t];
  const int tid = threadIdx.x, lane = tid & 31;
  int32_t* o = out + t * top_k;
  if (n <= top_k) {
    for (int i = tid; i < top_k; i += kSelectThreads) o[i] = i < n ? i : -1;
    return;
  }
  const float* s = scores + t * ld;

  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(top_k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kSelectThreads) hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += kSelectThreads) {
      const int i = base + tid;
      uint32_t digit = 256;  // no bin
      if (i < n) {
        const uint32_t u = OrderedKey(s[i]);
        if ((u & mask) == prefix) digit = (u >> shift) & 255u;
      }
      const uint32_t peers = __match_any_sync(0xffffffffu, digit);
      if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    // Descending digits: thread i looks at digit 255 - i.
    uint32_t c = 0;
    if (tid < 256) c = hist[255 - tid];
    uint32_t total;
    const uint32_t before = BlockExclusiveScan(c, warp_sums, &total);
    if (tid < 256 && before < remaining && remaining <= before + c) {
      sel_digit = 255u - tid;
      sel_remaining = remaining - before;
    }
    __syncthreads();
    prefix |= sel_digit << shift;
    mask |= 255u << shift;
    remaining = sel_remaining;
    __syncthreads();  // sel_* read by all before the next pass writes them
  }
  // prefix = key of the k-th largest; take every key > prefix and the first `remaining` equal.
  const uint32_t need = remaining;
  uint32_t base_gt = 0, base_eq = 0;
  const uint32_t num_gt = static_cast<uint32_t>(top_k) - need;
  for (int base = 0; base < n; base += kSelectThreads * kItemsPerThread) {
    const int i0 = base + tid * kItemsPerThread;
    uint32_t gt_flags = 0, eq_flags = 0;
#pragma unroll
    for (int j = 0; j < kItemsPerThread; ++j) {
      if (i0 + j < n) {
        const uint32_t u = OrderedKey(s[i0 + j]);
        gt_flags |= (u > prefix ? 1u : 0u) << j;
        eq_flags |= (u == prefix ? 1u : 0u) << j;
      }
    }
    const uint32_t packed = (static_cast<uint32_t>(__popc(gt_flags)) << 16) | __popc(eq_flags);
    uint32_t total;
    const uint32_t excl = BlockExclusiveScan(packed, warp_sums, &total);
    uint32_t gt_before = base_gt + (excl >> 16), eq_before = base_eq + (excl & 0xffffu);
#pragma unroll
    for (int j = 0; j < kItemsPerThread; ++j) {
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

int64_t ScoreSmemBytes(int heads_pad, int dim_pad) {
  return int64_t{4} * (int64_t{kTileKeys} * dim_pad + int64_t{heads_pad} * (dim_pad + 1) +
                       heads_pad);
}

}  // namespace

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
  if (max_keys > a.top_k) {
    if (a.q.dim % 4 != 0 || a.q.dim == 0 || a.keys.ld % 4 != 0 || !detail::Aligned16(a.keys.data)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda IndexerTopK: index_head_dim (", a.q.dim, ") and the key row stride (", a.keys.ld,
          ") must be multiples of 4 with 16-byte aligned keys (float4 loads)"));
    }
    GLM_ASSIGN_OR_RETURN(const detail::DeviceInfo info, detail::CurrentDeviceInfo(kOp));
    ScoreParams p{};
    p.q = a.q.data, p.q_rs = a.q.row_stride, p.q_hs = a.q.head_stride;
    p.w = a.weights.data, p.w_ld = a.weights.ld;
    p.keys = a.keys.data, p.keys_ld = a.keys.ld;
    p.slots = a.table.slots, p.row_offset = a.table.row_offset;
    p.row_num_keys = a.table.row_num_keys;
    p.heads = static_cast<int32_t>(a.q.heads), p.dim = static_cast<int32_t>(a.q.dim);
    p.dim_pad = static_cast<int32_t>(detail::CeilDiv(a.q.dim, 32) * 32);
    p.heads_pad = static_cast<int32_t>(detail::CeilDiv(a.q.heads, 32) * 32);
    p.top_k = a.top_k;
    p.chunks = static_cast<int32_t>(detail::CeilDiv(max_keys, kChunk));
    p.weight_scale = a.weight_scale, p.score_scale = a.score_scale;
    p.ld = detail::CeilDiv(max_keys, 4) * 4;
    GLM_ASSIGN_OR_RETURN(void* scores,
                         scratch.Get(0, static_cast<size_t>(rows * p.ld) * sizeof(float)));
    p.scores = static_cast<float*>(scores);
    const int64_t smem = ScoreSmemBytes(p.heads_pad, p.dim_pad);
    GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(IndexerScoreKernel, smem, info, kOp));
    const int64_t ctas = rows * p.chunks;
    if (ctas > 0x7fffffff) {
      return absl::InvalidArgumentError(absl::StrCat("cuda IndexerTopK: ", ctas,
                                                     " score CTAs exceed the grid limit"));
    }
    IndexerScoreKernel<<<static_cast<unsigned>(ctas), kScoreThreads, smem, stream>>>(p);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    IndexerSelectKernel<<<static_cast<unsigned>(rows), kSelectThreads, 0, stream>>>(
        p.scores, p.ld, a.table.row_num_keys, a.top_k, a.out);
  } else {
    IndexerSelectKernel<<<static_cast<unsigned>(rows), kSelectThreads, 0, stream>>>(
        nullptr, 0, a.table.row_num_keys, a.top_k, a.out);
  }
  GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace glm::engine::cuda
