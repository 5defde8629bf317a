#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/compute_capability.h"
#include "kernels/gemm_fp8_block.cuh"
#include "kernels/gemm_fp8_block.h"
#include "kernels/launch.cuh"
#include "kernels/quant_fp8_group.h"

namespace glm::kernels {
namespace {

constexpr std::string_view kOp = "GemmFp8Block";
constexpr size_t kMaxPartialBytes = size_t{64} << 20;

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Why cuBLASLt's 128-block scaling cannot take this problem on this device; empty if it can.
std::string CublasLtBlockScalingRule(const GemmFp8BlockShape& s, int cc_major, int cc_minor) {
  if (cc_major != 9 || cc_minor != 0) {
    return absl::StrCat("cuBLASLt documents VEC128_32F / BLK128x128_32F scaling for compute "
                        "capability 9.0 only; this device is ", cc_major, ".", cc_minor);
  }
  if (s.m % 4 != 0) return absl::StrCat("cuBLASLt block scaling needs M % 4 == 0 (m=", s.m, ")");
  if (s.n % 4 != 0) return absl::StrCat("cuBLASLt block scaling needs N % 4 == 0 (n=", s.n, ")");
  const int64_t out_bytes = s.out == DType::kF32 ? 4 : 2;
  if ((s.ldy * out_bytes) % 16 != 0) {
    return absl::StrCat("cuBLASLt fp8 needs 16-byte aligned rows of y (ldy=", s.ldy, ")");
  }
  const int64_t l4 = CeilDiv(CeilDiv(s.k, 128), 4) * 4;
  if (s.w_scale_ld != l4) {
    return absl::StrCat("cuBLASLt BLK128x128_32F reads weight scales with row stride ceil(K/128) "
                        "rounded up to 4 = ", l4, ", but w_scale_ld=", s.w_scale_ld,
                        "; repack the scales at load time");
  }
  return "";
}

template <int MT, int DEPTH>
absl::Status LaunchOwn(const detail::Fp8GemmArgs& args, int splits, DType out,
                       cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(CeilDiv(args.n, detail::kFp8CtaCols)),
                  static_cast<unsigned>(CeilDiv(args.m, 16 * MT)), static_cast<unsigned>(splits));
  if (out == DType::kF32) {
    LaunchKernel(detail::GemmFp8BlockKernel<MT, DEPTH, float>, grid, detail::kFp8Threads, 0, stream,
                 args);
  } else {
    LaunchKernel(detail::GemmFp8BlockKernel<MT, DEPTH, __nv_bfloat16>, grid, detail::kFp8Threads, 0,
                 stream, args);
  }
  GLM_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "GemmFp8BlockKernel launch"));
  if (splits == 1) return absl::OkStatus();
  const int64_t total = args.m * args.n;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(CeilDiv(total, 256), 4096));
  if (out == DType::kF32) {
    LaunchKernel(detail::SplitKReduceKernel<float>, blocks, 256, 0, stream, args.partial, splits,
                 args.m, args.n, static_cast<float*>(args.y), args.ldy, args.accumulate);
  } else {
    LaunchKernel(detail::SplitKReduceKernel<__nv_bfloat16>, blocks, 256, 0, stream, args.partial,
                 splits, args.m, args.n, static_cast<__nv_bfloat16*>(args.y), args.ldy,
                 args.accumulate);
  }
  return CudaStatus(cudaGetLastError(), "SplitKReduceKernel launch");
}

}  // namespace

const char* GemmFp8PathName(GemmFp8Path path) {
  switch (path) {
    case GemmFp8Path::kAuto: return "auto";
    case GemmFp8Path::kCublasLt: return "cublaslt";
    case GemmFp8Path::kOwnKernel: return "own";
  }
  return "?";
}

std::string GemmFp8BlockShape::DebugString() const {
  return absl::StrCat("m=", m, " n=", n, " k=", k, " ldx=", ldx, " ldy=", ldy,
                      " w_scale_ld=", w_scale_ld, " out=", out == DType::kF32 ? "f32" : "bf16");
}

