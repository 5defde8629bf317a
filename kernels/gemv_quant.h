// Decode GEMV and widening for Linear layers whose weights stay 4/8-bit on the GPU, in the two
// checkpoint formats of ../shared/specs/quantized-checkpoints.md (§1.4-1.5, §2.3-2.4; the CPU
// decoders are engine/weights/dequantize.h DecodePackedIntRegion / DecodeNvfp4Region):
//   y[m, n] (+)= bf16(x)[m, k] . W[n, k]^T,   m <= kGemvQuantMaxM (16)
// - kInt4 / kInt8 (compressed-tensors pack-quantized, symmetric, group or channel strategy):
//   data = weight_packed int32 [n, k * bits / 32]: element kk of a row at bit offset
//   bits * (kk mod (32 / bits)) of word kk / (32 / bits), low bits first; q = u - 8 (INT4) or
//   u - 128 (INT8); scales = weight_scale bf16 [n, ceil(k / group_size)] (channel: group_size
//   = k, one scale per row); W[r][kk] = q * float(scale[r][kk / group_size]).
// - kNvfp4 (ModelOpt): data = weight u8 [n, k / 2], element 2i in the low nibble of byte i, e2m1
//   codes (bit 3 sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6); scales = weight_scale e4m3 bytes
//   [n, k / 16]; global_scale = weight_scale_2; W = e2m1 * float(e4m3) * global_scale.
// Numerics: x rounded to bf16 (RNE), multiplied by the exactly dequantized weight, products
// summed in fp32 (tensor cores; gemv_quant.cuh has how the dequantized values reach them
// exactly), y fp32 written or accumulated. Deterministic: the same inputs give the same bits on
// every launch (split-K partials summed in split order by the last CTA of a row block, as
// gemv_narrow's kGlobal path; no float atomics). Decode-bound: the packed weight is streamed
// once with 16-byte loads and widened in registers.
// Plans are made per (m, n, k, format, group, device) from the device's attributes (SM count,
// shared memory per block, the kernel's occupancy); Run allocates nothing and launches one
// kernel (graph-capturable).
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

enum class QuantFormat { kInt4, kInt8, kNvfp4 };

// "int4" / "int8" / "nvfp4".
const char* QuantFormatName(QuantFormat format);

// A quantized weight [rows = n, cols = k] in device memory (or host memory for the *Host
// functions). Rules (checked by Create / Run / DequantizeToBf16, InvalidArgument naming them):
// - data 16-byte aligned; ld_bytes a multiple of 16 and >= k * bits / 8 (int: 4 * words per row;
//   nvfp4: k / 2); k a multiple of 32 (int4, nvfp4) or 16 (int8), so a row is whole 16-byte
//   units.
// - int: group_size a multiple of 16 (>= k is one scale per row, the channel strategy); scales
//   bf16 [n, scale_ld] with scale_ld >= ceil(k / group_size), 2-byte aligned.
// - nvfp4: group_size == 16; scales e4m3 bytes [n, scale_ld], scale_ld >= k / 16.
struct QuantWeightView {
  QuantFormat format = QuantFormat::kInt4;
  const void* data = nullptr;
  int64_t ld_bytes = 0;          // packed row stride in bytes
  const void* scales = nullptr;  // per row: bf16 (int) / e4m3 bytes (nvfp4)
  int64_t scale_ld = 0;          // scale row stride, in elements
  int64_t group_size = 128;      // int: inputs per scale (>= k for channel); nvfp4: 16
  float global_scale = 1.0f;     // nvfp4 weight_scale_2; 1 for int (ignored)
  int64_t rows = 0, cols = 0;    // n (out_features), k (in_features)

  int bits() const { return format == QuantFormat::kInt8 ? 8 : 4; }
  std::string DebugString() const;
};

// Checks the view's shape, strides, group size and alignment against the rules above
// (InvalidArgument naming the rule and `what`).
absl::Status CheckQuantWeight(const QuantWeightView& w, const char* what = "w");

inline constexpr int64_t kGemvQuantMaxM = 16;

// y[m, n] (+)= bf16(x)[m, k] . W^T, fp32 accumulate; m <= kGemvQuantMaxM.
struct GemvQuantArgs {
  const float* x = nullptr;  // [m, k] fp32, row stride ldx (>= k); 4-byte aligned
  int64_t ldx = 0;
  QuantWeightView w;         // must equal the plan's shape (format, rows, cols, group_size)
  float* y = nullptr;        // [m, n] fp32, row stride ldy (>= n); must not overlap x or w
  int64_t ldy = 0;
  bool accumulate = false;   // y += result
};

