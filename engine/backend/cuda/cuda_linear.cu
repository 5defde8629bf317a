// Narrow-weight Linear of the CUDA backend (cuda_linear.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/backend/cuda/cuda_linear.h"
#include "engine/backend/cuda/cuda_ops_util.h"
#include "kernels/rows.h"

namespace glm::engine::cuda {
namespace {

constexpr const char* kOp = "Linear";
// Scratch slots (cuda_ops.h): the other ops use theirs only within their own call, so these may
// overlap with them; inside one Linear they are distinct.
constexpr int kSlotX = 5, kSlotWorkspace = 6, kSlotY = 7;

std::atomic<int> g_gemv_prefetch{-1};  // SetCudaGemvPrefetchStepsForBench
std::atomic<int64_t> g_linear_generation{0};

__global__ void ConvertRowsToBf16Kernel(const float* __restrict__ src, int64_t src_ld,
                                        int64_t rows, int64_t cols,
                                        __nv_bfloat16* __restrict__ dst, int64_t dst_ld) {
  PdlEnter();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * dst_ld + c] = __float2bfloat16_rn(src[r * src_ld + c]);
  }
}

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Whether the decode GEMV (one launch, fp32 x) beats the GEMM path (convert + quantize +
// cuBLASLt / gemm_fp8_block [+ reduce]) at m tokens for a weight of n x k elements. The GEMV's
// cost grows with m (every CTA stages and quantizes its K range of x), cuBLASLt's barely does,
// so the cut-over falls with the weight size. kernels/gemv_bench on an H200
// (tools/gpu/run_gemv_gpu.sh), µs GEMV vs GEMM path without its ~2.5 µs convert launch:
//   fp8 m=1: q_a 2048x6144 6.9 vs 10.4, q_b 16384x2048 12.2 vs 19.2, o_proj 6144x16384 32.4 vs
//     51.3, lm_head 154880x6144 267 vs 483;  m=4: q_b 14.8 vs 18.3, o_proj 39.9 vs 35.4,
//     lm_head 337 vs 269;  m=8: q_a 10.2 vs 15.0, sh_down 6144x2048 10.0 vs 10.8, q_b 18.7 vs
//     14.8, o_proj 50.0 vs 36.4, lm_head 569 vs 300;  m=16: kv_a 576x6144 14.6 vs 14.8,
//     sh_down 14.9 vs 10.8.
//   bf16 (vs cuBLASLt) m=1: q_a 9.5 vs 10.8, q_b 19.1 vs 18.3, o_proj 59.0 vs 51.1;  m=8: kv_a
//     9.5 vs 6.8, q_b 22.4 vs 18.5.
// With the cluster split-K reduction (gemv_narrow kAuto: kv_a's 48 splits become one cluster of
// 16): kv_a 576x6144 fp8 m=1 4.0 (was 5.1), m=16 8.8 vs 16.0; bf16 m=8 6.0 vs cuBLASLt 7.5,
// m=16 7.1 vs 7.7, so small bf16 weights take the GEMV up to 16 tokens.
// Re-measured with the GEMV's latency knobs (gemv_bench, H200, D2D 4,274 GB/s; GEMV vs
// quantize + cuBLASLt): fp8 m=8 q_a 10.2 vs 16.2, sh_down 9.0 vs 11.6, indexer wq_b 4096x2048
// 8.0 vs 11.3, q_b 18.7 vs 15.5, o_proj 51.9 vs 42.7, lm_head 465 vs 314 (the cut-over at 16M
// elements stands); m=16 q_a 14.9 vs 16.3 (K = 6144: the GEMV now up to 16M elements where
// K >= 4096), sh_down 13.0 vs 11.6 and wq_b 11.5 vs 11.3 (K = 2048: still the GEMM path).
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

void SetCudaGemvPrefetchStepsForBench(int steps) {
  const int v = std::max(steps, -1);
  if (g_gemv_prefetch.exchange(v) != v) g_linear_generation.fetch_add(1);
}

int64_t LinearSettingsGeneration() { return g_linear_generation.load(); }

absl::Status ConvertRowsToBf16(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                               void* dst, int64_t dst_ld, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const int64_t total = rows * cols;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 4096));
  LaunchKernel(ConvertRowsToBf16Kernel, blocks, threads, 0, stream, src, src_ld, rows, cols,
               static_cast<__nv_bfloat16*>(dst), dst_ld);
  return detail::CudaCheck(cudaGetLastError(), kOp, "ConvertRowsToBf16Kernel launch");
}