GemmFp8OwnTiling PlanGemmFp8Own(int64_t m, int64_t n, int64_t k, const DeviceLimits& limits) {
  GemmFp8OwnTiling t;
  // 2 MMA row tiles per warp (32 rows) once M is past decode sizes: half the weight reloads
  // from L2 (4 tiles spill registers); at decode sizes 1 tile wastes the fewest MMA rows and
  // leaves registers for a deeper load ring.
  t.m_tiles_per_warp = m > 64 ? 2 : 1;
  const int64_t num_kblocks = CeilDiv(k, 128);
  const int64_t ctas = CeilDiv(n, detail::kFp8CtaCols) * CeilDiv(std::max<int64_t>(m, 1),
                                                                  16 * t.m_tiles_per_warp);
  // Fill one wave of resident CTAs (limits.max_blocks_per_sm_cap: the kernel's occupancy; 4 when
  // unknown), never more: a partial second wave of a memory-bound call costs a whole wave.
  const int64_t per_sm = limits.max_blocks_per_sm_cap > 0 ? limits.max_blocks_per_sm_cap : 4;
  const int64_t target = per_sm * static_cast<int64_t>(std::max(limits.num_sms, 1));
  int64_t splits = std::clamp<int64_t>(target / ctas, 1, num_kblocks);
  while (splits > 1 &&
         static_cast<size_t>(splits) * m * n * sizeof(float) > kMaxPartialBytes) {
    --splits;
  }
  const int64_t per_split = CeilDiv(num_kblocks, splits);
  t.kblocks_per_split = static_cast<int>(per_split);
  t.splits = static_cast<int>(CeilDiv(num_kblocks, per_split));
  return t;
}

std::string GemmFp8BlockPlan::DebugString() const {
  if (path_ == GemmFp8Path::kCublasLt) {
    return absl::StrCat("cublaslt ", shape_.DebugString(), " variant=", lt_variant_,
                        " ws=", workspace_bytes_);
  }
  return absl::StrCat("own ", shape_.DebugString(), " mt=", m_tiles_per_warp_,
                      " splits=", splits_, " kb/split=", kblocks_per_split_,
                      " ctas/sm=", own_blocks_per_sm_,
                      " ws=", workspace_bytes_);
}

