// Launcher and planning of gemv_narrow (gemv_narrow.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/compute_capability.h"
#include "kernels/cuda_util.h"
#include "kernels/gemv_narrow.cuh"
#include "kernels/gemv_narrow.h"
#include "kernels/rmsnorm.h"

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

using KernelFn = void (*)(detail::GemvParams);

template <int kNT, bool kFp8>
KernelFn KernelForStage(int stage) {
  if (stage >= 8) return &detail::GemvNarrowKernel<kNT, kFp8, 8>;
  if (stage >= 4) return &detail::GemvNarrowKernel<kNT, kFp8, 4>;
  return &detail::GemvNarrowKernel<kNT, kFp8, 1>;
}

KernelFn Kernel(int64_t m, bool fp8, int stage) {
  if (m > 8) return fp8 ? KernelForStage<2, true>(stage) : KernelForStage<2, false>(stage);
  return fp8 ? KernelForStage<1, true>(stage) : KernelForStage<1, false>(stage);
}

// Fills the tiling's latency knobs (GemvNarrowTuning) once the split partition is fixed.
void ResolveTuning(const GemvNarrowShape& s, const DeviceLimits& limits,
                   const GemvNarrowOptions& options, GemvNarrowTiling& t) {
  const bool fp8 = s.weight == GemvWeight::kF8E4M3Block128;
  const int64_t m = std::max<int64_t>(s.m, 1);
  const GemvNarrowTuning& u = options.tuning;
  // Auto rule, from gemv_bench on an H200 (GLM-5 fp8 shapes, M = 1 / 8 / 16, every knob A/B in
  // one process): the knobs pay only where staging x is long (items per warp = m x groups per
  // split / 8 warps >= 24: o_proj M = 8 54.0 -> 51.9 µs with 8 items and no prefetch; o_proj
  // M = 16 85.4 -> 82.3 and lm_head M = 8 / 16 594 -> 465 / 761 -> 687 µs with 8 items and the
  // L2 prefetch, which costs 2-10 % below 32 items: q_b M = 1 12.7 -> 14.1) or is paid by every
  // wave of a multi-wave grid (lm_head M = 1, 6 items, 1210 row blocks: 297 -> 260 µs with 8
  // items). Elsewhere the plain settings measured equal or faster (q_a M = 16, global
  // reduction: 14.9 µs vs 16.2-16.5 with 4 or 8 items and the batched reduction loads).
  const int64_t per_warp = CeilDiv(m * t.groups_per_split, detail::kGemvWarps);
  const int64_t per_sm = limits.max_blocks_per_sm_cap > 0 ? limits.max_blocks_per_sm_cap : 2;
  const int64_t slots = per_sm * std::max(limits.num_sms, 1);
  const bool multi_wave = t.row_blocks * t.splits > slots;
  const bool heavy = per_warp >= 24 || (multi_wave && per_warp >= 2);
  if (u.stage_batch > 0) {
    t.stage_batch = u.stage_batch >= 8 ? 8 : u.stage_batch >= 4 ? 4 : 1;
  } else {
    t.stage_batch = heavy ? 8 : 1;
  }
  // L2 prefetch: the steps past the register ring, as many as fit half the L2 with every
  // resident CTA's warps prefetching (16 rows x 128 bytes per warp and step).
  const int64_t steps = CeilDiv(std::min<int64_t>(s.k, int64_t{t.groups_per_split} * 128),
                                fp8 ? 128 : 64);
  const int64_t ahead = steps - (m > 8 ? detail::kGemvDepth<2> : detail::kGemvDepth<1>);
  if (u.prefetch_steps >= 0) {
    t.prefetch_steps = static_cast<int>(std::clamp<int64_t>(u.prefetch_steps, 0, 1 << 20));
  } else if (ahead <= 0 || options.l2_bytes <= 0 || per_warp < 32) {
    t.prefetch_steps = 0;
  } else {
    const int64_t resident = std::min<int64_t>(t.row_blocks * t.splits, slots);
    const int64_t step_bytes = resident * detail::kGemvWarps * 16 * 128;
    t.prefetch_steps = static_cast<int>(std::min(ahead, options.l2_bytes / 2 / step_bytes));
  }
  t.batched_reduce = u.batched_reduce >= 0 ? u.batched_reduce > 0 : heavy;
}

}  // namespace

