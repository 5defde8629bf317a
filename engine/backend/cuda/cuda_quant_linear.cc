// INT4 / INT8 / NVFP4 weights of the CUDA backend (cuda_quant_linear.h). Plain C++: the kernels
// are kernels/gemv_quant (GEMV, DequantizeToBf16) and NarrowLinear's bf16 GEMM.
#include "engine/backend/cuda/cuda_quant_linear.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::engine::cuda {
namespace {

// Scratch slots: the op scratch's workspace slot (NarrowLinear's; distinct from its x / y slots,
// used only after the GEMV path is declined) and the widening scratch's slots (slot 0 is
// AbsorbPerHead's).
constexpr int kSlotWorkspace = 6;
constexpr int kWidenLinear = 1, kWidenExperts = 2;

absl::Status CudaCheck(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda quantized Linear: ", what, " failed: ",
                                          cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                          ")"));
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

const char* FormatName(WeightDType d) {
  return d == WeightDType::kInt4 ? "int4" : d == WeightDType::kInt8 ? "int8" : "nvfp4";
}

// The bf16 copy of quantized w in `out` ([w.rows, ld] elements, ld = round_up(cols, 8)).
MatView Bf16View(const MatView& w, void* out) {
  MatView v{static_cast<float*>(out), w.rows, w.cols, RoundUp(w.cols, 8)};
  v.dtype = WeightDType::kBF16;
  return v;
}

size_t Bf16Bytes(const MatView& w) {
  return static_cast<size_t>(RoundUp(w.rows * RoundUp(w.cols, 8) * 2, 256));
}

}  // namespace

kernels::QuantWeightView QuantViewOf(const MatView& w) {
  kernels::QuantWeightView v;
  v.format = w.dtype == WeightDType::kInt4   ? kernels::QuantFormat::kInt4
             : w.dtype == WeightDType::kInt8 ? kernels::QuantFormat::kInt8
                                             : kernels::QuantFormat::kNvfp4;
  v.data = w.data;
  v.ld_bytes = w.ld;
  v.scales = w.group_scales;
  v.scale_ld = w.scale_ld;
  v.group_size = w.group_size;
  v.global_scale = w.global_scale;
  v.rows = w.rows;
  v.cols = w.cols;
  return v;
}

bool QuantShapeSupported(WeightDType dtype, int64_t rows, int64_t cols, int64_t group_size) {
  if (!IsQuantizedWeight(dtype) || rows <= 0 || cols <= 0 || group_size <= 0) return false;
  MatView w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  const int64_t row_bytes = dtype == WeightDType::kInt8 ? RoundUp(cols, 4) : RoundUp(cols, 8) / 2;
  const int scale_bytes = dtype == WeightDType::kNvfp4 ? 1 : 2;
  w.ld = RoundUp(row_bytes, 16);
  w.scale_ld = RoundUp((cols + group_size - 1) / group_size * scale_bytes, 16) / scale_bytes;
  w.group_size = group_size;
  // Aligned stand-ins: only the layout is checked.
  alignas(16) static const uint8_t kStandIn[16] = {};
  w.data = reinterpret_cast<float*>(const_cast<uint8_t*>(kStandIn));
  w.group_scales = kStandIn;
  return kernels::CheckQuantWeight(QuantViewOf(w), "w").ok();
}

absl::StatusOr<std::unique_ptr<QuantLinear>> QuantLinear::Create() {
  auto l = std::unique_ptr<QuantLinear>(new QuantLinear());
  void* counters = nullptr;
  GLM_RETURN_IF_ERROR(CudaCheck(cudaMalloc(&counters, kCounters * sizeof(int32_t)),
                                "cudaMalloc(GEMV counters)"));
  l->counters_ = static_cast<int32_t*>(counters);
  GLM_RETURN_IF_ERROR(CudaCheck(cudaMemset(counters, 0, kCounters * sizeof(int32_t)),
                                "cudaMemset(GEMV counters)"));
  return l;
}

QuantLinear::~QuantLinear() {
  if (counters_ != nullptr) cudaFree(counters_);
}

absl::Status QuantLinear::CheckShapes(const MatView& x, const MatView& w, const MatView& y) {
  const int64_t m = x.rows, n = w.rows, k = x.cols;
  if (!IsQuantizedWeight(w.dtype)) {
    return absl::InvalidArgumentError("cuda Linear: QuantLinear takes INT4 / INT8 / NVFP4 weights");
  }
  if (w.cols != k || y.rows != m || y.cols != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda Linear: x [", m, ", ", k, "], ", FormatName(w.dtype), " w [", n, ", ", w.cols,
        "], y [", y.rows, ", ", y.cols, "] do not match (y = x . w^T)"));
  }
  if (w.data == nullptr || w.group_scales == nullptr || !Aligned16(w.data) ||
      !Aligned16(w.group_scales) || w.ld % 16 != 0 || w.group_size <= 0 ||
      w.scale_ld < (k + w.group_size - 1) / w.group_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda Linear: ", FormatName(w.dtype), " weight [", n, ", ", k, "] (ld ", w.ld,
        " bytes, group ", w.group_size, ", scale_ld ", w.scale_ld,
        ") breaks the layout rule (16-byte aligned data and scales, ld % 16 == 0, group_size > 0, "
        "scale_ld >= ceil(cols / group_size)); load it with WeightLoader::Linear"));
  }
  return absl::OkStatus();
}

