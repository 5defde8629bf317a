// Launcher, planning and host mirrors of gemv_quant (gemv_quant.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/compute_capability.h"
#include "kernels/cuda_util.h"
#include "kernels/gemv_quant.cuh"
#include "kernels/gemv_quant.h"
#include "kernels/gemv_quant_fp4mma.cuh"

namespace glm::kernels {
namespace {

constexpr std::string_view kOp = "GemvQuant";
constexpr int64_t kMaxSplits = 65535;  // grid.y

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int Fmt(QuantFormat f) {
  return f == QuantFormat::kInt4 ? detail::kGqInt4
         : f == QuantFormat::kInt8 ? detail::kGqInt8
                                   : detail::kGqNvfp4;
}

// Dynamic shared memory a CTA may use on this device: half an SM (two CTAs resident), at least
// 48 KiB, at most the per-block opt-in (as gemv_narrow).
int64_t SmemBudget(const DeviceLimits& l) {
  const int64_t optin = l.smem_optin_per_block > 0 ? l.smem_optin_per_block : 48 * 1024;
  const int64_t half = l.smem_per_sm > 0 ? l.smem_per_sm / 2 - l.reserved_smem_per_block : optin;
  return std::min<int64_t>(optin, std::max<int64_t>(half, 48 * 1024));
}

// Staged x bytes per token and window, and the row padding that keeps the B-fragment reads
// conflict-free (gemv_quant.cuh).
int64_t WindowXBytes(QuantFormat f) { return 2 * detail::GqWindowElems(Fmt(f)); }
int64_t XPad(QuantFormat f) { return f == QuantFormat::kInt8 ? 16 : 64; }

bool WindowScale(const QuantWeightView& w) {
  if (w.format == QuantFormat::kNvfp4) return false;
  return w.group_size >= w.cols || (w.group_size * w.bits() / 8) % detail::kGqWindowBytes == 0;
}

using KernelFn = void (*)(detail::GemvQuantParams);

template <int kFmt>
KernelFn KernelFor(bool window_scale, int64_t m) {
  if (m > 8) {
    return window_scale ? &detail::GemvQuantKernel<kFmt, true, 2>
                        : &detail::GemvQuantKernel<kFmt, false, 2>;
  }
  return window_scale ? &detail::GemvQuantKernel<kFmt, true, 1>
                      : &detail::GemvQuantKernel<kFmt, false, 1>;
}

KernelFn Kernel(QuantFormat f, bool window_scale, int64_t m) {
  switch (f) {
    case QuantFormat::kInt4:
      return KernelFor<detail::kGqInt4>(window_scale, m);
    case QuantFormat::kInt8:
      return KernelFor<detail::kGqInt8>(window_scale, m);
    case QuantFormat::kNvfp4:
      // nvfp4 never takes the window-scale path; one instantiation per token tiling.
      return m > 8 ? &detail::GemvQuantKernel<detail::kGqNvfp4, false, 2>
                   : &detail::GemvQuantKernel<detail::kGqNvfp4, false, 1>;
  }
  return nullptr;
}

bool SameShape(const QuantWeightView& a, const QuantWeightView& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols &&
         a.group_size == b.group_size;
}

}  // namespace

const char* QuantFormatName(QuantFormat format) {
  switch (format) {
    case QuantFormat::kInt4:
      return "int4";
    case QuantFormat::kInt8:
      return "int8";
    case QuantFormat::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

std::string QuantWeightView::DebugString() const {
  return absl::StrCat(QuantFormatName(format), " [", rows, ", ", cols, "] group=", group_size,
                      " ld_bytes=", ld_bytes, " scale_ld=", scale_ld);
}

std::string GemvQuantTiling::DebugString() const {
  return absl::StrCat("row_blocks=", row_blocks, " splits=", splits,
                      " windows/split=", windows_per_split, " smem=", smem_bytes,
                      " partial=", partial_bytes,
                      fp4_mma ? " fp4-mma" : window_scale ? " window-scale" : " widen");
}

std::string GemvQuantPlan::DebugString() const {
  return absl::StrCat("m=", m_, " ", shape_.DebugString(), " ", tiling_.DebugString());
}

absl::Status CheckQuantWeight(const QuantWeightView& w, const char* what) {
  const bool nvfp4 = w.format == QuantFormat::kNvfp4;
  const int64_t unit = w.format == QuantFormat::kInt8 ? 16 : 32;
  if (w.rows <= 0 || w.cols <= 0 || w.rows > INT32_MAX || w.cols > INT32_MAX ||
      w.cols % unit != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: ", what, " is ", w.DebugString(), "; need rows, cols in (0, 2^31) and cols a ",
        "multiple of ", unit, " (whole 16-byte units per row)"));
  }
  if (nvfp4 ? w.group_size != 16 : (w.group_size <= 0 || w.group_size % 16 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: ", what, " is ", w.DebugString(), "; the group size must be ",
        nvfp4 ? "16 for nvfp4" : "a positive multiple of 16 (>= cols for one scale per row)"));
  }
  const int64_t row_bytes = w.cols * w.bits() / 8;
  const int64_t scale_cols = CeilDiv(w.cols, w.group_size);
  if (w.ld_bytes < row_bytes || w.ld_bytes % 16 != 0 || w.scale_ld < scale_cols) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: ", what, " is ", w.DebugString(), "; need ld_bytes >= ", row_bytes,
        " and a multiple of 16, scale_ld >= ceil(cols / group) = ", scale_cols));
  }
  if (nvfp4 && !std::isfinite(w.global_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemvQuant: ", what, " global_scale ", w.global_scale, " is not finite"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GemvQuantTiling> PlanGemvQuant(int64_t m, const QuantWeightView& w,
                                              const DeviceLimits& limits) {
  if (m < 0 || m > kGemvQuantMaxM) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: m = ", m, " outside [0, ",
                                                   kGemvQuantMaxM,
                                                   "]; more tokens go through DequantizeToBf16 "
                                                   "and a bf16 GEMM"));
  }
  GLM_RETURN_IF_ERROR(CheckQuantWeight(w));
  GemvQuantTiling t;
  t.window_scale = WindowScale(w);
  t.row_blocks = CeilDiv(w.rows, detail::kGqRows);
  const int64_t windows = CeilDiv(w.cols, detail::GqWindowElems(Fmt(w.format)));
  const int64_t m1 = std::max<int64_t>(m, 1);
  const int64_t wx = WindowXBytes(w.format), pad = XPad(w.format);
  const int64_t budget = SmemBudget(limits);
  const int64_t wmax = std::clamp<int64_t>((budget / m1 - pad) / wx, 1, windows);
  const int64_t per_sm = limits.max_blocks_per_sm_cap > 0 ? limits.max_blocks_per_sm_cap : 2;
  const int64_t slots = per_sm * std::max(limits.num_sms, 1);
  const int64_t fill = t.row_blocks >= slots ? 1 : slots / t.row_blocks;
  int64_t splits = std::clamp<int64_t>(std::max(fill, CeilDiv(windows, wmax)), 1, windows);
  const int64_t per = CeilDiv(windows, splits);
  splits = CeilDiv(windows, per);
  if (splits > kMaxSplits) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: ", w.DebugString(), " needs ",
                                                   splits, " K splits (> ", kMaxSplits, ")"));
  }
  t.splits = static_cast<int>(splits);
  t.windows_per_split = static_cast<int>(per);
  t.x_stride_bytes = static_cast<int>(per * wx + pad);
  t.smem_bytes = static_cast<size_t>(m1 * t.x_stride_bytes);
  t.partial_bytes = splits > 1 ? static_cast<size_t>(splits) * m * w.rows * 4 : 0;
  t.counters = splits > 1 ? t.row_blocks : 0;
  return t;
}