absl::Status GemmFp8BlockPlan::SetUpCublasLt(int variant, size_t max_workspace_bytes) {
  const GemmFp8BlockShape& s = shape_;
  const cudaDataType_t out_type = s.out == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc = nullptr;
  GLM_RETURN_IF_ERROR(CublasStatus(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                   "cublasLtMatmulDescCreate"));
  desc_.reset(desc);
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  // Variants 0-2: A = w (128x128 blocks), B = xq (1x128 groups), D column-major [n, m] = y.
  // Variant 3: A = xq, B = w, D row-major [m, n] = y (the operand roles of NVIDIA's sample).
  const bool swapped = variant == 3;
  const int32_t w_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t x_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const int32_t a_mode = swapped ? x_mode : w_mode;
  const int32_t b_mode = swapped ? w_mode : x_mode;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t n,
                 const char* what) {
    return CublasStatus(cublasLtMatmulDescSetAttribute(desc, attr, v, n), what);
  };
  GLM_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t), "set TRANSA"));
  GLM_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n), "set TRANSB"));
  GLM_RETURN_IF_ERROR(
      set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode), "set A_SCALE_MODE"));
  GLM_RETURN_IF_ERROR(
      set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode), "set B_SCALE_MODE"));
  if (variant != 2) {
    const void* placeholder = reinterpret_cast<const void*>(uintptr_t{1} << 20);
    GLM_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder,
                            sizeof(placeholder), "set A_SCALE_POINTER"));
    GLM_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder,
                            sizeof(placeholder), "set B_SCALE_POINTER"));
  }
  // Column-major view: A = w as [k, n] (ld k), B = xq as [k, m] (ld k), C = D = y as [n, m].
  GLM_ASSIGN_OR_RETURN(a_, MakeLtLayout(CUDA_R_8F_E4M3, s.k, swapped ? s.m : s.n, s.k));
  GLM_ASSIGN_OR_RETURN(b_, MakeLtLayout(CUDA_R_8F_E4M3, s.k, swapped ? s.n : s.m, s.k));
  if (swapped) {
    GLM_ASSIGN_OR_RETURN(c_, MakeLtLayout(out_type, s.m, s.n, s.ldy));
    const int32_t order = CUBLASLT_ORDER_ROW;
    GLM_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatrixLayoutSetAttribute(c_.get(), CUBLASLT_MATRIX_LAYOUT_ORDER, &order,
                                         sizeof(order)),
        "set D ORDER_ROW"));
  } else {
    GLM_ASSIGN_OR_RETURN(c_, MakeLtLayout(out_type, s.n, s.m, s.ldy));
  }
  cublasLtMatmulPreference_t pref_raw = nullptr;
  GLM_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&pref_raw), "cublasLtMatmulPreferenceCreate"));
  LtPreference pref(pref_raw);
  const uint64_t ws = max_workspace_bytes;
  GLM_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof(ws)),
      "set MAX_WORKSPACE_BYTES"));
  if (variant == 0) {
    const uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      GLM_RETURN_IF_ERROR(CublasStatus(
          cublasLtMatmulPreferenceSetAttribute(pref_raw, attr, &align, sizeof(align)),
          "set MIN_ALIGNMENT"));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, desc, a_.get(), b_.get(), c_.get(), c_.get(), pref_raw, 1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    return absl::UnimplementedError(absl::StrCat("heuristic status ", static_cast<int>(st), ", ",
                                                 found, " results"));
  }
  algo_ = result.algo;
  lt_workspace_bytes_ = result.workspaceSize;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GemmFp8BlockPlan>> GemmFp8BlockPlan::Create(
    const BlasLtHandle& handle, const GemmFp8BlockShape& shape_in, GemmFp8Path path,
    size_t max_cublas_workspace_bytes, const KernelPolicy& policy) {
  GemmFp8BlockShape s = shape_in;
  const int64_t num_kblocks = s.k > 0 ? CeilDiv(s.k, 128) : 0;
  if (s.ldx == 0) s.ldx = s.k;
  if (s.ldy == 0) s.ldy = s.n;
  if (s.w_scale_ld == 0) s.w_scale_ld = num_kblocks;
  if (s.m < 0 || s.n <= 0 || s.k <= 0 || s.k % 16 != 0 || s.ldx < s.k || s.ldx % 4 != 0 ||
      s.ldy < s.n || s.w_scale_ld < num_kblocks || s.m > INT32_MAX || s.n > INT32_MAX ||
      s.k > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmFp8BlockPlan: bad shape ", s.DebugString(),
        " (need m >= 0, n > 0, k > 0 and a multiple of 16, ldx >= k and a multiple of 4, "
        "ldy >= n, w_scale_ld >= ceil(k/128), each < 2^31); pad K of the weight to 16"));
  }
  auto plan = std::unique_ptr<GemmFp8BlockPlan>(new GemmFp8BlockPlan());
  plan->shape_ = s;
  plan->handle_ = handle.get();
  if (s.m == 0) {
    plan->path_ = path == GemmFp8Path::kCublasLt ? GemmFp8Path::kCublasLt : GemmFp8Path::kOwnKernel;
    return plan;
  }
  int device = 0, major = 0, minor = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  // sm_80 (A800) converts e4m3 in software (cuda_fp8.h; cvt.*.e4m3x2 is sm_89+), exactly; the
  // cuBLASLt path is refused below on anything but 9.0.
  GLM_RETURN_IF_ERROR(
      RequireComputeCapability("GemmFp8BlockPlan", {major, minor}, {8, 0}, "f16 mma.sync"));

  // Workspace: quantized x [m, k] e4m3, its scales [ceil(k/128), m rounded up to 4], then the
  // split-K partials (own kernel) or cuBLASLt's workspace.
  plan->xs_ld_ = CeilDiv(s.m, 4) * 4;
  plan->xq_offset_ = 0;
  plan->xs_offset_ = AlignUp(static_cast<size_t>(s.m) * s.k, 256);
  const size_t after_scales =
      plan->xs_offset_ + AlignUp(static_cast<size_t>(num_kblocks) * plan->xs_ld_ * 4, 256);

  const std::string rule = CublasLtBlockScalingRule(s, major, minor);
  if (path == GemmFp8Path::kCublasLt && !rule.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("GemmFp8BlockPlan: cuBLASLt path unavailable for ", s.DebugString(), ": ",
                     rule, "; use GemmFp8Path::kAuto or kOwnKernel"));
  }
  if (path != GemmFp8Path::kOwnKernel && rule.empty()) {
    // The heuristic is asked in up to four ways, first success wins (lt_variant_ records it):
    // 0: placeholder scale pointers + 16-byte alignment preferences; 1: placeholders only;
    // 2: neither; 3: placeholders, operands swapped (A = xq) with a row-major D.
    // A null block-scale pointer may make cuBLASLt reject the descriptor
    // (CUBLAS_STATUS_INVALID_VALUE); the heuristic does not read the scales, and Run sets the
    // real pointers before every matmul.
    std::string tried;
    for (int variant = 0; variant < 4; ++variant) {
      const absl::Status lt = plan->SetUpCublasLt(variant, max_cublas_workspace_bytes);
      if (lt.ok()) {
        plan->path_ = GemmFp8Path::kCublasLt;
        plan->lt_variant_ = variant;
        plan->lt_offset_ = after_scales;
        plan->workspace_bytes_ = after_scales + AlignUp(plan->lt_workspace_bytes_, 256);
        return plan;
      }
      absl::StrAppend(&tried, " [", variant, "] ", lt.message());
    }
    if (path == GemmFp8Path::kCublasLt) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GemmFp8BlockPlan: ", s.DebugString(), ": cuBLASLt found no block-scaled fp8 "
          "algorithm:", tried, "; use GemmFp8Path::kAuto or kOwnKernel"));
    }
    plan->desc_.reset();
    plan->a_.reset();
    plan->b_.reset();
    plan->c_.reset();
  }

  GLM_ASSIGN_OR_RETURN(DeviceLimits limits,
                       QueryDeviceLimits(policy.smem_cap_bytes, policy.max_sms));
  {
    const int mt = s.m > 64 ? 2 : 1;  // the instantiation Run will launch (PlanGemmFp8Own's rule)
    int per_sm = 0;
    const cudaError_t occ =
        s.out == DType::kF32
            ? (mt == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                             &per_sm, detail::GemmFp8BlockKernel<1, 3, float>, detail::kFp8Threads, 0)
                       : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                             &per_sm, detail::GemmFp8BlockKernel<2, 2, float>, detail::kFp8Threads, 0))
            : (mt == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                             &per_sm, detail::GemmFp8BlockKernel<1, 3, __nv_bfloat16>,
                             detail::kFp8Threads, 0)
                       : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                             &per_sm, detail::GemmFp8BlockKernel<2, 2, __nv_bfloat16>,
                             detail::kFp8Threads, 0));
    GLM_RETURN_IF_ERROR(CudaStatus(occ, "cudaOccupancyMaxActiveBlocksPerMultiprocessor"));
    limits.max_blocks_per_sm_cap = std::max(per_sm, 1);
  }
  const GemmFp8OwnTiling tiling = PlanGemmFp8Own(s.m, s.n, s.k, limits);
  plan->own_blocks_per_sm_ = limits.max_blocks_per_sm_cap;
  plan->path_ = GemmFp8Path::kOwnKernel;
  plan->m_tiles_per_warp_ = tiling.m_tiles_per_warp;
  plan->splits_ = tiling.splits;
  plan->kblocks_per_split_ = tiling.kblocks_per_split;
  plan->partial_offset_ = after_scales;
  plan->workspace_bytes_ =
      after_scales +
      (tiling.splits > 1 ? AlignUp(static_cast<size_t>(tiling.splits) * s.m * s.n * 4, 256) : 0);
  return plan;
}