// Launch geometry: grid (row_blocks, splits) of 256-thread CTAs; CTA (i, s) covers weight rows
// [128 i, 128 i + 128) and 64-byte row windows [s * windows_per_split, (s + 1) *
// windows_per_split) (a window is 128 int4 / nvfp4 or 64 int8 inputs).
struct GemvQuantTiling {
  int64_t row_blocks = 0;
  int splits = 1;
  int windows_per_split = 0;
  int x_stride_bytes = 0;    // shared-memory row stride of the staged bf16 x
  size_t smem_bytes = 0;     // dynamic shared memory per CTA
  size_t partial_bytes = 0;  // workspace: splits * m * n fp32 when splits > 1, else 0
  int64_t counters = 0;      // int32 arrival counters (row_blocks when splits > 1, else 0)
  // true: the int codes go through the tensor cores as they are and the group scale multiplies
  // each 64-byte window's sums (a group is whole windows); false: each weight is dequantized to
  // bf16 in registers (exactly: nvfp4 in one bf16, int as hi + lo, two products).
  bool window_scale = false;
  // nvfp4 only, LinearPolicy::Nvfp4Path::kFp4Mma: the FP4-activation kernel
  // (gemv_quant_fp4mma.cuh, gemv_quant_fp4.h's contract) on the same grid; its staged x needs
  // less than smem_bytes.
  bool fp4_mma = false;

  std::string DebugString() const;
};

// Pure planning (no CUDA calls; tested without a GPU). limits.max_blocks_per_sm_cap is the
// kernel's resident CTAs per SM (0: 2). The K range per CTA is capped so that its staged x fits
// half an SM's shared memory (at least 48 KiB, at most the per-block opt-in), and K is split
// until the grid fills one wave of resident CTAs. InvalidArgument for a bad shape (the rules of
// QuantWeightView, pointers not checked).
absl::StatusOr<GemvQuantTiling> PlanGemvQuant(int64_t m, const QuantWeightView& w,
                                              const DeviceLimits& limits);

class GemvQuantPlan {
 public:
  // Plans for the current device (QueryDeviceLimits under policy.smem_cap_bytes / max_sms) and
  // w's shape (format, rows, cols, group_size; its pointers are not used). InvalidArgument for a
  // bad shape; FailedPrecondition on a device older than compute capability 8.0, and for
  // policy.linear.nvfp4_path == kFp4Mma where the device or this build has no FP4 tensor-core
  // path (compute_capability.h Fp4MmaSupport; InvalidArgument for a non-nvfp4 weight).
  static absl::StatusOr<GemvQuantPlan> Create(int64_t m, const QuantWeightView& w,
                                              const KernelPolicy& policy = {});

  // Enqueues one kernel on `stream`. workspace: >= workspace_bytes() of device memory, 16-byte
  // aligned (may be null when 0). counters: >= num_counters() int32 of device memory that are
  // zero on entry; Run leaves them zero (one buffer serves every plan, one launch at a time).
  // Checks pointers, strides, alignment and that a.w matches the plan (InvalidArgument naming
  // the rule). Allocates nothing.
  absl::Status Run(const GemvQuantArgs& a, void* workspace, size_t workspace_bytes,
                   int32_t* counters, int64_t num_counters, cudaStream_t stream) const;

  int64_t m() const { return m_; }
  const QuantWeightView& shape() const { return shape_; }
  const GemvQuantTiling& tiling() const { return tiling_; }
  size_t workspace_bytes() const { return tiling_.partial_bytes; }
  int64_t num_counters() const { return tiling_.counters; }
  std::string DebugString() const;

 private:
  // Switches the plan to the FP4-activation kernel after the checks (Create, kFp4Mma).
  absl::Status UseFp4Mma(int device);

  int64_t m_ = 0;
  QuantWeightView shape_;  // pointers cleared
  GemvQuantTiling tiling_;
};

// W widened to bf16 [n, k] (row stride ld_out >= k elements, out_bf16 2-byte aligned) on
// `stream`: the prefill path (a bf16 GEMM on the widened copy in scratch) and the MoE fallback.
// Each output is the round-to-nearest-even bf16 of the exact fp32 value of
// DequantizeQuantHost (int4 q * bf16 scale has up to 11 significant bits and is not always a
// bf16; nvfp4 e2m1 * e4m3 is, and is then multiplied by global_scale in fp32). InvalidArgument
// for a bad view or stride.
absl::Status DequantizeToBf16(const QuantWeightView& w, void* out_bf16, int64_t ld_out,
                              cudaStream_t stream);

// Host mirrors (w's pointers are host memory). DequantizeQuantHost: W as fp32 [n, k] (row stride
// ld_out), exactly as the spec defines it: int q * float(scale); nvfp4 (e2m1 * float(e4m3)) *
// global_scale in fp32 (the first product is exact). GemvQuantHost: y[m, n] (+)= bf16(x) . W^T
// with W from DequantizeQuantHost, each product formed in fp32 (exact for int and for nvfp4's
// e2m1 * e4m3 part) and the products summed in double, then rounded to fp32 (a reference the
// GPU's fp32 sums are compared against with a tolerance relative to sum |x w|). nvfp4 applies
// global_scale to the sum (as the kernel does). Checks as CheckQuantWeight; m <= 16.
absl::Status DequantizeQuantHost(const QuantWeightView& w, float* out, int64_t ld_out);
absl::Status GemvQuantHost(int64_t m, const float* x, int64_t ldx, const QuantWeightView& w,
                           float* y, int64_t ldy, bool accumulate);

// The bf16 bits of x rounded to nearest even (NaN kept quiet).
uint16_t GemvQuantBf16Bits(float x);

}  // namespace glm::kernels
