// Launchers of the fp8 tensor-core MoE kernels (moe_mma.h).
#include "kernels/moe_mma.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/moe_mma.cuh"

namespace glm::kernels::moe {
namespace {

// Grid from the SM count and the kernel's occupancy.
template <bool kFused>
absl::Status LaunchMmaFor(const MmaParams& p, const float* src, int64_t src_ld, int64_t rows,
                          const DecodeLists& l, int64_t max_slots, const detail::DeviceInfo& info,
                          cudaStream_t stream) {
  LaunchKernel(MoeSplitKernel, dim3(static_cast<unsigned>(rows), static_cast<unsigned>(p.kblocks)),
               kMmaKB, 0, stream, src, src_ld, p.k, p.kblocks, const_cast<__half*>(p.bsplit),
               const_cast<float*>(p.binv));
  GLM_RETURN_IF_ERROR(detail::CudaCheck(cudaGetLastError(), kOp, "MoeSplitKernel launch"));
  constexpr int kCols = kFused ? 16 : 32;
  const int64_t tasks = max_slots * detail::CeilDiv(p.n, kCols);
  const int per_sm = detail::CachedCtasPerSm(MoeMmaKernel<kFused>, kMmaWarps * 32, 0);
  const int64_t blocks = std::max<int64_t>(
      1, std::min(detail::CeilDiv(tasks, kMmaWarps), int64_t{info.num_sms} * per_sm));
  LaunchKernel(MoeMmaKernel<kFused>, static_cast<unsigned>(blocks), kMmaWarps * 32, 0, stream, p,
               l);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeMmaKernel launch");
}

}  // namespace

absl::Status LaunchMma(bool fused, const MmaParams& p, const float* src, int64_t src_ld,
                       int64_t rows, const DecodeLists& l, int64_t max_slots,
                       const detail::DeviceInfo& info, cudaStream_t stream) {
  if (rows < 1 || p.kblocks != detail::CeilDiv(p.k, kMmaKB) || p.k % 16 != 0 || max_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": the tensor-core kernels take k a multiple of 16 (got ", p.k, ") in ",
        "ceil(k / ", kMmaKB, ") split blocks (got ", p.kblocks, ") over >= 1 rows (got ", rows,
        ")"));
  }
  return fused ? LaunchMmaFor<true>(p, src, src_ld, rows, l, max_slots, info, stream)
               : LaunchMmaFor<false>(p, src, src_ld, rows, l, max_slots, info, stream);
}

}  // namespace glm::kernels::moe
