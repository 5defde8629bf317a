// Narrow-weight Linear of the CUDA backend (cuda_linear.h). Plain C++: the kernels are
// kernels/convert_bf16, gemm_bf16, gemm_fp8_block and gemv_narrow.
#include "engine/backend/cuda/cuda_linear.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/convert_bf16.h"
#include "kernels/cuda_util.h"
#include "kernels/rows.h"

namespace glm::engine::cuda {
namespace {

constexpr const char* kOp = "Linear";
// Scratch slots (cuda_ops.h): the other ops use theirs only within their own call, so these may
// overlap with them; inside one Linear they are distinct.
constexpr int kSlotX = 5, kSlotWorkspace = 6, kSlotY = 7;
// gemm_fp8_block's cuBLASLt workspace cap (its default).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

absl::Status CudaCheck(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda ", kOp, ": ", what, " failed: ",
                                          cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                          ")"));
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Whether the decode GEMV (one launch, fp32 x) beats the GEMM path (convert + quantize +
// cuBLASLt / gemm_fp8_block [+ reduce]) at m tokens for a weight of n x k elements. The GEMV's
// cost grows with m (every CTA stages and quantizes its K range of x), cuBLASLt's barely does,
// so the cut-over falls with the weight size. kernels/gemv_bench on an H200, µs GEMV vs quantize
// + cuBLASLt: fp8 m=1 o_proj 6144x16384 32.4 vs 51.3, lm_head 154880x6144 267 vs 483; m=8 q_a
// 2048x6144 10.2 vs 16.2, q_b 16384x2048 18.7 vs 15.5, o_proj 51.9 vs 42.7; m=16 q_a 14.9 vs
// 16.3, sh_down 6144x2048 13.0 vs 11.6 (K = 2048 stays on the GEMM path). bf16 (vs cuBLASLt)
// m=8 kv_a 576x6144 6.0 vs 7.5, m=16 7.1 vs 7.7: small bf16 weights take the GEMV up to 16.
bool GemvPreferred(int64_t m, int64_t n, int64_t k, bool fp8) {
  const int64_t elems = n * k;
  constexpr int64_t kM = int64_t{1} << 20;
  if (fp8) {
    if (m <= 2) return true;
    if (m <= 4) return elems <= 48 * kM;
    if (m <= 8) return elems <= 16 * kM;
    return m <= kernels::kGemvNarrowMaxM &&
           (elems <= 4 * kM || (k >= 4096 && elems <= 16 * kM));
  }
  return (m <= 2 && elems <= 40 * kM) || (m <= kernels::kGemvNarrowMaxM && elems <= 4 * kM);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NarrowLinear>> NarrowLinear::Create() {
  auto l = std::unique_ptr<NarrowLinear>(new NarrowLinear());
  GLM_ASSIGN_OR_RETURN(l->handle_, kernels::BlasLtHandle::Create());
  void* counters = nullptr;
  GLM_RETURN_IF_ERROR(
      CudaCheck(cudaMalloc(&counters, kGemvCounters * sizeof(int32_t)), "cudaMalloc(GEMV counters)"));
  l->gemv_counters_ = static_cast<int32_t*>(counters);
  GLM_RETURN_IF_ERROR(CudaCheck(cudaMemset(counters, 0, kGemvCounters * sizeof(int32_t)),
                                "cudaMemset(GEMV counters)"));
  return l;
}

NarrowLinear::~NarrowLinear() {
  if (gemv_counters_ != nullptr) cudaFree(gemv_counters_);
}

absl::Status NarrowLinear::RunGemv(const MatView& x, const MatView& w, const MatView& y,
                                   bool accumulate, const kernels::KernelPolicy& policy,
                                   Scratch& scratch, cudaStream_t stream, bool* taken,
                                   const kernels::GemvNarrowArgs* norm) {
  *taken = false;
  const int64_t m = x.rows, n = w.rows, k = x.cols;
  const bool fp8 = w.dtype == WeightDType::kF8E4M3Block128;
  if (m > kGemvMaxTokens || !GemvPreferred(m, n, k, fp8) || (fp8 && w.ld % 16 != 0)) {
    return absl::OkStatus();
  }
  const auto key =
      std::make_tuple(fp8 ? 1 : 0, m, n, k, policy.smem_cap_bytes, int64_t{policy.max_sms});
  auto it = gemv_.find(key);
  if (it == gemv_.end()) {
    GLM_ASSIGN_OR_RETURN(
        kernels::GemvNarrowPlan plan,
        kernels::GemvNarrowPlan::Create(
            {m, n, k, fp8 ? kernels::GemvWeight::kF8E4M3Block128 : kernels::GemvWeight::kBF16},
            kernels::GemvSplitReduce::kAuto, 0, kernels::GemvNarrowTuning(), policy));
    it = gemv_.emplace(key, plan).first;
  }
  const kernels::GemvNarrowPlan& plan = it->second;
  if (plan.num_counters() > kGemvCounters) return absl::OkStatus();
  void* ws = nullptr;
  if (plan.workspace_bytes() > 0) {
    GLM_ASSIGN_OR_RETURN(ws, scratch.Get(kSlotWorkspace, plan.workspace_bytes()));
  }
  kernels::GemvNarrowArgs a;
  a.x = x.data;
  a.ldx = x.ld;
  a.w = w.data;
  a.ldw = w.ld;
  a.w_scales = w.scales;
  a.w_scale_ld = w.scale_ld;
  a.y = y.data;
  a.ldy = y.ld;
  a.accumulate = accumulate;
  // Weights are immutable during steps, so the weight prefetch may overlap the previous kernel.
  a.overlap_previous = true;
  if (norm != nullptr) {
    a.norm_w = norm->norm_w;
    a.norm_eps = norm->norm_eps;
    a.norm_out = norm->norm_out;
    a.norm_out_ld = norm->norm_out_ld;
    if (!kernels::GemvNormFusible(a, m, k)) return absl::OkStatus();
  }
  *taken = true;
  return plan.Run(a, ws, plan.workspace_bytes(), gemv_counters_, kGemvCounters, stream);
}

absl::Status NarrowLinear::CheckShapes(const MatView& x, const MatView& w, const MatView& y) {
  const int64_t m = x.rows, n = w.rows, k = x.cols;
  const bool fp8 = w.dtype == WeightDType::kF8E4M3Block128;
  if (!fp8 && w.dtype != WeightDType::kBF16) {
    return absl::InvalidArgumentError("cuda Linear: NarrowLinear takes bf16 or fp8 weights");
  }
  if (w.cols != k || y.rows != m || y.cols != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda Linear: x [", m, ", ", k, "], w [", n, ", ", w.cols, "], y [", y.rows, ", ", y.cols,
        "] do not match (y = x . w^T)"));
  }
  if (fp8 ? (w.ld != k || k % 16 != 0 || w.scales == nullptr || !Aligned16(w.scales) ||
             w.scale_ld < (k + 127) / 128 || !Aligned16(w.data))
          : (w.ld % 8 != 0 || !Aligned16(w.data))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda Linear: ", fp8 ? "fp8" : "bf16", " weight [", n, ", ", k, "] ld ", w.ld,
        " breaks the layout rule (bf16: 16-byte aligned, ld % 8 == 0; fp8: ld == cols, cols % 16 "
        "== 0, 16-byte aligned data and scales); load it with WeightLoader::Linear"));
  }
  return absl::OkStatus();
}

