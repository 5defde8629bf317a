// Decode GEMV for Linear layers with narrow weights at small token counts, one launch:
//   y[M, N] (+)= xe[M, K] . W[N, K]^T,   M <= kGemvNarrowMaxM (16)
// x is fp32 and read directly; xe is what the two-step path (convert to bf16, quantize,
// cuBLASLt or gemm_fp8_block) multiplies, bit for bit:
// - bf16 weights: xe = bf16(x) (round to nearest even).
// - fp8 weights (e4m3 [N, K] with fp32 128x128 block scales s_w [ceil(N/128), w_scale_ld]):
//   x is rounded to bf16 and quantized per token per 128 columns to e4m3 with
//   scale = amax / 448 (quant_fp8_group.h; QuantizeFp8GroupHost is the host mirror), and
//   y = Σ_g s_x[m, g] · s_w[n/128, g] · Σ_{k in g} q[m, k] · w[n, k].
// Products accumulate in fp32 (tensor cores); y is fp32, written or accumulated (y += result).
// Deterministic: the same inputs give the same bits on every launch, eager or graph replay
// (split-K partials are summed in split order by the last CTA of each row block, or across a
// thread-block cluster: GemvSplitReduce; no float atomics). Memory-bound: the weight is
// streamed once with 16-byte loads; gemv_narrow.cuh has the tiling.
//
// Plans are made per (shape, device) from the device's attributes (SM count, shared memory per
// block and per SM, the kernel's occupancy); Run allocates nothing and launches one kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_limits.h"
#include "kernels/kernel_policy.h"

namespace glm::kernels {

enum class GemvWeight { kBF16, kF8E4M3Block128 };

// How the partial sums of a K split reach y.
// - kGlobal: every CTA writes fp32 partials to the workspace and takes a ticket from its row
//   block's counter; the last CTA sums them in split order (works on every device).
// - kCluster: the splits of one row block form a thread-block cluster (compute capability 9.0+);
//   each CTA leaves its partials in its shared memory and, after one cluster barrier, the CTAs
//   sum a slice of the row block each over the cluster's CTAs in split order (distributed shared
//   memory): no workspace, no counters, no global round trip. Same sums in the same order as
//   kGlobal, so the two give the same bits.
// - kAuto: kCluster where it measured faster (clusters of >= 4 CTAs, or >= 2 at m >= 8) and
//   every row block's cluster is resident at once; else kGlobal (PlanGemvNarrow has the rule).
// kCluster asked for on a device without clusters, or where the K range per CTA would not fit
// shared memory with the splits capped to the cluster size, plans kGlobal.
enum class GemvSplitReduce { kAuto, kGlobal, kCluster };

// Latency knobs that change no value (every setting gives the same bits for the same split
// partition); auto is the measured choice (gemv_narrow.cu ResolveTuning has the rule and the
// figures: the knobs pay only where staging x is long or repeated by many waves).
struct GemvNarrowTuning {
  // (token, 128-column group) items of x each warp stages with all their loads issued before any
  // is converted: 0 = auto, else 1 (one at a time), 4 or 8.
  int stage_batch = 0;
  // Steps (16 rows x 128 bytes) per warp kept prefetched into L2 ahead of the register ring
  // (prefetch.global.L2; issued before the grid-dependency wait): -1 = auto (from the L2 size and
  // the resident CTAs), 0 = off.
  int prefetch_steps = -1;
  // The global reduction's last CTA loads the partials 16 splits at a time: -1 = auto, 0 = one
  // at a time, 1 = batched.
  int batched_reduce = -1;

  // Every knob at its plainest setting (one item at a time, no prefetch, one partial at a time):
  // what auto resolves to on light shapes; tests and gemv_bench compare the others against it.
  static GemvNarrowTuning Previous() { return {1, 0, 0}; }
};

struct GemvNarrowOptions {
  GemvSplitReduce reduce = GemvSplitReduce::kAuto;
  int max_cluster = 1;  // the largest cluster the device can launch of this kernel (1: none)
  // > 0: split K to fill this many CTAs per SM (at most the kernel's occupancy) instead of all
  // resident slots, leaving room for the next kernel's programmatic launch to prefetch.
  int ctas_per_sm = 0;
  GemvNarrowTuning tuning;
  int64_t l2_bytes = 0;  // the device's L2 (cudaDevAttrL2CacheSize); 0: no auto prefetch
};

inline constexpr int64_t kGemvNarrowMaxM = 16;

struct GemvNarrowShape {
  int64_t m = 0;  // num_tokens, 0..kGemvNarrowMaxM (0: Run is a no-op)
  int64_t n = 0;  // out_features (rows of w)
  int64_t k = 0;  // in_features; fp8: a multiple of 16
  GemvWeight weight = GemvWeight::kF8E4M3Block128;

  std::string DebugString() const;
};

// Launch geometry: grid (row_blocks, splits) of 256-thread CTAs; CTA (i, s) covers weight rows
// [128 i, 128 i + 128) and 128-column groups [s · groups_per_split, (s + 1) · groups_per_split).
struct GemvNarrowTiling {
  int64_t row_blocks = 0;
  int splits = 1;
  int groups_per_split = 0;
  int x_stride_bytes = 0;    // shared-memory row stride of the staged x
  size_t smem_bytes = 0;     // dynamic shared memory per CTA
  size_t partial_bytes = 0;  // workspace: splits · m · n fp32 when splits > 1, else 0
  int64_t counters = 0;      // int32 arrival counters (row_blocks when splits > 1, else 0)
  // > 1: the splits of a row block are one cluster of this many CTAs (== splits), reduced
  // through distributed shared memory (partial_bytes and counters are 0). 1: kGlobal.
  int cluster = 1;
  size_t reduce_offset = 0;  // cluster: byte offset of the [m][128] fp32 partials in smem
  int stage_batch = 1;       // GemvNarrowTuning::stage_batch resolved: 1, 4 or 8
  int prefetch_steps = 0;    // GemvNarrowTuning::prefetch_steps resolved (>= 0)
  bool batched_reduce = true;

