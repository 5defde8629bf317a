// Token-group kernels of the routed experts (kernels/moe_grouped.h): the default for
// kMoeDecodeMaxPairs < pairs <= kMoeGroupedMaxPairs (decode batches 9..512 with top-8; also bf16
// experts at <= 64 pairs, and fp32 / bf16 ones up to 4096 where fp8 takes moe_mma.h).
//
// MoeListRouteKernel (one CTA) builds deterministic device token lists: the distinct valid
// experts in ascending id order (slots), each slot's row range, and its rows = its pairs in
// ascending pair order (rank of pair i = number of pairs j < i with the same id: no atomics in
// the order; integer atomics only count); each slot's rows split into token groups (units) of
// up to kGroupMaxTokens rows. The tensor-core kernels (moe_mma.cuh) read the same lists.
//
// MoeGroupKernel<kFused, kWT>: a task is (unit, column group): a unit is up to kGroupMaxTokens
// rows of one expert (a slot's rows split into near-equal units, so a hot expert's rows spread
// over several warps that read the same weight rows at about the same time: one HBM read, the
// rest L2 hits), and the task streams its kDecWRows weight rows once: each 4-value piece is
// widened once (fp8: times the row block's scale, the CPU's dequantized value) and applied to
// all of the unit's token rows (acc[token row][weight row] in registers; the unit's row count
// picks a 1 / 2 / 4-row instantiation, rows past the count skipped warp-uniformly). So an expert
// with T rows costs ceil(T / 4) passes over its weights, not T. Weight chunks come through a
// per-warp cp.async ring in shared memory, kGrpStages deep: lane l copies chunk l + 32 i of each
// row into its own 16-byte slots and reads back only those, so the ring needs no barrier, only
// cp.async.wait_group; the ring runs across task boundaries (the next task's first chunks are
// in flight during the current task's last ones and its epilogue). x / act rows come through L1
// (__ldg; neighbouring warps usually share the unit). Epilogue: DecodeEpilogue (act / y by
// pair), then the pair-indexed combine (moe.cuh). fp32 accumulation in a fixed order, no atomics.
// Shared memory: kGrpStages x kDecWRows x 512 bytes = 8 KiB per warp; CTAs of up to kGrpWarps
// warps (fewer where the device's per-block shared memory is short), grid from the occupancy
// with that shared memory and the SM count.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/launch.cuh"
#include "kernels/load_util.cuh"
#include "kernels/moe_common.cuh"
#include "kernels/moe_grouped.h"

namespace glm::kernels::moe {

using detail::AsyncCommit;
using detail::AsyncCopy16;
using detail::AsyncWait;

// grid 1, block kRouteThreads (>= num_experts: one scan element per thread); pairs <=
// kMoeGroupedMaxPairs; group_tokens >= 1.
__global__ void __launch_bounds__(kRouteThreads)
    MoeListRouteKernel(const int32_t* ids, int pairs, int num_experts, int group_tokens,
                       int32_t* n_active, int32_t* slot_expert, int32_t* slot_off,
                       int32_t* row_pair, int32_t* n_units, int32_t* unit_expert,
                       int32_t* unit_off) {
  PdlEnter();
  __shared__ int s_ids[kMoeGroupedMaxPairs];
  __shared__ int cnt[kMaxExperts];
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  for (int e = tid; e < num_experts; e += kRouteThreads) cnt[e] = 0;
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = ids[i];
    s_ids[i] = e >= 0 && e < num_experts ? e : -1;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    if (s_ids[i] >= 0) atomicAdd(&cnt[s_ids[i]], 1);
  }
  __syncthreads();
  const int c = tid < num_experts ? cnt[tid] : 0;
  int total_rows, active;
  const int row0 = BlockExclusiveScan(c, warp_sums, &total_rows);
  const int slot = BlockExclusiveScan(c > 0 ? 1 : 0, warp_sums, &active);
  const int g = (c + group_tokens - 1) / group_tokens;  // this expert's units
  int units;
  const int unit0 = BlockExclusiveScan(g, warp_sums, &units);
  if (tid < num_experts) {
    cnt[tid] = row0;  // only thread tid reads cnt[tid] above
    if (c > 0) slot_expert[slot] = tid, slot_off[slot] = row0;
    for (int j = 0; j < g; ++j) {
      unit_expert[unit0 + j] = tid;
      unit_off[unit0 + j] = row0 + j * c / g;
    }
  }
  if (tid == 0) {
    *n_active = active, slot_off[active] = total_rows;
    *n_units = units, unit_off[units] = total_rows;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = s_ids[i];
    if (e < 0) continue;
    int rank = 0;
    for (int j = 0; j < i; ++j) rank += s_ids[j] == e;
    row_pair[cnt[e] + rank] = i;
  }
}

