// INT4 / INT8 / NVFP4 weights on the CUDA backend (backend.h WeightDType kInt4 / kInt8 / kNvfp4:
// the checkpoint's packed rows and scales, kept as stored by WeightLoader in mode auto), fp32
// activations:
//   y[M, N] (+)= x[M, K] . W[N, K]^T,  W[n][k] = q[n][k] * scale[n][k / group] (* global_scale)
// - Linear, M <= kernels::kGemvQuantMaxM (decode): one kernels/gemv_quant launch reading the
//   weight narrow: bf16(x) times the exact fp32 dequantized weight, fp32 accumulation. Plans are
//   made once per shape (m, format, n, k, group, strides, KernelPolicy caps) and cached; the
//   split-K workspace comes from the backend's scratch (slot 6, as NarrowLinear's) and the
//   arrival counters from a buffer this object owns, so a step of a seen shape allocates
//   nothing and is CUDA-graph capturable.
// - Linear, larger M (prefill): kernels::DequantizeToBf16 widens the weight into the widening
//   scratch (slot 1, [N, round_up(K, 8)] bf16: the largest quantized weight's bf16 size, e.g.
//   201 MB for GLM-5's o_proj 6144 x 16384), then NarrowLinear's bf16 cuBLASLt GEMM. The weight
//   is then rounded to bf16 as well (not exact; one rounding of each weight element).
// - MoeExperts / MoeRouteExperts with quantized experts: up to kernels::kMoeQuantMaxPairs (4096)
//   (token, expert) pairs, every routed expert's packed weight is read narrow by
//   kernels/moe_quant.h (cuda_ops.h MoeQuantExperts: gemv_quant's arithmetic per unit of up to
//   16 rows of one expert, over device token lists; nothing widened). Beyond that (prefill of
//   more than 4096 / top_k tokens) and for layers whose projections mix formats or group sizes,
//   WidenExperts widens every expert of the layer to bf16 into the widening scratch (slot 2) on
//   each call and the bf16 expert path of cuda_moe.cc runs on those views: correct and
//   graph-capturable, but it costs a layer's experts in bf16 of scratch (GLM-5: 256 x 3 x 2048 x
//   6144 x 2 B = 19.3 GB at TP 1, 4.8 GB at TP 4), so a serving deployment keeps prefill chunks
//   at or below 4096 / top_k tokens (512 at top-8) to never take it.
// Requirements (checked, InvalidArgument naming the rule): data and scales 16-byte aligned, row
// strides multiples of 16 bytes (WeightLoader::Linear stores them so), group_size > 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_linear.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "kernels/gemv_quant.h"
#include "kernels/kernel_policy.h"

namespace glm::engine::cuda {

// The kernels' view of a quantized MatView (its rows, cols, strides, scales and global scale).
kernels::QuantWeightView QuantViewOf(const MatView& w);
// Whether kernels/gemv_quant takes a `dtype` weight [rows, cols] with group_size inputs per
// scale, stored as WeightLoader stores it (16-byte rows of codes and of scales):
// kernels::CheckQuantWeight on that layout (Backend::SupportsQuantizedShape).
bool QuantShapeSupported(WeightDType dtype, int64_t rows, int64_t cols, int64_t group_size);

class QuantLinear {
 public:
  // Allocates the GEMV's arrival counters on the current device.
  static absl::StatusOr<std::unique_ptr<QuantLinear>> Create();
  ~QuantLinear();
  QuantLinear(const QuantLinear&) = delete;
  QuantLinear& operator=(const QuantLinear&) = delete;

  // y (+)= x . w^T for a quantized w (IsQuantizedWeight(w.dtype)); x.rows > 0, x.cols > 0.
  // scratch: the backend's op scratch (slots 5-7, also NarrowLinear's); widen: its widening
  // scratch (slot 1).
  absl::Status Run(const MatView& x, const MatView& w, const MatView& y, bool accumulate,
                   const kernels::KernelPolicy& policy, Scratch& scratch, Scratch& widen,
                   NarrowLinear& narrow, cudaStream_t stream);
  // The fallback of quantized experts beyond the narrow path (see above).
  // experts with quantized views widened to bf16 into `widen` (slot 2); *out receives views of
  // the same experts (bf16 for the quantized ones, the others as given) in arrays this object
  // keeps per layer (keyed by experts.gate), valid until the next call for that layer.
  absl::Status WidenExperts(const ExpertWeights& experts, Scratch& widen, cudaStream_t stream,
                            ExpertWeights* out);
  size_t num_plans() const { return gemv_.size(); }

 private:
  QuantLinear() = default;
  static absl::Status CheckShapes(const MatView& x, const MatView& w, const MatView& y);

  static constexpr int64_t kCounters = int64_t{1} << 16;
  int32_t* counters_ = nullptr;  // [kCounters] device, zero between launches
  // (format, m, n, k, group, ld_bytes, scale_ld, smem_cap_bytes, max_sms).
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t>;
  std::map<Key, kernels::GemvQuantPlan> gemv_;
  struct ExpertViews {
    std::vector<MatView> gate, up, down;
  };
  std::map<const MatView*, ExpertViews> experts_;
};

}  // namespace glm::engine::cuda