  std::string DebugString() const;
};

// Pure planning (no CUDA calls; tested without a GPU). limits.max_blocks_per_sm_cap is the
// kernel's resident CTAs per SM by registers (0: 2). The K range per CTA is capped so that its
// staged x fits half an SM's shared memory (at least 48 KiB, at most the per-block opt-in), and
// K is split until the grid fills one wave of resident CTAs. InvalidArgument for a bad shape.
// options.reduce / max_cluster pick the split-K reduction (GemvSplitReduce); the residency
// check of kAuto needs the device and is made by GemvNarrowPlan::Create.
absl::StatusOr<GemvNarrowTiling> PlanGemvNarrow(const GemvNarrowShape& shape,
                                                const DeviceLimits& limits,
                                                const GemvNarrowOptions& options = {});

struct GemvNarrowArgs {
  const float* x = nullptr;  // [m, k] fp32, row stride ldx (>= k); 4-byte aligned
  int64_t ldx = 0;
  const void* w = nullptr;   // [n, k] bf16 / e4m3, row stride ldw elements; 16-byte aligned
  int64_t ldw = 0;           // bf16: multiple of 8; fp8: multiple of 16 (>= k)
  const float* w_scales = nullptr;  // fp8: [ceil(n/128), w_scale_ld], w_scale_ld >= ceil(k/128)
  int64_t w_scale_ld = 0;
  float* y = nullptr;        // [m, n] fp32, row stride ldy (>= n); must not overlap x or w
  int64_t ldy = 0;
  bool accumulate = false;   // y += result
  // Programmatic dependent launch (where PdlLaunches(), cuda_util.h; else ignored): the kernel
  // may start, and stream its first weight bytes, while the previous kernel in the stream is
  // finishing; it reads x and touches y, the workspace and the counters only after that kernel
  // completed. So w must not be written by the kernel launched just before (weights are
  // immutable here).
  bool overlap_previous = false;
  // Fused RmsNorm (kernels/rmsnorm.h), null for none: the kernel multiplies RmsNorm(x) =
  // norm_w * x * rsqrt(mean(x^2) + norm_eps) per token row instead of x, and writes it to
  // norm_out ([m, k], row stride norm_out_ld; must not overlap x, norm_w, y or w): the same bits as
  // RmsNorm(x -> norm_out) followed by Run on norm_out, one launch instead of two. Needs what
  // RmsNorm's vector kernel needs (GemvNormFusible: x, norm_w and norm_out 16-byte aligned, ldx,
  // norm_out_ld and k multiples of 4, k <= 8192), so that the scale is RmsNorm's bit for bit.
  // Each CTA sums its tokens' whole rows once more (k x m fp32 from L2 per CTA).
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  float* norm_out = nullptr;
  int64_t norm_out_ld = 0;
};

// Whether a's fused RmsNorm meets its rules (above) for a call of m x k; false when a has none.
bool GemvNormFusible(const GemvNarrowArgs& a, int64_t m, int64_t k);

class GemvNarrowPlan {
 public:
  // Plans for the current device (QueryDeviceLimits under policy.smem_cap_bytes / max_sms).
  // InvalidArgument for a bad shape; FailedPrecondition on a device older than compute
  // capability 8.0 (sm_80 widens e4m3 in software). `reduce` picks the split-K reduction (kAuto in production).
  // ctas_per_sm: GemvNarrowOptions::ctas_per_sm (0: the kernel's occupancy). tuning:
  // GemvNarrowTuning (latency knobs, same values; auto in production).
  static absl::StatusOr<GemvNarrowPlan> Create(const GemvNarrowShape& shape,
                                               GemvSplitReduce reduce = GemvSplitReduce::kAuto,
                                               int ctas_per_sm = 0,
                                               const GemvNarrowTuning& tuning = {},
                                               const KernelPolicy& policy = {});

  // Enqueues one kernel on `stream`. workspace: >= workspace_bytes() of device memory, 16-byte
  // aligned (may be null when workspace_bytes() == 0). counters: >= num_counters() int32 of
  // device memory that are zero on entry; Run leaves them zero (so one buffer serves every plan,
  // one launch at a time). Checks pointers, strides and alignment (InvalidArgument naming the
  // rule). Allocates nothing: graph-capturable.
  absl::Status Run(const GemvNarrowArgs& args, void* workspace, size_t workspace_bytes,
                   int32_t* counters, int64_t num_counters, cudaStream_t stream) const;

  const GemvNarrowShape& shape() const { return shape_; }
  const GemvNarrowTiling& tiling() const { return tiling_; }
  size_t workspace_bytes() const { return tiling_.partial_bytes; }
  int64_t num_counters() const { return tiling_.counters; }
  std::string DebugString() const;

 private:
  GemvNarrowShape shape_;
  GemvNarrowTiling tiling_;
  bool pdl_ = false;  // the device has programmatic dependent launch (9.0+)
};

}  // namespace glm::kernels