absl::StatusOr<GemvQuantPlan> GemvQuantPlan::Create(int64_t m, const QuantWeightView& w,
                                                    const KernelPolicy& policy) {
  GLM_RETURN_IF_ERROR(CheckQuantWeight(w));
  if (m < 0 || m > kGemvQuantMaxM) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: m = ", m, " outside [0, ",
                                                   kGemvQuantMaxM, "]"));
  }
  int device = 0, major = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 8) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GemvQuant: bf16 mma.sync needs compute capability 8.0 or newer; this device is ", major,
        ".x"));
  }
  GLM_ASSIGN_OR_RETURN(DeviceLimits limits,
                       QueryDeviceLimits(policy.smem_cap_bytes, policy.max_sms));
  const int64_t m1 = std::max<int64_t>(m, 1);
  const void* kernel = reinterpret_cast<const void*>(Kernel(w.format, WindowScale(w), m1));
  GLM_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(SmemBudget(limits))));
  int per_sm = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, kernel, detail::kGqThreads, 0));
  limits.max_blocks_per_sm_cap = std::max(per_sm, 1);
  GemvQuantPlan plan;
  plan.m_ = m;
  plan.shape_ = w;
  plan.shape_.data = nullptr;
  plan.shape_.scales = nullptr;
  GLM_ASSIGN_OR_RETURN(plan.tiling_, PlanGemvQuant(m, w, limits));
  if (policy.linear.nvfp4_path == LinearPolicy::Nvfp4Path::kFp4Mma) {
    GLM_RETURN_IF_ERROR(plan.UseFp4Mma(device));
  }
  return plan;
}