absl::Status NarrowLinear::RunNormed(const MatView& x, const float* norm_w, float eps,
                                     const MatView& normed, const MatView& w, const MatView& y,
                                     bool accumulate, const kernels::KernelPolicy& policy,
                                     Scratch& scratch, cudaStream_t stream, bool* taken) {
  *taken = false;
  GLM_RETURN_IF_ERROR(CheckShapes(x, w, y));
  if (normed.rows != x.rows || normed.cols != x.cols) {
    return absl::InvalidArgumentError(absl::StrCat("cuda RmsNormLinear: normed [", normed.rows,
                                                   ", ", normed.cols, "] must be x's shape [",
                                                   x.rows, ", ", x.cols, "]"));
  }
  kernels::GemvNarrowArgs norm;
  norm.norm_w = norm_w;
  norm.norm_eps = eps;
  norm.norm_out = normed.data;
  norm.norm_out_ld = normed.ld;
  return RunGemv(x, w, y, accumulate, policy, scratch, stream, taken, &norm);
}

absl::Status NarrowLinear::Run(const MatView& x, const MatView& w, const MatView& y,
                               bool accumulate, const kernels::KernelPolicy& policy,
                               Scratch& scratch, cudaStream_t stream) {
  GLM_RETURN_IF_ERROR(CheckShapes(x, w, y));
  const int64_t m = x.rows, n = w.rows, k = x.cols;
  const bool fp8 = w.dtype == WeightDType::kF8E4M3Block128;
  bool taken = false;
  GLM_RETURN_IF_ERROR(RunGemv(x, w, y, accumulate, policy, scratch, stream, &taken));
  if (taken) return absl::OkStatus();
  // x -> bf16 [m, ldx].
  const int64_t ldx = RoundUp(k, 8);
  GLM_ASSIGN_OR_RETURN(void* xb, scratch.Get(kSlotX, static_cast<size_t>(m * ldx) * 2));
  GLM_RETURN_IF_ERROR(kernels::ConvertRowsToBf16(x.data, x.ld, m, k, xb, ldx, stream));
  // y directly when cuBLASLt's alignment holds, else a staging buffer.
  const bool direct = Aligned16(y.data) && y.ld % 4 == 0;
  const int64_t ldy = direct ? y.ld : RoundUp(n, 4);
  float* yd = y.data;
  if (!direct) {
    GLM_ASSIGN_OR_RETURN(void* ys, scratch.Get(kSlotY, static_cast<size_t>(m * ldy) * 4));
    yd = static_cast<float*>(ys);
    if (accumulate) {
      GLM_RETURN_IF_ERROR(
          kernels::CopyRows(y.data, y.ld, nullptr, yd, ldy, nullptr, m, n, stream));
    }
  }
  const Key key{fp8 ? 1 : 0, m, n, k, ldx, w.ld, ldy, policy.smem_cap_bytes, policy.max_sms};
  if (fp8) {
    auto it = fp8_.find(key);
    if (it == fp8_.end()) {
      kernels::GemmFp8BlockShape s;
      s.m = m, s.n = n, s.k = k, s.ldx = ldx, s.ldy = ldy, s.w_scale_ld = w.scale_ld;
      s.out = kernels::DType::kF32;
      GLM_ASSIGN_OR_RETURN(auto plan,
                           kernels::GemmFp8BlockPlan::Create(*handle_, s, kernels::GemmFp8Path::kAuto,
                                                             kCublasWorkspaceBytes, policy));
      it = fp8_.emplace(key, std::move(plan)).first;
    }
    const kernels::GemmFp8BlockPlan& plan = *it->second;
    const size_t ws_bytes = std::max<size_t>(plan.workspace_bytes(), 256);
    GLM_ASSIGN_OR_RETURN(void* ws, scratch.Get(kSlotWorkspace, ws_bytes));
    GLM_RETURN_IF_ERROR(
        plan.Run(xb, w.data, w.scales, yd, accumulate, ws, ws_bytes, stream));
  } else {
    auto it = bf16_.find(key);
    if (it == bf16_.end()) {
      kernels::GemmBf16Shape s;
      s.m = m, s.n = n, s.k = k, s.ldx = ldx, s.ldw = w.ld, s.ldy = ldy;
      s.out = kernels::DType::kF32;
      GLM_ASSIGN_OR_RETURN(auto plan, kernels::GemmBf16Plan::Create(*handle_, s));
      it = bf16_.emplace(key, std::move(plan)).first;
    }
    const kernels::GemmBf16Plan& plan = *it->second;
    const size_t ws_bytes = std::max<size_t>(plan.workspace_bytes(), 256);
    GLM_ASSIGN_OR_RETURN(void* ws, scratch.Get(kSlotWorkspace, ws_bytes));
    GLM_RETURN_IF_ERROR(plan.Run(xb, w.data, yd, accumulate, ws, ws_bytes, stream));
  }
  if (!direct) {
    GLM_RETURN_IF_ERROR(kernels::CopyRows(yd, ldy, nullptr, y.data, y.ld, nullptr, m, n, stream));
  }
  return absl::OkStatus();
}

}  // namespace glm::engine::cuda
