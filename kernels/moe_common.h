// What the MoE kernels' launchers (kernels/moe*.cu) share: limits, the weight-type dispatch and
// the parameter blocks of the streaming kernels (decode, token-group). Host and device code may
// include it; no device code here (moe_common.cuh has the shared device helpers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "kernels/moe.h"

namespace glm::kernels::moe {

inline constexpr const char* kOp = "MoeExperts";
inline constexpr int kMaxExperts = kMoeMaxExperts;
inline constexpr int kRouteThreads = 1024;  // one-CTA routing kernels: one expert per thread
inline constexpr int kCombineThreads = 256;

// Weight element types of the kernels (template argument): MoeWeightType as an int.
inline constexpr int kWF32 = 0, kWBF16 = 1, kWFP8 = 2;
constexpr int ElemBytes(int wt) { return wt == kWF32 ? 4 : wt == kWBF16 ? 2 : 1; }
constexpr int WeightTypeInt(MoeWeightType t) {
  return t == MoeWeightType::kF32 ? kWF32 : t == MoeWeightType::kBF16 ? kWBF16 : kWFP8;
}

// The one weight-type dispatch of the launchers: f(std::integral_constant<int, kWT>{}) for the
// layer's weight type (a generic lambda reads the type as decltype(tag)::value).
template <typename F>
absl::Status DispatchWT(int wt, F&& f) {
  if (wt == kWBF16) return f(std::integral_constant<int, kWBF16>{});
  if (wt == kWFP8) return f(std::integral_constant<int, kWFP8>{});
  return f(std::integral_constant<int, kWF32>{});
}

// Warps per CTA and weight rows per task of the decode kernels; the token-group kernels' tasks
// have the same weight rows.
inline constexpr int kDecWarps = 8;
inline constexpr int kDecWRows = 4;

// The gate|up decode kernel's own routing (MoeRouteExperts at few tokens): every warp routes
// the step's tokens from the router's logits with kernels::detail::RouteRowWarp (MoeRoute's
// arithmetic: the same ids and weights) into its shared memory, and CTA 0's warp 0 writes them
// to ids / weights for the down and combine kernels. logits == nullptr: route from ids.
struct DecodeRouteIn {
  const float* logits;  // [tokens, routed] fp32, row stride ld
  int64_t ld;
  const float* bias;  // [routed] or null
  int routed, routed_top_k, tokens, appended;
  int renormalize;
  float scale;
  int32_t* ids;    // [pairs] out
  float* weights;  // [pairs] out
};

// One weight pass of the decode / token-group kernels: gate|up (a = x, n = moe_inter, k =
// hidden, c = act) or down (a = act, n = hidden, k = moe_inter, c = y).
struct DecodeParams {
  const int32_t* ids;  // [pairs]
  int pairs, top_k, num_experts;
  const MoeExpert* experts;
  const float* a;  // fused: x [tokens, k] (row = pair / top_k); else act [pairs, k]
  int64_t a_ld;
  int n, k;
  float* c;  // [pairs, n]
  DecodeRouteIn route;
};

// Device token lists (moe_grouped.h MoeListRouteKernel), read by the token-group and tensor-core
// kernels. Slots: the distinct valid experts in ascending id order, each slot's rows its pairs
// in ascending pair order.
struct DecodeLists {
  const int32_t* n_active;     // [1]
  const int32_t* slot_expert;  // [slots]
  const int32_t* slot_off;     // [slots + 1]: rows of slot s are slot_off[s] .. slot_off[s + 1]
  const int32_t* row_pair;     // [pairs]: pair of each row
  // Token groups (MoeGroupKernel): each slot's rows split into ceil(rows / group_tokens) units
  // of near-equal size (sizes differ by at most one), in slot order.
  const int32_t* n_units;      // [1]
  const int32_t* unit_expert;  // [units]
  const int32_t* unit_off;     // [units + 1]: rows of unit u are unit_off[u] .. unit_off[u + 1]
};

// MoeCombineByPairKernel (moe.cuh) on `stream`: out[t] += sum_j weights[t, j] * y[t * top_k +
// j] over the valid ids (kernels/moe.cu; also moe_quant's last step).
absl::Status LaunchCombineByPair(const float* y, const int32_t* ids, const float* weights,
                                 int top_k, int num_experts, int64_t tokens, int64_t hidden,
                                 float* out, int64_t out_ld, cudaStream_t stream);

}  // namespace glm::kernels::moe