absl::StatusOr<std::unique_ptr<NarrowLinear>> NarrowLinear::Create() {
  auto l = std::unique_ptr<NarrowLinear>(new NarrowLinear());
  GLM_ASSIGN_OR_RETURN(l->handle_, kernels::BlasLtHandle::Create());
  void* counters = nullptr;
  GLM_RETURN_IF_ERROR(detail::CudaCheck(cudaMalloc(&counters, kGemvCounters * sizeof(int32_t)),
                                        kOp, "cudaMalloc(GEMV counters)"));
  l->gemv_counters_ = static_cast<int32_t*>(counters);
  if (const char* env = std::getenv("GLM_LINEAR_GEMV_MAX_TOKENS"); env != nullptr && *env) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(env, &v) || v < 0 || v > kGemvMaxTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GLM_LINEAR_GEMV_MAX_TOKENS='", env, "' is not an integer in [0, ", kGemvMaxTokens,
          "]; unset it for the default (", kGemvMaxTokens, ")"));
    }
    l->gemv_max_tokens_ = v;
  }
  if (const char* env = std::getenv("GLM_GEMV_CTAS_PER_SM"); env != nullptr && *env) {
    int v = 0;
    if (!absl::SimpleAtoi(env, &v) || v < 0 || v > 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GLM_GEMV_CTAS_PER_SM='", env, "' is not an integer in [0, 16]; unset it for the ",
          "default (0: as many CTAs per SM as the GEMV's occupancy allows)"));
    }
    l->gemv_ctas_per_sm_ = v;
  }
  GLM_RETURN_IF_ERROR(detail::CudaCheck(cudaMemset(counters, 0, kGemvCounters * sizeof(int32_t)),
                                        kOp, "cudaMemset(GEMV counters)"));
  return l;
}

NarrowLinear::~NarrowLinear() {
  if (gemv_counters_ != nullptr) cudaFree(gemv_counters_);
}

absl::Status NarrowLinear::RunGemv(const MatView& x, const MatView& w, const MatView& y,
                                   bool accumulate, Scratch& scratch, cudaStream_t stream,
                                   bool* taken, const kernels::GemvNarrowArgs* norm) {
  *taken = false;
  const int64_t m = x.rows, n = w.rows, k = x.cols;
  const bool fp8 = w.dtype == WeightDType::kF8E4M3Block128;
  if (m > gemv_max_tokens_ || !GemvPreferred(m, n, k, fp8) || (fp8 && w.ld % 16 != 0)) {
    return absl::OkStatus();
  }
  const int prefetch = m <= 2 ? g_gemv_prefetch.load(std::memory_order_relaxed) : -1;
  const auto key = std::make_tuple(fp8 ? 1 : 0, m, n, k, prefetch);
  auto it = gemv_.find(key);
  if (it == gemv_.end()) {
    kernels::GemvNarrowTuning tuning;
    tuning.prefetch_steps = prefetch;
    GLM_ASSIGN_OR_RETURN(
        kernels::GemvNarrowPlan plan,
        kernels::GemvNarrowPlan::Create(
            {m, n, k, fp8 ? kernels::GemvWeight::kF8E4M3Block128 : kernels::GemvWeight::kBF16},
            kernels::GemvSplitReduce::kAuto, gemv_ctas_per_sm_, tuning));
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
  if (fp8 ? (w.ld != k || k % 16 != 0 || w.scales == nullptr || !detail::Aligned16(w.scales) ||
             w.scale_ld < (k + 127) / 128 || !detail::Aligned16(w.data))
          : (w.ld % 8 != 0 || !detail::Aligned16(w.data))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda Linear: ", fp8 ? "fp8" : "bf16", " weight [", n, ", ", k, "] ld ", w.ld,
        " breaks the layout rule (bf16: 16-byte aligned, ld % 8 == 0; fp8: ld == cols, cols % 16 "
        "== 0, 16-byte aligned data and scales); load it with WeightLoader::Linear"));
  }
  return absl::OkStatus();
}

absl::Status NarrowLinear::RunNormed(const MatView& x, const float* norm_w, float eps,
                                     const MatView& normed, const MatView& w, const MatView& y,
                                     bool accumulate, Scratch& scratch, cudaStream_t stream,
                                     bool* taken) {
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
  return RunGemv(x, w, y, accumulate, scratch, stream, taken, &norm);
}

absl::Status NarrowLinear::Run(const MatView& x, const MatView& w, const MatView& y,
                               bool accumulate, Scratch& scratch, cudaStream_t stream) {
  GLM_RETURN_IF_ERROR(CheckShapes(x, w, y));
  const int64_t m = x.rows, n = w.rows, k = x.cols;
  const bool fp8 = w.dtype == WeightDType::kF8E4M3Block128;
  bool taken = false;
  GLM_RETURN_IF_ERROR(RunGemv(x, w, y, accumulate, scratch, stream, &taken));
  if (taken) return absl::OkStatus();
  // x -> bf16 [m, ldx].
  const int64_t ldx = RoundUp(k, 8);
  GLM_ASSIGN_OR_RETURN(void* xb, scratch.Get(kSlotX, static_cast<size_t>(m * ldx) * 2));
  GLM_RETURN_IF_ERROR(ConvertRowsToBf16(x.data, x.ld, m, k, xb, ldx, stream));
  // y directly when cuBLASLt's alignment holds, else a staging buffer.
  const bool direct = detail::Aligned16(y.data) && y.ld % 4 == 0;
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
  const Key key{fp8 ? 1 : 0, m, n, k, ldx, w.ld, ldy};
  if (fp8) {
    auto it = fp8_.find(key);
    if (it == fp8_.end()) {
      kernels::GemmFp8BlockShape s;
      s.m = m, s.n = n, s.k = k, s.ldx = ldx, s.ldy = ldy, s.w_scale_ld = w.scale_ld;
      s.out = kernels::DType::kF32;
      GLM_ASSIGN_OR_RETURN(auto plan, kernels::GemmFp8BlockPlan::Create(*handle_, s));
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
