// Launchers of the MoE token-group kernels and the device token lists (moe_grouped.h).
#include "kernels/moe_grouped.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/moe_grouped.cuh"

namespace glm::kernels::moe {
namespace {

template <bool kFused>
absl::Status LaunchGroupFor(int wt, const DecodeParams& p, const DecodeLists& l,
                            int64_t max_units, const detail::DeviceInfo& info,
                            cudaStream_t stream) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int warps = static_cast<int>(std::min<int64_t>(kGrpWarps, info.smem_optin / kGrpWarpSmem));
  if (warps < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda MoeExperts: the token-group kernel needs ", kGrpWarpSmem, " bytes of shared memory "
        "per block, the device allows ", info.smem_optin, " (MoePolicy::Path::kTiled runs without)"));
  }
  const int64_t smem = warps * kGrpWarpSmem;
  return DispatchWT(wt, [&](auto tag) {
    constexpr int kWT = decltype(tag)::value;
    GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(MoeGroupKernel<kFused, kWT>, smem, info, kOp));
    const int per_sm = detail::CachedCtasPerSm(MoeGroupKernel<kFused, kWT>, warps * 32, smem);
    const int64_t tasks = max_units * detail::CeilDiv(p.n, kCols);
    const int64_t blocks = std::max<int64_t>(
        1, std::min(detail::CeilDiv(tasks, warps), int64_t{info.num_sms} * per_sm));
    LaunchKernel(MoeGroupKernel<kFused, kWT>, static_cast<unsigned>(blocks), warps * 32,
                 static_cast<size_t>(smem), stream, p, l);
    return detail::CudaCheck(cudaGetLastError(), kOp, "MoeGroupKernel launch");
  });
}

size_t Aligned256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t DeviceListsBytes(int64_t pairs, int64_t max_slots, int64_t max_units) {
  const size_t i32 = sizeof(int32_t);
  return 2 * Aligned256(i32) + Aligned256(max_slots * i32) + Aligned256((max_slots + 1) * i32) +
         Aligned256(pairs * i32) + Aligned256(max_units * i32) +
         Aligned256((max_units + 1) * i32);
}

DeviceLists CarveDeviceLists(void* ints, int64_t pairs, int64_t max_slots, int64_t max_units) {
  char* cur = static_cast<char*>(ints);
  auto take = [&cur](int64_t count) {
    int32_t* p = reinterpret_cast<int32_t*>(cur);
    cur += Aligned256(count * sizeof(int32_t));
    return p;
  };
  DeviceLists dl{};
  dl.n_active = take(1);
  dl.slot_expert = take(max_slots);
  dl.slot_off = take(max_slots + 1);
  dl.row_pair = take(pairs);
  dl.n_units = take(1);
  dl.unit_expert = take(max_units);
  dl.unit_off = take(max_units + 1);
  return dl;
}

absl::Status LaunchListRoute(const int32_t* ids, int pairs, int num_experts,
                             const DeviceLists& lists, cudaStream_t stream, int group_tokens) {
  if (pairs < 1 || pairs > kMoeGroupedMaxPairs || num_experts < 1 || num_experts > kMaxExperts ||
      group_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": the device token lists take 1..", kMoeGroupedMaxPairs, " pairs (got ",
        pairs, ") of 1..", kMaxExperts, " experts (got ", num_experts, ") in units of >= 1 rows "
        "(got ", group_tokens, ")"));
  }
  LaunchKernel(MoeListRouteKernel, 1, kRouteThreads, 0, stream, ids, pairs, num_experts,
               group_tokens, lists.n_active, lists.slot_expert, lists.slot_off, lists.row_pair,
               lists.n_units, lists.unit_expert, lists.unit_off);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeListRouteKernel launch");
}

absl::Status LaunchGrouped(bool fused, int wt, const DecodeParams& p, const DecodeLists& l,
                           int64_t max_units, const detail::DeviceInfo& info,
                           cudaStream_t stream) {
  const int values_per_chunk = 16 / ElemBytes(wt);
  if (p.pairs < 1 || p.pairs > kMoeGroupedMaxPairs || max_units < 1 || p.n < 1 ||
      p.k % values_per_chunk != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": the token-group kernels take 1..", kMoeGroupedMaxPairs, " pairs (got ",
        p.pairs, ") with k a multiple of ", values_per_chunk, " (got ", p.k, ")"));
  }
  return fused ? LaunchGroupFor<true>(wt, p, l, max_units, info, stream)
               : LaunchGroupFor<false>(wt, p, l, max_units, info, stream);
}

}  // namespace glm::kernels::moe
