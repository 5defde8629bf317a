#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/moe_route.cuh"
#include "kernels/moe_route.h"

namespace glm::kernels {
absl::Status MoeRoute(const float* logits, int64_t ld, const float* bias, int64_t rows,
                      int num_experts, int n_group, int topk_group, int top_k, bool renormalize,
                      float scale, int appended, int32_t* ids, float* weights,
                      cudaStream_t stream) {
  constexpr std::string_view kOp = "MoeRoute";
  if (rows < 0 || rows > 0x7fffffff || num_experts < 1 || num_experts > kMoeRouteMaxExperts ||
      ld < num_experts || n_group < 1 || num_experts % n_group != 0 || topk_group < 1 ||
      topk_group > n_group || top_k < 1 || top_k > num_experts || top_k > kMoeRouteMaxTopK ||
      appended < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRoute: bad shape rows=", rows, " num_experts=", num_experts, " ld=", ld,
        " n_group=", n_group, " topk_group=", topk_group, " top_k=", top_k, " (need 1 <= ",
        "num_experts <= ", kMoeRouteMaxExperts, ", ld >= num_experts, num_experts % n_group == 0",
        ", 1 <= topk_group <= n_group, 1 <= top_k <= min(num_experts, ", kMoeRouteMaxTopK,
        "), appended >= -1; got appended=", appended, ")"));
  }
  if (rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(logits, kOp, "logits"));
  if (bias != nullptr) GLM_RETURN_IF_ERROR(CheckDevicePointer(bias, kOp, "bias"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(ids, kOp, "ids"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(weights, kOp, "weights"));
  const unsigned blocks =
      static_cast<unsigned>((rows + detail::kMoeRouteWarps - 1) / detail::kMoeRouteWarps);
  auto launch = [&](auto kernel) {
    LaunchKernel(kernel, blocks, detail::kMoeRouteWarps * 32, 0, stream, logits, ld, bias, rows,
                 num_experts, n_group, topk_group, top_k, renormalize, scale, appended, ids,
                 weights);
  };
  if (num_experts <= 256) {
    launch(detail::MoeRouteWarpKernel<8>);
  } else {
    launch(detail::MoeRouteWarpKernel<32>);
  }
  return CudaStatus(cudaGetLastError(), "MoeRoute launch");
}

}  // namespace glm::kernels
