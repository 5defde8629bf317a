// Launcher and planning of gemv_narrow (gemv_narrow.h).
#include "kernels/gemv_narrow.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/cuda_util.h"
#include "kernels/gemv_narrow.cuh"

namespace glm::kernels {
namespace {

constexpr std::string_view kOp = "GemvNarrow";
constexpr int64_t kMaxSplits = 65535;  // grid.y

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Dynamic shared memory a CTA may use on this device: half an SM (two CTAs resident), at least
// 48 KiB, at most the per-block opt-in.
int64_t SmemBudget(const DeviceLimits& l) {
  const int64_t optin = l.smem_optin_per_block > 0 ? l.smem_optin_per_block : 48 * 1024;
  const int64_t half = l.smem_per_sm > 0 ? l.smem_per_sm / 2 - l.reserved_smem_per_block : optin;
  return std::min<int64_t>(optin, std::max<int64_t>(half, 48 * 1024));
}

int XStride(int groups, bool fp8) {  // bytes; see the padding note in gemv_narrow.cuh
  return groups * 256 + (fp8 ? 16 : 64);
}

size_t SmemBytes(int64_t m, int groups, bool fp8) {
  const size_t b = static_cast<size_t>(m) * XStride(groups, fp8) +
                   (fp8 ? static_cast<size_t>(m) * groups * 4 : 0);
  return (b + 15) / 16 * 16;
}

template <int kNT, bool kFp8>
const void* KernelFor() {
  return reinterpret_cast<const void*>(&detail::GemvNarrowKernel<kNT, kFp8>);
}

const void* Kernel(int64_t m, bool fp8) {
  if (m > 8) return fp8 ? KernelFor<2, true>() : KernelFor<2, false>();
  return fp8 ? KernelFor<1, true>() : KernelFor<1, false>();
}

}  // namespace

std::string GemvNarrowShape::DebugString() const {
  return absl::StrCat("m=", m, " n=", n, " k=", k, " w=",
                      weight == GemvWeight::kBF16 ? "bf16" : "fp8");
}

std::string GemvNarrowTiling::DebugString() const {
  return absl::StrCat("row_blocks=", row_blocks, " splits=", splits,
                      " groups/split=", groups_per_split, " smem=", smem_bytes,
                      " partial=", partial_bytes);
}

std::string GemvNarrowPlan::DebugString() const {
  return absl::StrCat(shape_.DebugString(), " ", tiling_.DebugString());
}

absl::StatusOr<GemvNarrowTiling> PlanGemvNarrow(const GemvNarrowShape& s,
                                                const DeviceLimits& limits) {
  const bool fp8 = s.weight == GemvWeight::kF8E4M3Block128;
  if (s.m < 0 || s.m > kGemvNarrowMaxM || s.n <= 0 || s.k <= 0 || s.n > INT32_MAX ||
      s.k > INT32_MAX || (fp8 && s.k % 16 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvNarrow: bad shape ", s.DebugString(), " (need 0 <= m <= ", kGemvNarrowMaxM,
        ", 0 < n, k < 2^31, fp8: k % 16 == 0); larger m goes through the GEMM path"));
  }
  GemvNarrowTiling t;
  t.row_blocks = CeilDiv(s.n, detail::kGemvRows);
  const int64_t groups = CeilDiv(s.k, 128);
  const int64_t m = std::max<int64_t>(s.m, 1);
  // The most 128-column groups whose staged x fits the shared-memory budget.
  const int64_t budget = SmemBudget(limits);
  const int64_t pad = XStride(0, fp8);
  int64_t gmax = std::clamp<int64_t>((budget - m * pad) / (m * (256 + (fp8 ? 4 : 0))), 1, groups);
  while (gmax > 1 && static_cast<int64_t>(SmemBytes(m, static_cast<int>(gmax), fp8)) > budget) {
    --gmax;
  }
  const int64_t per_sm = limits.max_blocks_per_sm_cap > 0 ? limits.max_blocks_per_sm_cap : 2;
  const int64_t slots = per_sm * std::max(limits.num_sms, 1);
  const int64_t fill = t.row_blocks >= slots ? 1 : slots / t.row_blocks;
  int64_t splits = std::clamp<int64_t>(std::max(fill, CeilDiv(groups, gmax)), 1, groups);
  const int64_t per = CeilDiv(groups, splits);
  splits = CeilDiv(groups, per);
  if (splits > kMaxSplits) {
    return absl::InvalidArgumentError(absl::StrCat("GemvNarrow: ", s.DebugString(), " needs ",
                                                   splits, " K splits (> ", kMaxSplits, ")"));
  }
  t.splits = static_cast<int>(splits);
  t.groups_per_split = static_cast<int>(per);
  t.x_stride_bytes = XStride(t.groups_per_split, fp8);
  t.smem_bytes = SmemBytes(m, t.groups_per_split, fp8);
  t.partial_bytes = splits > 1 ? static_cast<size_t>(splits) * s.m * s.n * 4 : 0;
  t.counters = splits > 1 ? t.row_blocks : 0;
  return t;
}

absl::StatusOr<GemvNarrowPlan> GemvNarrowPlan::Create(const GemvNarrowShape& shape) {
  const bool fp8 = shape.weight == GemvWeight::kF8E4M3Block128;
  int device = 0, major = 0, minor = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor < (fp8 ? 89 : 80)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GemvNarrow: ", fp8 ? "e4m3 needs compute capability 8.9" : "bf16 mma needs 8.0",
        " or newer; this device is ", major, ".", minor));
  }
  GLM_ASSIGN_OR_RETURN(DeviceLimits limits, QueryDeviceLimits());
  const void* kernel = Kernel(std::max<int64_t>(shape.m, 1), fp8);
  int per_sm = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, kernel, detail::kGemvThreads, 0));
  limits.max_blocks_per_sm_cap = std::max(per_sm, 1);
  GemvNarrowPlan plan;
  plan.shape_ = shape;
  plan.pdl_ = major >= 9;
  GLM_ASSIGN_OR_RETURN(plan.tiling_, PlanGemvNarrow(shape, limits));
  // Every plan on this device stays within SmemBudget, so one attribute value serves them all.
  GLM_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(SmemBudget(limits))));
  return plan;
}