std::string GemvNarrowShape::DebugString() const {
  return absl::StrCat("m=", m, " n=", n, " k=", k, " w=",
                      weight == GemvWeight::kBF16 ? "bf16" : "fp8");
}

std::string GemvNarrowTiling::DebugString() const {
  return absl::StrCat("row_blocks=", row_blocks, " splits=", splits,
                      " groups/split=", groups_per_split, " smem=", smem_bytes,
                      " partial=", partial_bytes, cluster > 1 ? " cluster" : "", " stage=",
                      stage_batch, " pf=", prefetch_steps, batched_reduce ? "" : " serial-reduce");
}

std::string GemvNarrowPlan::DebugString() const {
  return absl::StrCat(shape_.DebugString(), " ", tiling_.DebugString());
}

namespace {

absl::StatusOr<GemvNarrowTiling> PlanSplits(const GemvNarrowShape& s, const DeviceLimits& limits,
                                            const GemvNarrowOptions& options) {
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
  int64_t per_sm = limits.max_blocks_per_sm_cap > 0 ? limits.max_blocks_per_sm_cap : 2;
  if (options.ctas_per_sm > 0) per_sm = std::min<int64_t>(per_sm, options.ctas_per_sm);
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
  // Cluster reduction: the splits of a row block in one cluster (at most max_cluster CTAs),
  // each CTA also holding its [m][128] fp32 partials in shared memory; the splits are capped to
  // the cluster size. kAuto takes it where gemv_bench (H200, same process) measured it faster
  // than the global reduction: clusters of >= 4 CTAs, or of 2-3 at m >= 8 (q_b 16384x2048,
  // clusters of 2: +1-4 % slower at m <= 2, 4-11 % faster at m >= 8); sh_down 6144x2048 (4 CTAs)
  // m=1: 6.3 vs 6.7 µs, m=16 12.6 vs 15.0; kv_a 576x6144 (48 splits capped to 16) m=1 4.0 vs
  // 5.1, m=16 8.8 vs 15.3. Create also requires every row block's cluster resident at once
  // (q_a 16x16 and o_proj 48x5 were not, and measured 36-60 % slower).
  const int64_t max_cluster =
      std::min<int64_t>(options.max_cluster, detail::kGemvMaxCluster);
  if (options.reduce == GemvSplitReduce::kGlobal || max_cluster < 2 || splits < 2) return t;
  const size_t red_bytes = static_cast<size_t>(m) * detail::kGemvRows * 4;
  int64_t gmax_c = gmax;
  while (gmax_c >= 1 &&
         static_cast<int64_t>(SmemBytes(m, static_cast<int>(gmax_c), fp8) + red_bytes) > budget) {
    --gmax_c;
  }
  if (gmax_c < 1) return t;
  int64_t cs = std::max(splits, CeilDiv(groups, gmax_c));
  // kAuto caps only a split count over twice the cluster (where the global path's last CTA sums
  // many partials: kv_a's 48); q_a's 16 capped to 8 measured 5 % slower than 16 global.
  if (cs > max_cluster && options.reduce == GemvSplitReduce::kAuto && splits <= 2 * max_cluster) {
    return t;
  }
  cs = std::min(cs, max_cluster);
  const int64_t per_c = CeilDiv(groups, cs);
  cs = CeilDiv(groups, per_c);
  if (cs < 2 || per_c > gmax_c) return t;
  if (options.reduce == GemvSplitReduce::kAuto && cs < 4 && m < 8) return t;
  const size_t red_offset = SmemBytes(m, static_cast<int>(per_c), fp8);
  const size_t smem_c = red_offset + red_bytes;
  t.splits = static_cast<int>(cs);
  t.groups_per_split = static_cast<int>(per_c);
  t.x_stride_bytes = XStride(t.groups_per_split, fp8);
  t.smem_bytes = smem_c;
  t.reduce_offset = red_offset;
  t.partial_bytes = 0;
  t.counters = 0;
  t.cluster = static_cast<int>(cs);
  return t;
}

}  // namespace

