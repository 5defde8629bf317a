// moe_route: one warp per token row (RouteRowWarp; MoeRouteWarpKernel runs kMoeRouteWarps rows per
// CTA, and the CUDA MoE decode kernel routes few-token batches itself with it), no block-wide
// barriers.
// Lane l holds experts e = l + 32 i (i < kP, kP = 8 for <= 256 experts, else 32) in registers:
// score s = sigmoid(logit) and choice c = s + bias. Group filtering (n_group > 1, topk_group <
// n_group) goes through the warp's shared-memory slice: lane g sums the top-2 choices of group g
// (sequentially, any group size), the topk_group groups are taken by warp-wide argmax rounds
// over (group score desc, group asc) and the choices of the other groups become -inf. The top_k
// experts are then taken one per round: each lane offers its best untaken (choice desc, expert
// asc) as an order-preserving 32-bit key, two redux.sync give the warp's best key and the lowest
// expert holding it, the owner marks it taken (two redux.sync per round instead of a 5-step
// shuffle butterfly of (value, index, score)). This reproduces the CPU's
// partial_sort order exactly, including -inf choices of filtered groups when top_k exceeds the
// experts left. Lane 0 sums the chosen scores in choice order (the CPU's fp32 rounding).
// Limits: num_experts <= kMoeRouteMaxExperts, top_k <= kMoeRouteMaxTopK.
#pragma once

#include <cstdint>

#include "kernels/launch.cuh"
#include "kernels/moe_route.h"

namespace glm::kernels::detail {

inline constexpr int kMoeRouteWarps = 4;
inline constexpr int kNoExpert = 0x7fffffff;

// (v, i) comes before (bv, bi): larger value, then lower index; bi == kNoExpert is empty.
__device__ __forceinline__ bool RouteBefore(float v, int i, float bv, int bi) {
  if (i == kNoExpert) return false;
  if (bi == kNoExpert) return true;
  return v > bv || (v == bv && i < bi);
}

// A 32-bit key that orders floats like RouteBefore's `v > bv` (larger float, larger key; -0 and
// +0 equal), 1 for NaN (after every number) and never 0 (0 marks "no expert left").
__device__ __forceinline__ unsigned RouteKey(float v) {
  if (v != v) return 1u;
  if (v == 0.0f) v = 0.0f;  // -0 == +0
  const unsigned u = __float_as_uint(v);
  const unsigned k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k < 2u ? 2u : k;  // only NaN patterns map below 2
}

// Warp-wide best (value, index, payload) under RouteBefore; every lane gets the winner.
__device__ __forceinline__ void WarpRouteBest(float& bv, int& bi, float& bs) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    const float os = __shfl_xor_sync(0xffffffffu, bs, off);
    if (RouteBefore(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
      bs = os;
    }
  }
}

// One warp's shared memory for RouteRowWarp: the group step's choices, group scores and kept
// groups (kGroups only; may be null otherwise), and the chosen experts and their scores in
// choice order ([kMoeRouteMaxTopK] each; they may be the output row itself).
template <int kP>
struct RouteWarpScratch {
  float* buf;           // [kP * 32]
  float* group;         // [kP * 32]
  unsigned char* keep;  // [kP * 32]
  int32_t* id;          // [top_k]
  float* sc;            // [top_k]
};

// The routing of one token row (moe_route.h's contract) by one warp: logits row l, out_k =
// top_k (+ 1 when appended >= 0) entries to ids_row / w_row (global or shared memory; they may
// alias scratch.id / scratch.sc). Ends with the warp converged and the row written (a
// __syncwarp after the writes). kGroups: false skips the group step (the caller guarantees
// n_group == 1 or topk_group >= n_group) and needs no buf / group / keep.
template <int kP, bool kGroups = true>
__device__ __forceinline__ void RouteRowWarp(const float* l, const float* bias, int num_experts,
                                             int n_group, int topk_group, int top_k,
                                             bool renormalize, float scale, int appended,
                                             const RouteWarpScratch<kP>& s, int lane,
                                             int32_t* ids_row, float* w_row) {
  float sc[kP], ch[kP];
#pragma unroll
  for (int i = 0; i < kP; ++i) {
    const int e = lane + 32 * i;
    if (e < num_experts) {
      sc[i] = 1.0f / (1.0f + expf(-l[e]));
      ch[i] = sc[i] + (bias != nullptr ? bias[e] : 0.0f);
    } else {
      sc[i] = ch[i] = 0.0f;
    }
  }
  if (kGroups && n_group > 1 && topk_group < n_group) {
    float* buf = s.buf;
    float* gs = s.group;
    unsigned char* keep = s.keep;
#pragma unroll
    for (int i = 0; i < kP; ++i) {
      if (lane + 32 * i < num_experts) buf[lane + 32 * i] = ch[i];
    }
    __syncwarp();
    const int group_size = num_experts / n_group;
    for (int g = lane; g < n_group; g += 32) {
      float top1 = -INFINITY, top2 = -INFINITY;
      for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
        const float c = buf[e];
        if (c > top1) {
          top2 = top1;
          top1 = c;
        } else if (c > top2) {
          top2 = c;
        }
      }
      gs[g] = group_size > 1 ? top1 + top2 : top1;
      keep[g] = 0;
    }
    __syncwarp();
    for (int k = 0; k < topk_group; ++k) {
      float bv = 0.0f, bs = 0.0f;
      int bi = kNoExpert;
      for (int g = lane; g < n_group; g += 32) {
        if (!keep[g] && RouteBefore(gs[g], g, bv, bi)) {
          bv = gs[g];
          bi = g;
        }
      }
      WarpRouteBest(bv, bi, bs);
      __syncwarp();
      if (lane == 0) keep[bi] = 1;
      __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < kP; ++i) {
      const int e = lane + 32 * i;
      if (e < num_experts && !keep[e / group_size]) ch[i] = -INFINITY;
    }
  }
  float sum = 0.0f;
  // The top_k rounds on 32-bit keys that order choices like RouteBefore: RouteKey(choice) is
  // larger for a larger choice (-inf included; NaN is the smallest valid key), 0 is "nothing
  // left". Each lane offers its best untaken key (the lowest i among equal keys: the lowest
  // expert), the warp's best key is one redux.sync, the lowest expert offering it a second.
  unsigned key[kP];