absl::Status GemvQuantPlan::UseFp4Mma(int device) {
  if (shape_.format != QuantFormat::kNvfp4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvQuant: the FP4 tensor-core path (LinearPolicy::Nvfp4Path::kFp4Mma) takes nvfp4 "
        "weights; got ", shape_.DebugString()));
  }
  ComputeCapability cc;
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&cc.major, cudaDevAttrComputeCapabilityMajor, device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&cc.minor, cudaDevAttrComputeCapabilityMinor, device));
  int compiled = 0;
  if (cc.major == 12) {
    GLM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyFromSymbol(&compiled, detail::g_gqf4_compiled, sizeof(compiled)));
  }
  GLM_RETURN_IF_ERROR(Fp4MmaSupport(kOp, cc, compiled != 0));
  const int windows = tiling_.windows_per_split;
  const size_t smem =
      static_cast<size_t>(std::max<int64_t>(m_, 1)) * detail::Gqf4XStride(windows);
  GLM_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(&detail::GemvQuantFp4MmaKernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem)));
  tiling_.fp4_mma = true;
  tiling_.smem_bytes = smem;
  return absl::OkStatus();
}

absl::Status GemvQuantPlan::Run(const GemvQuantArgs& a, void* workspace, size_t workspace_bytes,
                                int32_t* counters, int64_t num_counters,
                                cudaStream_t stream) const {
  if (m_ == 0) return absl::OkStatus();
  const QuantWeightView& w = a.w;
  if (!SameShape(w, shape_)) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: weight ", w.DebugString(),
                                                   " differs from the plan's ",
                                                   shape_.DebugString(), "; make a plan for it"));
  }
  GLM_RETURN_IF_ERROR(CheckQuantWeight(w));
  if (a.x == nullptr || w.data == nullptr || w.scales == nullptr || a.y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvQuant: x, w.data, w.scales and y must be non-null device pointers (", DebugString(),
        ")"));
  }
  if (a.ldx < w.cols || a.ldy < w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuant: ", DebugString(), " ldx=", a.ldx,
                                                   " ldy=", a.ldy,
                                                   " break the rules ldx >= k, ldy >= n"));
  }
  GLM_RETURN_IF_ERROR(CheckAligned(w.data, 16, kOp, "w.data"));
  GLM_RETURN_IF_ERROR(
      CheckAligned(w.scales, w.format == QuantFormat::kNvfp4 ? 1 : 2, kOp, "w.scales"));
  GLM_RETURN_IF_ERROR(CheckAligned(a.x, 4, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckAligned(a.y, 4, kOp, "y"));
  const size_t y_bytes = static_cast<size_t>((m_ - 1) * a.ldy + w.rows) * 4;
  if (BytesOverlap(a.y, y_bytes, a.x, static_cast<size_t>((m_ - 1) * a.ldx + w.cols) * 4) ||
      BytesOverlap(a.y, y_bytes, w.data, static_cast<size_t>(w.rows * w.ld_bytes))) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemvQuant: y overlaps x or w.data (", DebugString(), ")"));
  }
  if (tiling_.splits > 1) {
    if (workspace == nullptr || workspace_bytes < tiling_.partial_bytes || counters == nullptr ||
        num_counters < tiling_.counters) {
      return absl::InvalidArgumentError(absl::StrCat("GemvQuant: ", DebugString(), " needs ", tiling_.partial_bytes, " bytes of workspace and ",
          tiling_.counters, " zeroed counters; got ", workspace_bytes, " bytes and ",
          num_counters, " counters"));
    }
    GLM_RETURN_IF_ERROR(CheckAligned(workspace, 16, kOp, "workspace"));
    GLM_RETURN_IF_ERROR(CheckAligned(counters, 4, kOp, "counters"));
  }
  detail::GemvQuantParams p{};
  p.x = a.x;
  p.ldx = a.ldx;
  p.w = static_cast<const uint8_t*>(w.data);
  p.ld_bytes = w.ld_bytes;
  p.scales = w.scales;
  p.scale_ld = w.scale_ld;
  p.group = std::min(w.group_size, w.cols);
  p.out_scale = w.format == QuantFormat::kNvfp4 ? w.global_scale : 1.0f;
  p.y = a.y;
  p.ldy = a.ldy;
  p.partial = static_cast<float*>(workspace);
  p.counters = counters;
  p.n = w.rows;
  p.k = w.cols;
  p.m = static_cast<int>(m_);
  p.windows_per_split = tiling_.windows_per_split;
  p.x_stride = tiling_.x_stride_bytes;
  p.accumulate = a.accumulate ? 1 : 0;
  // A channel-strategy group >= k indexes scale column 0 for every input either way.
  if (w.group_size >= w.cols) p.group = w.cols;
  const dim3 grid(static_cast<unsigned>(tiling_.row_blocks),
                  static_cast<unsigned>(tiling_.splits));
  if (tiling_.fp4_mma) {
    detail::GemvQuantFp4Params f{};
    f.x = p.x;
    f.ldx = p.ldx;
    f.w = p.w;
    f.ld_bytes = p.ld_bytes;
    f.scales = static_cast<const uint8_t*>(p.scales);
    f.scale_ld = p.scale_ld;
    f.out_scale = p.out_scale;
    f.y = p.y;
    f.ldy = p.ldy;
    f.partial = p.partial;
    f.counters = p.counters;
    f.n = p.n;
    f.k = p.k;
    f.m = p.m;
    f.windows_per_split = p.windows_per_split;
    f.x_stride = detail::Gqf4XStride(p.windows_per_split);
    f.accumulate = p.accumulate;
    detail::GemvQuantFp4MmaKernel<<<grid, detail::kGqf4Threads, tiling_.smem_bytes, stream>>>(f);
    return CudaStatus(cudaGetLastError(), "GemvQuantFp4MmaKernel launch");
  }
  Kernel(w.format, tiling_.window_scale, m_)<<<grid, detail::kGqThreads, tiling_.smem_bytes,
                                               stream>>>(p);
  return CudaStatus(cudaGetLastError(), "GemvQuantKernel launch");
}

