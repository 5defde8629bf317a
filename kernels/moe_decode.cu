// Launchers of the MoE decode kernels (moe_decode.h).
#include "kernels/moe_decode.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/moe_decode.cuh"

namespace glm::kernels::moe {
namespace {

// The decode kernels' grid: at most every resident CTA, and of those as few warps as still take
// the tasks in the same number of rounds (ceil(tasks / resident warps)), so that every warp runs
// that many tasks and none of the last round's HBM stream is left to a fraction of the warps (at
// batch 1 with the shared expert folded, 9216 gate|up tasks over 2112 resident warps would leave
// 36 % of the warps a fifth task; balanced: 231 CTAs, 5 tasks each).
int64_t DecodeBlocks(int64_t tasks, int64_t resident_ctas) {
  const int64_t warps = std::max<int64_t>(1, resident_ctas * kDecWarps);
  const int64_t want = detail::CeilDiv(tasks, detail::CeilDiv(tasks, warps));
  return std::max<int64_t>(1, std::min(detail::CeilDiv(want, kDecWarps), resident_ctas));
}

template <bool kFused, int kWT, bool kRoute>
absl::Status LaunchDecodeKernel(const DecodeParams& p, int64_t max_slots,
                                const detail::DeviceInfo& info, cudaStream_t stream) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int64_t tasks = max_slots * detail::CeilDiv(p.n, kCols);
  const int per_sm =
      detail::CachedCtasPerSm(MoeDecodeKernel<kFused, kWT, kRoute>, kDecWarps * 32, 0);
  const int64_t resident = int64_t{info.num_sms} * per_sm;
  const int64_t blocks = DecodeBlocks(tasks, resident);
  LaunchKernel(MoeDecodeKernel<kFused, kWT, kRoute>, static_cast<unsigned>(blocks),
               kDecWarps * 32, 0, stream, p);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeDecodeKernel launch");
}

// p.route.logits != nullptr (gate|up only): the kernel that routes for itself.
template <bool kFused>
absl::Status LaunchDecodeFor(int wt, const DecodeParams& p, int64_t max_slots,
                             const detail::DeviceInfo& info, cudaStream_t stream) {
  return DispatchWT(wt, [&](auto tag) {
    if constexpr (kFused) {
      if (p.route.logits != nullptr) {
        return LaunchDecodeKernel<true, decltype(tag)::value, true>(p, max_slots, info, stream);
      }
    }
    return LaunchDecodeKernel<kFused, decltype(tag)::value, false>(p, max_slots, info, stream);
  });
}

}  // namespace

absl::Status LaunchDecode(bool fused, int wt, const DecodeParams& p, int64_t max_slots,
                          const detail::DeviceInfo& info, cudaStream_t stream) {
  const int values_per_chunk = 16 / ElemBytes(wt);
  if (p.pairs < 1 || p.pairs > kMoeDecodeMaxPairs || max_slots < 1 || p.n < 1 ||
      p.k % values_per_chunk != 0 || (!fused && p.route.logits != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": the decode kernels take 1..", kMoeDecodeMaxPairs, " pairs (got ",
        p.pairs, ") with k a multiple of ", values_per_chunk, " (got ", p.k,
        "); only the gate|up pass routes"));
  }
  return fused ? LaunchDecodeFor<true>(wt, p, max_slots, info, stream)
               : LaunchDecodeFor<false>(wt, p, max_slots, info, stream);
}

}  // namespace glm::kernels::moe