absl::StatusOr<GemvNarrowTiling> PlanGemvNarrow(const GemvNarrowShape& s,
                                                const DeviceLimits& limits,
                                                const GemvNarrowOptions& options) {
  GLM_ASSIGN_OR_RETURN(GemvNarrowTiling t, PlanSplits(s, limits, options));
  ResolveTuning(s, limits, options, t);
  return t;
}

absl::StatusOr<GemvNarrowPlan> GemvNarrowPlan::Create(const GemvNarrowShape& shape,
                                                     GemvSplitReduce reduce, int ctas_per_sm,
                                                     const GemvNarrowTuning& tuning,
                                                     const KernelPolicy& policy) {
  const bool fp8 = shape.weight == GemvWeight::kF8E4M3Block128;
  int device = 0, major = 0, minor = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  // sm_80 (A800) converts e4m3 in software (cuda_fp8.h; cvt.*.e4m3x2 is sm_89+), exactly.
  GLM_RETURN_IF_ERROR(RequireComputeCapability("GemvNarrow", {major, minor}, {8, 0},
                                               fp8 ? "e4m3 x f16 mma.sync" : "bf16 mma.sync"));
  GLM_ASSIGN_OR_RETURN(DeviceLimits limits,
                       QueryDeviceLimits(policy.smem_cap_bytes, policy.max_sms));
  const int64_t m1 = std::max<int64_t>(shape.m, 1);
  // The occupancy of the staging variants differs only by registers; plan with the smallest
  // (every variant of a kNT/dtype must then be resident at that count: checked below).
  int per_sm = INT32_MAX;
  for (int stage : {1, 4, 8}) {
    int v = 0;
    GLM_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &v, reinterpret_cast<const void*>(Kernel(m1, fp8, stage)), detail::kGemvThreads, 0));
    per_sm = std::min(per_sm, v);
  }
  limits.max_blocks_per_sm_cap = std::max(per_sm, 1);
  int cluster_launch = 0;
  const bool clusters =
      major >= 9 && reduce != GemvSplitReduce::kGlobal &&
      cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device) == cudaSuccess &&
      cluster_launch != 0;
  bool sm90_code = major >= 9;
  for (int stage : {1, 4, 8}) {
    const void* kernel = reinterpret_cast<const void*>(Kernel(m1, fp8, stage));
    // Every plan on this device stays within SmemBudget, so one attribute value serves them all.
    GLM_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(SmemBudget(limits))));
    // Programmatic dependent launch and clusters need the kernel's sm_90+ code path (compiled
    // under __CUDA_ARCH__ >= 900): a binary built for an older virtual architecture and run
    // (JIT) on a Hopper/Blackwell GPU has neither the grid-dependency wait nor the cluster
    // reduction.
    cudaFuncAttributes fa{};
    GLM_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&fa, kernel));
    sm90_code = sm90_code && fa.ptxVersion >= 90;
    // Non-portable cluster sizes (16 on H100/H200) where the device allows them.
    if (clusters && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                         1) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }
  GemvNarrowPlan plan;
  plan.shape_ = shape;
  plan.pdl_ = sm90_code;
  GemvNarrowOptions opt;
  opt.reduce = reduce;
  opt.ctas_per_sm = std::max(ctas_per_sm, 0);
  opt.tuning = tuning;
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
    (void)cudaGetLastError();
    l2 = 0;
  }
  opt.l2_bytes = l2;
  if (clusters && sm90_code) opt.max_cluster = detail::kGemvMaxCluster;
  GLM_ASSIGN_OR_RETURN(plan.tiling_, PlanGemvNarrow(shape, limits, opt));
  // The device's answer for this plan's cluster: the size must launch at all, and under kAuto
  // every row block's cluster must be resident at once (else the global reduction's grid).
  while (plan.tiling_.cluster > 1) {
    const GemvNarrowTiling& t = plan.tiling_;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(t.row_blocks), static_cast<unsigned>(t.splits));
    cfg.blockDim = dim3(detail::kGemvThreads);
    cfg.dynamicSmemBytes = t.smem_bytes;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = static_cast<unsigned>(t.cluster);
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int resident = 0;
    const void* kernel = reinterpret_cast<const void*>(Kernel(m1, fp8, t.stage_batch));
    if (cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      resident = 0;
    }
    const bool fits = reduce == GemvSplitReduce::kAuto ? resident >= t.row_blocks : resident > 0;
    if (fits) break;
    // Smaller clusters (kCluster, or a size this device cannot launch), else the global
    // reduction (kAuto: launchable but not all resident).
    opt.max_cluster = reduce == GemvSplitReduce::kCluster || resident == 0 ? t.cluster - 1 : 1;
    GLM_ASSIGN_OR_RETURN(plan.tiling_, PlanGemvNarrow(shape, limits, opt));
  }
  return plan;
}

