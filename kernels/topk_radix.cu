// Launcher for topk_radix: plans from the device, checks inputs, launches (cooperatively when a
// row is split over several CTAs).
#include "kernels/topk_radix.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/cuda_util.h"
#include "kernels/topk_radix.cuh"

namespace glm::kernels {
namespace {

using topk_detail::RowState;
using topk_detail::TopkParams;
using topk_detail::TopkRadixKernel;

static_assert(sizeof(RowState) == kTopkRowStateBytes, "topk_plan.h's kTopkRowStateBytes is stale");

using KernelFn = void (*)(TopkParams);

KernelFn PickKernel(bool multi, bool cache) {
  if (multi) return cache ? TopkRadixKernel<true, true> : TopkRadixKernel<true, false>;
  return cache ? TopkRadixKernel<false, true> : TopkRadixKernel<false, false>;
}

// Resident blocks per SM of the plan's kernel at `smem` bytes of dynamic shared memory.
absl::StatusOr<int> Occupancy(KernelFn fn, int smem) {
  GLM_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int blocks = 0;
  GLM_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kTopkThreads, smem));
  return blocks;
}

int MinCap(int have, int cap) { return cap > 0 ? std::min(have, cap) : have; }

}  // namespace

absl::StatusOr<TopkPlan> PlanTopkForDevice(int64_t rows, int64_t max_len, int k,
                                           const DeviceLimits* caps, TopkPath path) {
  GLM_ASSIGN_OR_RETURN(DeviceLimits limits, QueryDeviceLimits());
  if (caps != nullptr) {
    limits.num_sms = MinCap(limits.num_sms, caps->num_sms);
    limits.smem_optin_per_block = MinCap(limits.smem_optin_per_block, caps->smem_optin_per_block);
    limits.smem_per_sm = MinCap(limits.smem_per_sm, caps->smem_per_sm);
    limits.max_threads_per_sm = MinCap(limits.max_threads_per_sm, caps->max_threads_per_sm);
    limits.max_blocks_per_sm_cap = caps->max_blocks_per_sm_cap;
  }
  // Registers and threads: the most blocks any instantiation can keep resident.
  int reg_cap = 1 << 30;
  for (int multi = 0; multi < 2; ++multi) {
    for (int cache = 0; cache < 2; ++cache) {
      GLM_ASSIGN_OR_RETURN(int occ, Occupancy(PickKernel(multi, cache), kTopkFixedSmemBytes));
      reg_cap = std::min(reg_cap, occ);
    }
  }
  limits.max_blocks_per_sm_cap = MinCap(reg_cap, limits.max_blocks_per_sm_cap);
  for (int attempt = 0; attempt < 8; ++attempt) {
    GLM_ASSIGN_OR_RETURN(TopkPlan plan, PlanTopk(limits, rows, max_len, k, path));
    GLM_ASSIGN_OR_RETURN(int occ, Occupancy(PickKernel(plan.cooperative, plan.cache_in_smem),
                                            plan.smem_bytes));
    if (occ >= plan.blocks_per_sm || (!plan.cooperative && occ >= 1)) return plan;
    if (occ < 1) break;
    limits.max_blocks_per_sm_cap = occ;  // the model was optimistic: plan again with the truth
  }
  return absl::InternalError(absl::StrCat("PlanTopkForDevice: no residency-safe plan for rows=",
                                          rows, " max_len=", max_len, " k=", k, " on ",
                                          limits.DebugString()));
}

absl::Status TopkRadix(const TopkPlan& plan, const float* scores, int64_t row_stride,
                       const int32_t* lengths, int32_t* out, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  constexpr std::string_view kOp = "TopkRadix";
  if (plan.rows <= 0 || plan.k <= 0 || plan.max_len <= 0 || plan.chunk <= 0 ||
      plan.chunk % 4 != 0 || int64_t{plan.ctas_per_group} * plan.chunk < plan.max_len ||
      plan.num_groups <= 0 || plan.candidates < 0 || plan.candidates % 32 != 0 ||
      plan.smem_bytes < kTopkFixedSmemBytes + 8 * int64_t{plan.candidates} +
                            (plan.cache_in_smem && plan.max_len > plan.k ? 4 * plan.chunk : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TopkRadix: plan is not from PlanTopk/PlanTopkForDevice (", plan.DebugString(), ")"));
  }
  if (row_stride < plan.max_len) {
    return absl::InvalidArgumentError(absl::StrCat("TopkRadix: row_stride=", row_stride,
                                                   " < max_len=", plan.max_len,
                                                   "; rows must not overlap"));
  }
  GLM_RETURN_IF_ERROR(CheckDevicePointer(scores, kOp, "scores"));
  GLM_RETURN_IF_ERROR(CheckAligned(scores, 4, kOp, "scores"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(out, kOp, "out"));
  GLM_RETURN_IF_ERROR(CheckAligned(out, 4, kOp, "out"));
  if (lengths != nullptr) GLM_RETURN_IF_ERROR(CheckDevicePointer(lengths, kOp, "lengths"));
  if (plan.cooperative) {
    if (workspace_bytes < plan.workspace_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TopkRadix: workspace has ", workspace_bytes, " bytes; the plan needs ",
          plan.workspace_bytes, " (TopkPlan::workspace_bytes)"));
    }
    GLM_RETURN_IF_ERROR(CheckDevicePointer(workspace, kOp, "workspace"));
    GLM_RETURN_IF_ERROR(CheckAligned(workspace, 16, kOp, "workspace"));
    GLM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(workspace, 0, plan.workspace_bytes, stream));
  }

  TopkParams params{};
  params.scores = scores;
  params.row_stride = row_stride;
  params.lengths = lengths;
  params.rows = plan.rows;
  params.max_len = static_cast<int32_t>(plan.max_len);
  params.k = plan.k;
  params.out = out;
  params.states = static_cast<RowState*>(workspace);
  params.ctas_per_group = plan.ctas_per_group;
  params.num_groups = plan.num_groups;
  params.chunk = static_cast<int32_t>(plan.chunk);
  params.candidates = plan.candidates;
  params.vec4 = reinterpret_cast<uintptr_t>(scores) % 16 == 0 && row_stride % 4 == 0;

  const KernelFn fn = PickKernel(plan.cooperative, plan.cache_in_smem);
  GLM_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem_bytes));
  if (plan.total_ctas > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("TopkRadix: grid of ", plan.total_ctas,
                                                   " CTAs exceeds the CUDA limit"));
  }
  const dim3 grid(static_cast<unsigned>(plan.total_ctas));
  const dim3 block(kTopkThreads);
  if (plan.cooperative) {
    void* args[] = {&params};
    GLM_CUDA_RETURN_IF_ERROR(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(fn), grid,
                                                         block, args, plan.smem_bytes, stream));
  } else {
    fn<<<grid, block, plan.smem_bytes, stream>>>(params);
  }
  return CudaStatus(cudaGetLastError(), "TopkRadix launch");
}

}  // namespace glm::kernels
