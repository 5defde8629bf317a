// Linear with narrow weights on the CUDA backend (backend.h WeightDType), fp32 activations:
//   y[M, N] (+)= x[M, K] . W[N, K]^T
// - kBF16: x is converted to bf16 into scratch (round to nearest even), then gemm_bf16
//   (cuBLASLt, fp32 accumulation, fp32 output, accumulate via beta = 1).
// - kF8E4M3Block128: x is converted to bf16, then gemm_fp8_block quantizes it per row per 128
//   columns to e4m3 and runs the block-scaled GEMM (cuBLASLt on sm_90 where it applies, our
//   kernel elsewhere), fp32 output.
// - Decode sizes (m <= kGemvMaxTokens, either dtype, where the measured cut-over for the weight's
//   size says so: GemvPreferred in cuda_linear.cu): one kernels/gemv_narrow launch instead,
//   reading x in fp32 and writing y directly (any strides), with the same activation numerics
//   (bf16 rounding, then for fp8 the same per-row per-128-column e4m3 quantization), fp32
//   accumulation, deterministic split-K (its arrival counters live in a buffer this object
//   owns; partials in scratch slot 6), launched with programmatic dependent launch (its weight
//   prefetch overlaps the previous kernel; x and y are touched only after that kernel ends).
// Plans are made once per shape (m, n, k, strides) and KernelPolicy device caps, and cached; after that Run allocates nothing
// on the host and takes device memory only from the backend's grow-only scratch (slots 5-7), so
// a step of a seen shape is CUDA-graph capturable.
// Requirements (checked, InvalidArgument naming the rule): bf16 weights 16-byte aligned with a
// row stride multiple of 8 elements; fp8 weights with ld == cols, cols % 16 == 0 and 16-byte
// aligned scales (WeightLoader::Linear stores them so). y may be any fp32 view: an unaligned one
// goes through a staging buffer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "kernels/cublaslt_util.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_fp8_block.h"
#include "kernels/gemv_narrow.h"

namespace glm::engine::cuda {

class NarrowLinear {
 public:
  // Token counts above this never take the GEMV (its limit).
  static constexpr int64_t kGemvMaxTokens = kernels::kGemvNarrowMaxM;

  // Allocates the GEMV's counters on the current device.
  static absl::StatusOr<std::unique_ptr<NarrowLinear>> Create();
  ~NarrowLinear();
  NarrowLinear(const NarrowLinear&) = delete;
  NarrowLinear& operator=(const NarrowLinear&) = delete;
  // w.dtype must be kBF16 or kF8E4M3Block128; x.rows > 0, x.cols > 0. policy: the device caps
  // (KernelPolicy::smem_cap_bytes / max_sms) the launch plans are made under.
  absl::Status Run(const MatView& x, const MatView& w, const MatView& y, bool accumulate,
                   const kernels::KernelPolicy& policy, Scratch& scratch, cudaStream_t stream);
  // RmsNorm(x, norm_w, eps) into normed, then Run(normed, ...), as one GEMV launch with the norm
  // fused (kernels/gemv_narrow.h GemvNarrowArgs::norm_w: the same bits as the two ops) where the
  // GEMV takes the shape and kernels::GemvNormFusible holds; *taken = false (nothing enqueued)
  // otherwise, and the caller runs the two ops.
  absl::Status RunNormed(const MatView& x, const float* norm_w, float eps, const MatView& normed,
                         const MatView& w, const MatView& y, bool accumulate,
                         const kernels::KernelPolicy& policy, Scratch& scratch,
                         cudaStream_t stream, bool* taken);
  size_t num_plans() const { return bf16_.size() + fp8_.size() + gemv_.size(); }

 private:
  // (fp8, m, n, k, ldx, ldw, ldy, smem_cap_bytes, max_sms).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t>;
  NarrowLinear() = default;
  // The decode path; *taken = false when the shape or layout is not the GEMV's (then Run goes
  // on with the GEMM path).
  // norm: the fused RmsNorm's fields of the GEMV's arguments (norm_w null: none); a call with
  // one that kernels::GemvNormFusible refuses is not taken.
  absl::Status RunGemv(const MatView& x, const MatView& w, const MatView& y, bool accumulate,
                       const kernels::KernelPolicy& policy, Scratch& scratch,
                       cudaStream_t stream, bool* taken,
                       const kernels::GemvNarrowArgs* norm = nullptr);
  // The weight checks of Run (InvalidArgument naming the rule).
  static absl::Status CheckShapes(const MatView& x, const MatView& w, const MatView& y);

  static constexpr int64_t kGemvCounters = int64_t{1} << 16;
  int32_t* gemv_counters_ = nullptr;  // [kGemvCounters] device, zero between launches
  // Keyed by (fp8, m, n, k, smem_cap_bytes, max_sms).
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t>, kernels::GemvNarrowPlan>
      gemv_;

  std::unique_ptr<kernels::BlasLtHandle> handle_;
  std::map<Key, std::unique_ptr<kernels::GemmBf16Plan>> bf16_;
  std::map<Key, std::unique_ptr<kernels::GemmFp8BlockPlan>> fp8_;
};

}  // namespace glm::engine::cuda