bool GemvNormFusible(const GemvNarrowArgs& a, int64_t m, int64_t k) {
  if (a.norm_w == nullptr || a.norm_out == nullptr || a.x == nullptr || m <= 0 || k <= 0) {
    return false;
  }
  if (RmsNormF32VecThreads(k, a.x, a.ldx, a.norm_w, a.norm_out, a.norm_out_ld) == 0) return false;
  const size_t out_bytes = static_cast<size_t>((m - 1) * a.norm_out_ld + k) * 4;
  const size_t x_bytes = static_cast<size_t>((m - 1) * a.ldx + k) * 4;
  const bool y_overlaps = a.y != nullptr && BytesOverlap(a.norm_out, out_bytes, a.y,
                                                         static_cast<size_t>(m) * a.ldy * 4);
  return !BytesOverlap(a.norm_out, out_bytes, a.x, x_bytes) && !y_overlaps &&
         !BytesOverlap(a.norm_out, out_bytes, a.norm_w, static_cast<size_t>(k) * 4);
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
  if (a.norm_w != nullptr && !GemvNormFusible(a, s.m, s.k)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvNarrow: ", s.DebugString(),
        " with a fused RmsNorm needs a norm_out apart from x, "
        "norm_w and y, with x, norm_w and norm_out 16-byte aligned, ldx, norm_out_ld and k "
        "multiples of 4 and k <= 8192 (GemvNormFusible); else run RmsNorm, then the GEMV on its "
        "output"));
  }
  if (tiling_.splits > 1 && tiling_.cluster <= 1) {
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
  p.cluster = std::max(tiling_.cluster, 1);
  p.red_offset = static_cast<int>(tiling_.reduce_offset);
  p.x_vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.ldx % 4 == 0 ? 1 : 0;
  p.prefetch_steps = tiling_.prefetch_steps;
  p.batched_reduce = tiling_.batched_reduce ? 1 : 0;
  if (a.norm_w != nullptr) {
    p.norm_w = a.norm_w;
    p.norm_eps = a.norm_eps;
    p.norm_threads = RmsNormF32VecThreads(s.k, a.x, a.ldx, a.norm_w, a.norm_out, a.norm_out_ld);
    p.norm_out = a.norm_out;
    p.norm_out_ld = a.norm_out_ld;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(tiling_.row_blocks),
                     static_cast<unsigned>(tiling_.splits));
  cfg.blockDim = dim3(detail::kGemvThreads);
  cfg.dynamicSmemBytes = tiling_.smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned num_attrs = 0;
  if (a.overlap_previous && pdl_ && PdlLaunches()) {
    attr[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[num_attrs].val.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  if (tiling_.cluster > 1) {
    attr[num_attrs].id = cudaLaunchAttributeClusterDimension;
    attr[num_attrs].val.clusterDim.x = 1;
    attr[num_attrs].val.clusterDim.y = static_cast<unsigned>(tiling_.cluster);
    attr[num_attrs].val.clusterDim.z = 1;
    ++num_attrs;
  }
  cfg.attrs = attr;
  cfg.numAttrs = num_attrs;
  // The fused RmsNorm exists in the one-item staging variant only (gemv_narrow.cuh).
  const int stage = a.norm_w != nullptr ? 1 : tiling_.stage_batch;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, Kernel(s.m, fp8, stage), p);
  return CudaStatus(err, "GemvNarrowKernel launch");
}

}  // namespace glm::kernels
