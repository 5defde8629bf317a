// Token-group kernels of the routed experts and the device token lists they (and moe_mma.h)
// read (moe_grouped.cuh). Launchers for kernels/moe.cu (CUDA sources only: op_util.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe_common.h"
#include "kernels/op_util.h"

namespace glm::kernels::moe {

inline constexpr int kGrpWarps = 8;
inline constexpr int kGrpStages = 4;
inline constexpr int kGroupMaxTokens = 4;  // token rows per unit: the register accumulators' limit
inline constexpr int64_t kGrpWarpSmem = int64_t{kGrpStages} * kDecWRows * 32 * 16;

// Units of group_tokens rows (the token-group kernel's kGroupMaxTokens; moe_quant's 16) for
// pairs: at most one partial unit per distinct expert.
inline int64_t MaxGroupUnits(int64_t pairs, int64_t max_slots,
                             int64_t group_tokens = kGroupMaxTokens) {
  return max_slots + pairs / group_tokens;
}

// The lists' device memory, written by LaunchListRoute (sizes: DecodeLists; slots =
// min(num_experts, pairs), units = MaxGroupUnits).
struct DeviceLists {
  int32_t* n_active;
  int32_t* slot_expert;
  int32_t* slot_off;
  int32_t* row_pair;
  int32_t* n_units;
  int32_t* unit_expert;
  int32_t* unit_off;
};

// Device memory of the lists for `pairs` pairs, max_slots slots and max_units units (each list
// 256-byte aligned), and the lists carved from `ints` (at least DeviceListsBytes of device
// memory, 256-byte aligned).
size_t DeviceListsBytes(int64_t pairs, int64_t max_slots, int64_t max_units);
DeviceLists CarveDeviceLists(void* ints, int64_t pairs, int64_t max_slots, int64_t max_units);

// MoeListRouteKernel: the lists of ids [pairs] (pairs <= kMoeGroupedMaxPairs, num_experts <=
// kMoeMaxExperts), units of at most group_tokens rows (>= 1).
absl::Status LaunchListRoute(const int32_t* ids, int pairs, int num_experts,
                             const DeviceLists& lists, cudaStream_t stream,
                             int group_tokens = kGroupMaxTokens);

// MoeGroupKernel: one weight pass (fused: gate|up into act; else down into y) over the lists'
// units (at most max_units). FailedPrecondition where a block cannot hold one warp's ring.
absl::Status LaunchGrouped(bool fused, int wt, const DecodeParams& p, const DecodeLists& l,
                           int64_t max_units, const detail::DeviceInfo& info, cudaStream_t stream);

}  // namespace glm::kernels::moe