absl::Status GemvNarrowPlan::Run(const GemvNarrowArgs& a, void* workspace, size_t workspace_bytes,
                                 int32_t* counters, int64_t num_counters,
                                 cudaStream_t stream) const {
  const GemvNarrowShape& s = shape_;
  if (s.m == 0) return absl::OkStatus();
  const bool fp8 = s.weight == GemvWeight::kF8E4M3Block128;
  const int64_t kgroups = CeilDiv(s.k, 128);
  if (a.x == nullptr || a.w == nullptr || a.y == nullptr || (fp8 && a.w_scales == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvNarrow: x, w, y", fp8 ? " and w_scales" : "", " must be non-null device pointers (",
        s.DebugString(), ")"));
  }
  if (a.ldx < s.k || a.ldy < s.n || a.ldw < s.k || a.ldw % (fp8 ? 16 : 8) != 0 ||
      (fp8 && a.w_scale_ld < kgroups)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvNarrow: ", s.DebugString(), " strides ldx=", a.ldx, " ldw=", a.ldw, " ldy=", a.ldy,
        " w_scale_ld=", a.w_scale_ld, " break the rules (ldx >= k, ldy >= n, ldw >= k and a ",
        "multiple of ", fp8 ? 16 : 8, " elements (16-byte rows), w_scale_ld >= ceil(k/128))"));
  }
  GLM_RETURN_IF_ERROR(CheckAligned(a.w, 16, kOp, "w"));
  GLM_RETURN_IF_ERROR(CheckAligned(a.x, 4, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckAligned(a.y, 4, kOp, "y"));
  if (fp8) GLM_RETURN_IF_ERROR(CheckAligned(a.w_scales, 4, kOp, "w_scales"));
  if (tiling_.splits > 1) {
    if (workspace == nullptr || workspace_bytes < tiling_.partial_bytes || counters == nullptr ||
        num_counters < tiling_.counters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GemvNarrow: ", DebugString(), " needs ", tiling_.partial_bytes,
          " bytes of workspace and ", tiling_.counters, " zeroed counters; got ", workspace_bytes,
          " bytes and ", num_counters, " counters"));
    }
    GLM_RETURN_IF_ERROR(CheckAligned(workspace, 16, kOp, "workspace"));
    GLM_RETURN_IF_ERROR(CheckAligned(counters, 4, kOp, "counters"));
  }
  detail::GemvParams p{};
  p.x = a.x;
  p.ldx = a.ldx;
  p.w = static_cast<const uint8_t*>(a.w);
  p.ldw_bytes = a.ldw * (fp8 ? 1 : 2);
  p.ws = a.w_scales;
  p.ws_ld = a.w_scale_ld;
  p.y = a.y;
  p.ldy = a.ldy;
  p.partial = static_cast<float*>(workspace);
  p.counters = counters;
  p.n = s.n;
  p.k = s.k;
  p.m = static_cast<int>(s.m);
  p.groups_per_split = tiling_.groups_per_split;
  p.x_stride = tiling_.x_stride_bytes;
  p.accumulate = a.accumulate ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(tiling_.row_blocks),
                     static_cast<unsigned>(tiling_.splits));
  cfg.blockDim = dim3(detail::kGemvThreads);
  cfg.dynamicSmemBytes = tiling_.smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = a.overlap_previous && pdl_ ? 1 : 0;
  cudaError_t err;
  if (s.m > 8) {
    err = fp8 ? cudaLaunchKernelEx(&cfg, detail::GemvNarrowKernel<2, true>, p)
              : cudaLaunchKernelEx(&cfg, detail::GemvNarrowKernel<2, false>, p);
  } else {
    err = fp8 ? cudaLaunchKernelEx(&cfg, detail::GemvNarrowKernel<1, true>, p)
              : cudaLaunchKernelEx(&cfg, detail::GemvNarrowKernel<1, false>, p);
  }
  return CudaStatus(err, "GemvNarrowKernel launch");
}

}  // namespace glm::kernels