absl::Status QuantLinear::Run(const MatView& x, const MatView& w, const MatView& y,
                              bool accumulate, const kernels::KernelPolicy& policy,
                              Scratch& scratch, Scratch& widen, NarrowLinear& narrow,
                              cudaStream_t stream) {
  GLM_RETURN_IF_ERROR(CheckShapes(x, w, y));
  const int64_t m = x.rows, n = w.rows, k = x.cols;
  const kernels::QuantWeightView view = QuantViewOf(w);
  if (m <= kernels::kGemvQuantMaxM) {
    const Key key{static_cast<int>(w.dtype), m,          n, k, w.group_size, w.ld, w.scale_ld,
                  policy.smem_cap_bytes,     policy.max_sms};
    auto it = gemv_.find(key);
    if (it == gemv_.end()) {
      GLM_ASSIGN_OR_RETURN(kernels::GemvQuantPlan plan,
                           kernels::GemvQuantPlan::Create(m, view, policy));
      it = gemv_.emplace(key, std::move(plan)).first;
    }
    const kernels::GemvQuantPlan& plan = it->second;
    if (plan.num_counters() <= kCounters) {
      void* ws = nullptr;
      if (plan.workspace_bytes() > 0) {
        GLM_ASSIGN_OR_RETURN(ws, scratch.Get(kSlotWorkspace, plan.workspace_bytes()));
      }
      kernels::GemvQuantArgs a;
      a.x = x.data;
      a.ldx = x.ld;
      a.w = view;
      a.y = y.data;
      a.ldy = y.ld;
      a.accumulate = accumulate;
      return plan.Run(a, ws, plan.workspace_bytes(), counters_, kCounters, stream);
    }
  }
  // Many rows: widen once, then the bf16 GEMM (x rounded to bf16, fp32 accumulation).
  GLM_ASSIGN_OR_RETURN(void* wide, widen.Get(kWidenLinear, Bf16Bytes(w)));
  const MatView wb = Bf16View(w, wide);
  GLM_RETURN_IF_ERROR(kernels::DequantizeToBf16(view, wide, wb.ld, stream));
  return narrow.Run(x, wb, y, accumulate, policy, scratch, stream);
}

absl::Status QuantLinear::WidenExperts(const ExpertWeights& experts, Scratch& widen,
                                       cudaStream_t stream, ExpertWeights* out) {
  const int32_t n = experts.num_experts;
  if (n <= 0 || experts.gate == nullptr || experts.up == nullptr || experts.down == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MoeExperts: ", n, " experts (need at least one, with gate / up / down views)"));
  }
  size_t bytes = 0;
  for (int32_t e = 0; e < n; ++e) {
    for (const MatView* v : {&experts.gate[e], &experts.up[e], &experts.down[e]}) {
      if (IsQuantizedWeight(v->dtype)) bytes += Bf16Bytes(*v);
    }
  }
  GLM_ASSIGN_OR_RETURN(void* base, widen.Get(kWidenExperts, std::max<size_t>(bytes, 256)));
  ExpertViews& views = experts_[experts.gate];
  views.gate.resize(n);
  views.up.resize(n);
  views.down.resize(n);
  size_t offset = 0;
  auto one = [&](const MatView& v, MatView* dst) -> absl::Status {
    if (!IsQuantizedWeight(v.dtype)) {
      *dst = v;
      return absl::OkStatus();
    }
    void* p = static_cast<char*>(base) + offset;
    offset += Bf16Bytes(v);
    *dst = Bf16View(v, p);
    return kernels::DequantizeToBf16(QuantViewOf(v), p, dst->ld, stream);
  };
  for (int32_t e = 0; e < n; ++e) {
    GLM_RETURN_IF_ERROR(one(experts.gate[e], &views.gate[e]));
    GLM_RETURN_IF_ERROR(one(experts.up[e], &views.up[e]));
    GLM_RETURN_IF_ERROR(one(experts.down[e], &views.down[e]));
  }
  *out = ExpertWeights{views.gate.data(), views.up.data(), views.down.data(), n};
  return absl::OkStatus();
}

}  // namespace glm::engine::cuda