// Piece j (values 4j..4j+3) of a 16-byte weight chunk, widened (fp8: unscaled).
template <int kWT>
__device__ __forceinline__ float4 WidenPiece(const uint4& q, int j) {
  if constexpr (kWT == kWF32) {
    return make_float4(__uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z),
                       __uint_as_float(q.w));
  } else if constexpr (kWT == kWBF16) {
    const unsigned lo_w = j == 0 ? q.x : q.z, hi_w = j == 0 ? q.y : q.w;
    __nv_bfloat162 lo, hi;
    memcpy(&lo, &lo_w, 4);
    memcpy(&hi, &hi_w, 4);
    const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
    return make_float4(a.x, a.y, b.x, b.y);
  } else {
    __nv_fp8x4_e4m3 h;
    h.__x = kernels::detail::Word4(q, j);
    return static_cast<float4>(h);
  }
}

// acc[r][m] += x . w[m] over one piece for the token rows r < ng (warp-uniform); fp8: the piece's
// 4-term dot times the row's block scale (sc0: rows m < kDecWRows / 2, sc1: the others), so a
// row's arithmetic is the same whatever the other rows of its unit.
template <int kWT, int kNG>
__device__ __forceinline__ void PieceFma(const float* a, const int (&a_off)[kNG], int k, int ng,
                                         const float4 (&wv)[kDecWRows], float sc0, float sc1,
                                         float (&acc)[kNG][kDecWRows]) {
#pragma unroll
  for (int r = 0; r < kNG; ++r) {
    if (r < ng) {  // warp-uniform
      const float4 xv = __ldg(reinterpret_cast<const float4*>(a + a_off[r] + k));
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) {
        if constexpr (kWT == kWFP8) {
          float d = xv.x * wv[m].x;
          d = fmaf(xv.y, wv[m].y, d);
          d = fmaf(xv.z, wv[m].z, d);
          d = fmaf(xv.w, wv[m].w, d);
          acc[r][m] = fmaf(d, m < kDecWRows / 2 ? sc0 : sc1, acc[r][m]);
        } else {
          float v = acc[r][m];
          v = fmaf(xv.x, wv[m].x, v);
          v = fmaf(xv.y, wv[m].y, v);
          v = fmaf(xv.z, wv[m].z, v);
          acc[r][m] = fmaf(xv.w, wv[m].w, v);
        }
      }
    }
  }
}

// The producer side of a warp's ring: the next item to copy (task t, chunk iteration i, ring
// slot) and task t's weight rows.
struct GroupRing {
  int t, i, slot;
  const char* wr[kDecWRows];
};

// The work of one warp: tasks gw, gw + W, ... of `tasks`; each task iters chunk iterations.
struct GroupWork {
  int tasks, groups, iters, nchunks, num_warps, lane;
  uint4* ring;  // this warp's ring, offset by lane: slot (s, m) at ring[(s * kDecWRows + m) * 32]
};

// Copies the next item's chunks (if any; an empty group otherwise, so counts stay uniform).
template <bool kFused, int kWT>
__device__ __forceinline__ void GroupIssue(const DecodeParams& p, const DecodeLists& l,
                                           const GroupWork& w, GroupRing& g) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  if (g.t < w.tasks) {
    if (g.i == 0) {
      const int u = g.t / w.groups, n0 = (g.t - u * w.groups) * kCols;
      const char *w0, *w1;
      int64_t ld0, ld1;
      const float *s0 = nullptr, *s1 = nullptr;
      TaskWeights<kFused, kWT>(p.experts[l.unit_expert[u]], n0, w0, ld0, w1, ld1, s0, s1);
      TaskRows<kFused>(p.n, w0, ld0, w1, ld1, n0, g.wr);
    }
    const int c = w.lane + 32 * g.i;
    if (c < w.nchunks) {
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) {
        AsyncCopy16(
            static_cast<unsigned>(__cvta_generic_to_shared(w.ring + (g.slot * kDecWRows + m) * 32)),
            g.wr[m] + int64_t{c} * 16);
      }
    }
    if (++g.i == w.iters) g.i = 0, g.t += w.num_warps;
  }
  AsyncCommit();
  g.slot = g.slot + 1 == kGrpStages ? 0 : g.slot + 1;
}

