// MoE router (spec §3.4, engine/backend/backend.h MoeRoute), bit-for-bit the CPU backend's
// selection rules: s = sigmoid(logits); c = s + bias (bias for the choice only); with
// n_group > 1 and topk_group < n_group only experts of the topk_group groups with the largest sum
// of their top-2 c compete (ties: lower group); choose top_k of c (ties: lower expert, in order
// of choice); weight = s[chosen], divided by (sum of the top_k s + 1e-20) when renormalize,
// times scale.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

inline constexpr int kMoeRouteMaxExperts = 1024;
inline constexpr int kMoeRouteMaxTopK = 64;

// logits: [rows, num_experts] fp32, row stride ld; bias: [num_experts] fp32 or null (no bias);
// ids: [rows, top_k] int32; weights: [rows, top_k] fp32; all on the device. appended >= 0: rows
// hold top_k + 1 entries, the last one (appended, 1.0f) (a shared expert that MoeExperts
// computes with the routed ones; it takes no part in the choice or the renormalization).
// Limits: 1 <= num_experts <= kMoeRouteMaxExperts, num_experts % n_group == 0,
// 1 <= topk_group <= n_group, 1 <= top_k <= min(num_experts, kMoeRouteMaxTopK).
absl::Status MoeRoute(const float* logits, int64_t ld, const float* bias, int64_t rows,
                      int num_experts, int n_group, int topk_group, int top_k, bool renormalize,
                      float scale, int appended, int32_t* ids, float* weights, cudaStream_t stream);

}  // namespace glm::kernels
