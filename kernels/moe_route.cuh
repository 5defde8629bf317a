// moe_route: one CTA per token row. Scores and choice values live in shared memory; group
// filtering runs one thread per group for the top-2 sums and one thread for the (tiny) group
// selection; the top_k experts are then taken one per round by a block-wide argmax over
// (choice desc, expert asc), which reproduces the CPU's partial_sort order exactly, including
// -inf choices of filtered groups when top_k exceeds the experts left. The final weights are
// summed by one thread in choice order (same fp32 rounding as the CPU).
// Limits: num_experts <= kMoeRouteMaxExperts (shared memory ~13 KiB), top_k <= kMoeRouteMaxTopK.
#pragma once

#include <cstdint>

#include "kernels/moe_route.h"

namespace glm::kernels::detail {

inline constexpr int kMoeRouteThreads = 256;
inline constexpr int kNoExpert = 0x7fffffff;

// (v, i) comes before (bv, bi): larger value, then lower index; bi == kNoExpert is empty.
__device__ __forceinline__ bool RouteBefore(float v, int i, float bv, int bi) {
  if (i == kNoExpert) return false;
  if (bi == kNoExpert) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kMoeRouteThreads) MoeRouteKernel(
    const float* logits, int64_t ld, const float* bias, int num_experts, int n_group,
    int topk_group, int top_k, bool renormalize, float scale, int32_t* ids, float* weights) {
  __shared__ float s_score[kMoeRouteMaxExperts];
  __shared__ float s_choice[kMoeRouteMaxExperts];
  __shared__ float s_group[kMoeRouteMaxExperts];
  __shared__ unsigned char s_keep[kMoeRouteMaxExperts];
  __shared__ unsigned char s_taken[kMoeRouteMaxExperts];
  __shared__ int32_t s_chosen[kMoeRouteMaxTopK];
  __shared__ float s_warp_v[32];
  __shared__ int s_warp_i[32];
  const int64_t t = blockIdx.x;
  const float* l = logits + t * ld;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    const float s = 1.0f / (1.0f + expf(-l[e]));
    s_score[e] = s;
    s_choice[e] = s + (bias != nullptr ? bias[e] : 0.0f);
    s_taken[e] = 0;
  }
  __syncthreads();
  if (n_group > 1 && topk_group < n_group) {
    const int group_size = num_experts / n_group;
    for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
      float top1 = -INFINITY, top2 = -INFINITY;
      for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
        const float c = s_choice[e];
        if (c > top1) {
          top2 = top1;
          top1 = c;
        } else if (c > top2) {
          top2 = c;
        }
      }
      s_group[g] = group_size > 1 ? top1 + top2 : top1;
      s_keep[g] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 0; k < topk_group; ++k) {
        int best = kNoExpert;
        for (int g = 0; g < n_group; ++g) {
          if (!s_keep[g] && RouteBefore(s_group[g], g, best == kNoExpert ? 0.0f : s_group[best],
                                        best)) {
            best = g;
          }
        }
        s_keep[best] = 1;
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
      if (!s_keep[e / group_size]) s_choice[e] = -INFINITY;
    }
    __syncthreads();
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  for (int j = 0; j < top_k; ++j) {
    float bv = 0.0f;
    int bi = kNoExpert;
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
      if (!s_taken[e] && RouteBefore(s_choice[e], e, bv, bi)) {
        bv = s_choice[e];
        bi = e;
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (RouteBefore(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      s_warp_v[warp] = bv;
      s_warp_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < num_warps; ++w) {
        if (RouteBefore(s_warp_v[w], s_warp_i[w], bv, bi)) {
          bv = s_warp_v[w];
          bi = s_warp_i[w];
        }
      }
      s_chosen[j] = bi;
      s_taken[bi] = 1;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) sum += s_score[s_chosen[j]];
    const float denom = renormalize ? sum + 1e-20f : 1.0f;
    for (int j = 0; j < top_k; ++j) {
      ids[t * top_k + j] = s_chosen[j];
      weights[t * top_k + j] = s_score[s_chosen[j]] / denom * scale;
    }
  }
}

}  // namespace glm::kernels::detail