// Task t (unit t / groups) for up to kNG token rows: consumes its iters ring items (slot:
// the consumer's ring slot), issuing the item kGrpStages - 1 ahead before each.
template <bool kFused, int kWT, int kNG>
__device__ __forceinline__ void GroupTask(const DecodeParams& p, const DecodeLists& l,
                                          const GroupWork& w, GroupRing& g, int& slot, int t) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  constexpr int kV = 16 / ElemBytes(kWT);
  constexpr int kPieces = kV / 4;
  const int lane = w.lane;
  const int u = t / w.groups, n0 = (t - u * w.groups) * kCols;
  const int r0 = l.unit_off[u], ng = l.unit_off[u + 1] - r0;  // 1..kNG
  const float *s0 = nullptr, *s1 = nullptr;
  if constexpr (kWT == kWFP8) {
    const char *w0, *w1;
    int64_t ld0, ld1;
    TaskWeights<kFused, kWT>(p.experts[l.unit_expert[u]], n0, w0, ld0, w1, ld1, s0, s1);
  }
  const int my_pair = lane < ng ? l.row_pair[r0 + lane] : 0;
  // Element offsets of the token rows in p.a (< 2^31: host-checked).
  int a_off[kNG];
#pragma unroll
  for (int r = 0; r < kNG; ++r) {
    const int pair = __shfl_sync(0xffffffffu, my_pair, r < ng ? r : 0);
    a_off[r] = (kFused ? pair / p.top_k : pair) * static_cast<int>(p.a_ld);
  }
  float acc[kNG][kDecWRows];
#pragma unroll
  for (int r = 0; r < kNG; ++r)
#pragma unroll
    for (int m = 0; m < kDecWRows; ++m) acc[r][m] = 0.f;

  for (int i = 0; i < w.iters; ++i) {
    GroupIssue<kFused, kWT>(p, l, w, g);
    AsyncWait<kGrpStages - 1>();  // this lane's copies of item i have landed
    const int c = lane + 32 * i;
    if (c < w.nchunks) {
      uint4 raw[kDecWRows];
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) raw[m] = w.ring[(slot * kDecWRows + m) * 32];
      float sc0 = 1.f, sc1 = 1.f;
      if constexpr (kWT == kWFP8) {
        sc0 = __ldg(s0 + ((c * kV) >> 7));
        sc1 = __ldg(s1 + ((c * kV) >> 7));
      }
      // All pieces unrolled (loads in flight together; no spills at 4 token rows).
#pragma unroll
      for (int j = 0; j < kPieces; ++j) {
        float4 wv[kDecWRows];
#pragma unroll
        for (int m = 0; m < kDecWRows; ++m) wv[m] = WidenPiece<kWT>(raw[m], j);
        PieceFma<kWT, kNG>(p.a, a_off, c * kV + 4 * j, ng, wv, sc0, sc1, acc);
      }
    }
    slot = slot + 1 == kGrpStages ? 0 : slot + 1;
  }
  int pair_of[kNG];
#pragma unroll
  for (int r = 0; r < kNG; ++r) pair_of[r] = __shfl_sync(0xffffffffu, my_pair, r < ng ? r : 0);
  DecodeEpilogue<kFused, kNG>(p, acc, pair_of, ng, n0, lane);
}

// grid: persistent (see LaunchGroup); block: up to kGrpWarps warps; dynamic smem warps x
// kGrpWarpSmem.
// 2 CTAs per SM (128 registers; at 1 CTA per SM without the cap, 164 to 184 registers, fp8 was
// 1.6-1.9x slower at 16..64 tokens).
template <bool kFused, int kWT>
__global__ void __launch_bounds__(kGrpWarps * 32, 2) MoeGroupKernel(DecodeParams p, DecodeLists l) {
  PdlEnter();
  extern __shared__ __align__(16) uint4 grp_ring[];
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
  GroupWork w;
  w.lane = threadIdx.x & 31;
  w.ring = grp_ring + warp * (kGrpStages * kDecWRows * 32) + w.lane;
  w.num_warps = gridDim.x * warps;
  w.groups = (p.n + kCols - 1) / kCols;
  w.tasks = *l.n_units * w.groups;
  w.nchunks = p.k / (16 / ElemBytes(kWT));
  w.iters = (w.nchunks + 31) / 32;
  const int gw = blockIdx.x * warps + warp;
  GroupRing g;
  g.t = gw, g.i = 0, g.slot = 0;
#pragma unroll
  for (int s = 0; s < kGrpStages - 1; ++s) GroupIssue<kFused, kWT>(p, l, w, g);
  int slot = 0;
  for (int t = gw; t < w.tasks; t += w.num_warps) {
    const int u = t / w.groups;
    const int ng = l.unit_off[u + 1] - l.unit_off[u];
    static_assert(kGroupMaxTokens == 4, "the dispatch below");
    if (ng <= 1) {
      GroupTask<kFused, kWT, 1>(p, l, w, g, slot, t);
    } else if (ng == 2) {
      GroupTask<kFused, kWT, 2>(p, l, w, g, slot, t);
    } else {
      GroupTask<kFused, kWT, 4>(p, l, w, g, slot, t);
    }
  }
  AsyncWait<0>();
}

}  // namespace glm::kernels::moe