#pragma unroll
  for (int i = 0; i < kP; ++i) key[i] = lane + 32 * i < num_experts ? RouteKey(ch[i]) : 0u;
  for (int j = 0; j < top_k; ++j) {
    unsigned best = 0u;
    int bi = kP;
#pragma unroll
    for (int i = 0; i < kP; ++i) {
      if (key[i] > best) {
        best = key[i];
        bi = i;
      }
    }
    const unsigned top = __reduce_max_sync(0xffffffffu, best);
    const unsigned expert = __reduce_min_sync(
        0xffffffffu, best == top && bi < kP ? static_cast<unsigned>(lane + 32 * bi) : ~0u);
    if ((expert & 31u) == static_cast<unsigned>(lane)) {
      const int i = static_cast<int>(expert >> 5);
      float s_chosen = 0.0f;
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        if (q == i) {
          key[q] = 0u;
          s_chosen = sc[q];
        }
      }
      s.id[j] = static_cast<int32_t>(expert);
      s.sc[j] = s_chosen;
    }
  }
  __syncwarp();
  if (lane == 0) {
    for (int j = 0; j < top_k; ++j) sum += s.sc[j];  // choice order: the CPU's rounding
  }
  sum = __shfl_sync(0xffffffffu, sum, 0);
  __syncwarp();
  const float denom = renormalize ? sum + 1e-20f : 1.0f;
  for (int j = lane; j < top_k; j += 32) {
    const int32_t id = s.id[j];
    const float w = s.sc[j] / denom * scale;
    ids_row[j] = id;
    w_row[j] = w;
  }
  if (appended >= 0 && lane == 0) {
    ids_row[top_k] = appended;
    w_row[top_k] = 1.0f;
  }
  __syncwarp();
}

// grid ceil(rows / kMoeRouteWarps), block kMoeRouteWarps * 32: one warp per row. (Tried: the
// top-k rounds as a rolled loop over the warp's shared-memory slice instead of unrolled over
// registers, for less code to fetch: on an H200 11.9 vs 8.7 us per launch in a graph at 256
// experts top-8.)
template <int kP>
__global__ void __launch_bounds__(kMoeRouteWarps * 32)
    MoeRouteWarpKernel(const float* logits, int64_t ld, const float* bias, int64_t rows,
                       int num_experts, int n_group, int topk_group, int top_k, bool renormalize,
                       float scale, int appended, int32_t* ids, float* weights) {
  PdlEnter();
  __shared__ float s_buf[kMoeRouteWarps][kP * 32];    // group step: choices
  __shared__ float s_group[kMoeRouteWarps][kP * 32];  // group step: group scores
  __shared__ unsigned char s_keep[kMoeRouteWarps][kP * 32];
  __shared__ int32_t s_id[kMoeRouteWarps][kMoeRouteMaxTopK];
  __shared__ float s_sc[kMoeRouteWarps][kMoeRouteMaxTopK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t{blockIdx.x} * kMoeRouteWarps + warp;
  if (t >= rows) return;  // warp-uniform; no block barriers below
  // Entries per row of ids / weights.
  const int out_k = appended >= 0 ? top_k + 1 : top_k;
  const RouteWarpScratch<kP> s{s_buf[warp], s_group[warp], s_keep[warp], s_id[warp], s_sc[warp]};
  RouteRowWarp<kP>(logits + t * ld, bias, num_experts, n_group, topk_group, top_k, renormalize,
                   scale, appended, s, lane, ids + t * out_k, weights + t * out_k);
}

}  // namespace glm::kernels::detail
