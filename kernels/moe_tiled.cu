// Launchers of the tiled grouped GEMM of the routed experts (moe_tiled.h).
#include "kernels/moe_tiled.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/moe_tiled.cuh"

namespace glm::kernels::moe {
namespace {

// Deepest pipeline whose shared memory the device allows: 4 stages (H200: 184 KiB fused), else 2
// (GB10's 99 KiB: 92 KiB fused).
template <bool kFused, int kWT>
absl::Status LaunchGemm(const GemmParams& p, int64_t max_tiles, const detail::DeviceInfo& info,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>(detail::CeilDiv(p.n, kBN)));
  constexpr int64_t kSmem4 = GemmSmemFloats<kFused, 4>() * 4;
  constexpr int64_t kSmem2 = GemmSmemFloats<kFused, 2>() * 4;
  if (kSmem4 <= info.smem_optin) {
    GLM_RETURN_IF_ERROR(
        detail::UseDynamicSmem(MoeGemmKernel<kFused, 4, kWT>, kSmem4, info, kOp));
    LaunchKernel(MoeGemmKernel<kFused, 4, kWT>, grid, kThreads, kSmem4, stream, p);
  } else {
    GLM_RETURN_IF_ERROR(
        detail::UseDynamicSmem(MoeGemmKernel<kFused, 2, kWT>, kSmem2, info, kOp));
    LaunchKernel(MoeGemmKernel<kFused, 2, kWT>, grid, kThreads, kSmem2, stream, p);
  }
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeGemmKernel launch");
}

template <bool kFused>
absl::Status LaunchGemmFor(int wt, const GemmParams& p, int64_t max_tiles,
                           const detail::DeviceInfo& info, cudaStream_t stream) {
  return DispatchWT(wt, [&](auto tag) {
    return LaunchGemm<kFused, decltype(tag)::value>(p, max_tiles, info, stream);
  });
}

}  // namespace

absl::Status LaunchTiledRoute(const int32_t* ids, int pairs, int num_experts, int32_t* expert_off,
                              int32_t* tile_off, int32_t* row_pair, int32_t* pair_row,
                              cudaStream_t stream) {
  if (pairs < 1 || num_experts < 1 || num_experts > kMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat("cuda ", kOp, ": the tiled routing takes >= 1 ",
                                                   "pairs (got ", pairs, ") of 1..", kMaxExperts,
                                                   " experts (got ", num_experts, ")"));
  }
  LaunchKernel(MoeRouteKernel, 1, kRouteThreads, 0, stream, ids, pairs, num_experts, expert_off,
               tile_off, row_pair, pair_row);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeRouteKernel launch");
}

absl::Status LaunchTiledGemm(bool fused, int wt, const GemmParams& p, int64_t max_tiles,
                             const detail::DeviceInfo& info, cudaStream_t stream) {
  if (max_tiles < 1 || p.n < 1 || p.k < 1 || p.k % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": the tiled GEMM takes k a multiple of 4 (got ", p.k, "), n >= 1 (got ",
        p.n, ") and >= 1 tiles (got ", max_tiles, ")"));
  }
  return fused ? LaunchGemmFor<true>(wt, p, max_tiles, info, stream)
               : LaunchGemmFor<false>(wt, p, max_tiles, info, stream);
}

absl::Status LaunchTiledCombine(const float* y, const int32_t* pair_row, const float* weights,
                                int top_k, int64_t tokens, int hidden, float* out,
                                int64_t out_ld, cudaStream_t stream) {
  LaunchKernel(MoeCombineKernel,
               dim3(static_cast<unsigned>(tokens),
                    static_cast<unsigned>(detail::CeilDiv(hidden, kCombineThreads))),
               kCombineThreads, 0, stream, y, pair_row, weights, top_k, hidden, out, out_ld);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeCombineKernel launch");
}

}  // namespace glm::kernels::moe