absl::Status DequantizeToBf16(const QuantWeightView& w, void* out_bf16, int64_t ld_out,
                              cudaStream_t stream) {
  GLM_RETURN_IF_ERROR(CheckQuantWeight(w));
  if (w.data == nullptr || w.scales == nullptr || out_bf16 == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DequantizeToBf16: w.data, w.scales and out must be non-null device pointers (",
        w.DebugString(), ")"));
  }
  if (ld_out < w.cols) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeToBf16: ld_out = ", ld_out,
                                                   " < k = ", w.cols, " (", w.DebugString(),
                                                   ")"));
  }
  GLM_RETURN_IF_ERROR(CheckAligned(w.data, 16, "DequantizeToBf16", "w.data"));
  GLM_RETURN_IF_ERROR(CheckAligned(out_bf16, 2, "DequantizeToBf16", "out"));
  detail::DequantParams p{};
  p.w = static_cast<const uint8_t*>(w.data);
  p.ld_bytes = w.ld_bytes;
  p.scales = w.scales;
  p.scale_ld = w.scale_ld;
  p.group = std::min(w.group_size, w.cols);
  p.global_scale = w.global_scale;
  p.n = w.rows;
  p.k = w.cols;
  p.out = static_cast<__nv_bfloat16*>(out_bf16);
  p.ld_out = ld_out;
  const int64_t threads = w.rows * (w.cols / detail::GqChunkElems(Fmt(w.format)));
  const unsigned blocks = static_cast<unsigned>(CeilDiv(threads, 256));
  switch (w.format) {
    case QuantFormat::kInt4:
      detail::GemvQuantDequantKernel<detail::kGqInt4><<<blocks, 256, 0, stream>>>(p);
      break;
    case QuantFormat::kInt8:
      detail::GemvQuantDequantKernel<detail::kGqInt8><<<blocks, 256, 0, stream>>>(p);
      break;
    case QuantFormat::kNvfp4:
      detail::GemvQuantDequantKernel<detail::kGqNvfp4><<<blocks, 256, 0, stream>>>(p);
      break;
  }
  return CudaStatus(cudaGetLastError(), "GemvQuantDequantKernel launch");
}