absl::Status GemmFp8BlockPlan::Run(const void* x, const void* w, const float* w_scale, void* y,
                                   bool accumulate, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream) const {
  const GemmFp8BlockShape& s = shape_;
  if (s.m == 0) return absl::OkStatus();
  if (x == nullptr || w == nullptr || w_scale == nullptr || y == nullptr ||
      workspace == nullptr) {
    return absl::InvalidArgumentError("GemmFp8Block: x, w, w_scale, y and workspace must be "
                                      "non-null device pointers");
  }
  GLM_RETURN_IF_ERROR(CheckAligned(x, 8, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckAligned(w, 16, kOp, "w"));
  GLM_RETURN_IF_ERROR(CheckAligned(w_scale, 16, kOp, "w_scale"));
  GLM_RETURN_IF_ERROR(CheckAligned(y, 16, kOp, "y"));
  GLM_RETURN_IF_ERROR(CheckAligned(workspace, 256, kOp, "workspace"));
  if (workspace_bytes < workspace_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmFp8Block: workspace of ", workspace_bytes, " bytes is smaller than the plan's ",
        workspace_bytes_, " (", DebugString(), "); pass workspace_bytes() of device memory"));
  }
  char* ws = static_cast<char*>(workspace);
  uint8_t* xq = reinterpret_cast<uint8_t*>(ws + xq_offset_);
  float* xs = reinterpret_cast<float*>(ws + xs_offset_);
  GLM_RETURN_IF_ERROR(QuantizeFp8Group(x, s.ldx, s.m, s.k, xq, s.k, xs, xs_ld_, stream));

  if (path_ == GemmFp8Path::kCublasLt) {
    cublasLtMatmulDesc_t desc = desc_.get();
    const bool swapped = lt_variant_ == 3;
    const void* a_scale = swapped ? static_cast<const void*>(xs) : w_scale;
    const void* b_scale = swapped ? static_cast<const void*>(w_scale) : xs;
    GLM_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                       sizeof(a_scale)),
        "set A_SCALE_POINTER"));
    GLM_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                       sizeof(b_scale)),
        "set B_SCALE_POINTER"));
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return CublasStatus(
        cublasLtMatmul(handle_, desc, &alpha, swapped ? static_cast<const void*>(xq) : w,
                       a_.get(), swapped ? w : static_cast<const void*>(xq), b_.get(), &beta, y,
                       c_.get(), y,
                       c_.get(), &algo_, lt_workspace_bytes_ > 0 ? ws + lt_offset_ : nullptr,
                       lt_workspace_bytes_, stream),
        "GemmFp8Block: cublasLtMatmul");
  }

  detail::Fp8GemmArgs args{};
  args.xq = xq;
  args.ldq = s.k;
  args.xs = xs;
  args.xs_ld = xs_ld_;
  args.w = static_cast<const uint8_t*>(w);
  args.ws = w_scale;
  args.ws_ld = s.w_scale_ld;
  args.y = y;
  args.ldy = s.ldy;
  args.partial = splits_ > 1 ? reinterpret_cast<float*>(ws + partial_offset_) : nullptr;
  args.m = s.m;
  args.n = s.n;
  args.k = s.k;
  args.kblocks_per_split = kblocks_per_split_;
  args.accumulate = accumulate ? 1 : 0;
  if (m_tiles_per_warp_ == 1) return LaunchOwn<1, 3>(args, splits_, s.out, stream);
  return LaunchOwn<2, 2>(args, splits_, s.out, stream);
}

}  // namespace glm::kernels