uint16_t GemvQuantBf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

namespace {

// Element kk of row r, exactly (int: q * scale; nvfp4: e2m1 * e4m3, no global scale).
float HostDecode(const QuantWeightView& w, int64_t r, int64_t kk) {
  const auto* row = static_cast<const uint8_t*>(w.data) + r * w.ld_bytes;
  const int64_t group = std::min(w.group_size, w.cols);
  switch (w.format) {
    case QuantFormat::kInt4:
      return detail::GqDecode<detail::kGqInt4>(
          row, static_cast<const uint16_t*>(w.scales) + r * w.scale_ld, kk, group);
    case QuantFormat::kInt8:
      return detail::GqDecode<detail::kGqInt8>(
          row, static_cast<const uint16_t*>(w.scales) + r * w.scale_ld, kk, group);
    case QuantFormat::kNvfp4:
      return detail::GqDecode<detail::kGqNvfp4>(
          row, static_cast<const uint8_t*>(w.scales) + r * w.scale_ld, kk, group);
  }
  return 0.0f;
}

}  // namespace

absl::Status DequantizeQuantHost(const QuantWeightView& w, float* out, int64_t ld_out) {
  GLM_RETURN_IF_ERROR(CheckQuantWeight(w));
  if (w.data == nullptr || w.scales == nullptr || out == nullptr || ld_out < w.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DequantizeQuantHost: null pointer or ld_out < k (", w.DebugString(), ")"));
  }
  const float gs = w.format == QuantFormat::kNvfp4 ? w.global_scale : 1.0f;
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t kk = 0; kk < w.cols; ++kk) {
      const float v = HostDecode(w, r, kk);
      out[r * ld_out + kk] = w.format == QuantFormat::kNvfp4 ? v * gs : v;
    }
  }
  return absl::OkStatus();
}

absl::Status GemvQuantHost(int64_t m, const float* x, int64_t ldx, const QuantWeightView& w,
                           float* y, int64_t ldy, bool accumulate) {
  GLM_RETURN_IF_ERROR(CheckQuantWeight(w));
  if (m < 0 || m > kGemvQuantMaxM || ldx < w.cols || ldy < w.rows ||
      (m > 0 && (x == nullptr || y == nullptr || w.data == nullptr || w.scales == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("GemvQuantHost: m = ", m, " ldx = ", ldx,
                                                   " ldy = ", ldy, " for ", w.DebugString()));
  }
  const float gs = w.format == QuantFormat::kNvfp4 ? w.global_scale : 1.0f;
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t kk = 0; kk < w.cols; ++kk) row[kk] = HostDecode(w, r, kk);
    for (int64_t tok = 0; tok < m; ++tok) {
      double sum = 0.0;
      for (int64_t kk = 0; kk < w.cols; ++kk) {
        const float xv = detail::GqBf16BitsToFloat(GemvQuantBf16Bits(x[tok * ldx + kk]));
        sum += static_cast<double>(xv * row[kk]);
      }
      const float v = static_cast<float>(sum) * gs;
      float& out = y[tok * ldy + r];
      out = accumulate ? out + v : v;
    }
  }
  return absl::OkStatus();
}

}  // namespace glm::kernels
