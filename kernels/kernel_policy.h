// KernelPolicy: the choices a caller may make about how the CUDA ops run, passed in as a value
// (ModelLoadOptions::kernel_policy -> CreateBackend -> the CUDA backend -> each op's launcher).
// Library code reads no environment variable and keeps no process-global switch: production
// runs the defaults below, which are the measured-fastest paths; tests and benches build the
// policy they want (a forced path to compare against the reference, a smaller shared-memory
// budget to exercise another chip's launch plan). Plain C++: the CPU-only build carries it too.
#pragma once

#include <cstdint>

namespace glm::kernels {

// Dense Linear / GEMV choices (kernels/gemv_narrow, gemv_quant, per_head_gemv;
// engine/backend/cuda). The GEMV / GEMM cut-over, the norm fusion and the GEMV's split and
// prefetch all follow the shape (engine/backend/cuda/cuda_linear.cc GemvPreferred,
// kernels/gemv_narrow.cu).
struct LinearPolicy {
  // The nvfp4 decode GEMV (kernels/gemv_quant.h). kWidenBf16: the weight-only contract (bf16
  // activations, exact weights; every device). kFp4Mma: activations quantized to nvfp4 and both
  // operands on the block-scaled FP4 tensor cores (kernels/gemv_quant_fp4.h has the contract,
  // which changes the numerics); compute capability 12.0 / 12.1 with sm_120a / sm_121a code only,
  // GemvQuantPlan::Create refuses it elsewhere. Opt-in: a test / bench choice until measured.
  enum class Nvfp4Path : uint8_t { kWidenBf16, kFp4Mma };
  Nvfp4Path nvfp4_path = Nvfp4Path::kWidenBf16;
};

// Routed-expert (MoE) choices (kernels/moe.h).
struct MoePolicy {
  // kAuto: the default path of each shape range (kernels/moe.h). The others force one path, so a
  // test can compare every kernel with the tiled reference on shapes outside its default range
  // and a bench can time them side by side; a forced path outside its limits is an error.
  enum class Path {
    kAuto,
    kDecode,   // weight-streaming decode kernels (tokens * top_k <= 64)
    kGrouped,  // token-group kernels over device token lists (<= 4096 pairs)
    kMma,      // fp8 experts on tensor cores (<= 4096 pairs)
    kTiled,    // tiled grouped GEMM (any size; the reference)
  };
  Path path = Path::kAuto;
};

// DSA lightning-indexer choices (kernels/dsa_indexer.h; dsa_indexer.cu has the rules by shape).
// Tests force a path to compare the paths bit for bit on one input; benches to re-measure a
// cut-over. Production keeps kByShape.
struct IndexerPolicy {
  // The top-k select path.
  enum class Select : uint8_t {
    kByShape,    // production: kShortRow up to 16K keys, else kMultiCta for rows < SMs, else
                 // kSingleCta
    kSingleCta,  // one CTA per row, radix passes over the row in global memory (the plain path)
    kMultiCta,   // radix passes and the ordered output spread over the whole GPU
    kShortRow,   // the row once in shared memory, where it fits (else as kByShape)
  };
  // The score kernel.
  enum class Score : uint8_t {
    kByShape,         // production: tensor core where it applies ({4,8} for >= 8 rows or rows
                      // of > 16K keys, else {2,2,2}), else fp32
    kFp32,            // the fp32 CUDA-core kernel always (fp32 or fp8 keys)
    kTensorCore,      // the {2,2,2} tensor-core kernel where it applies, else fp32
    kTensorCoreWide,  // the {4,8} tensor-core kernel where it applies, else fp32
  };
  Select select = Select::kByShape;
  Score score = Score::kByShape;
};

// Which kernel MLA attention runs (kernels/mla_attention.h has the rule by shape).
enum class MlaAttentionPath : uint8_t {
  kByShape,     // production: tensor core where it applies, else staged / split by shape
  kSplit,       // CUDA-core flash-decoding, key tiles read from global memory (the plain path)
  kStaged,      // CUDA-core, key tiles staged in shared memory by cp.async, where it applies
  kTensorCore,  // split-bf16 mma.sync over the fp8 latent (GLM-5 widths), where it applies
};

// MLA attention and fp8 KV choices (kernels/mla_*, kernels/kv_fp8).
struct AttentionPolicy {
  // Tests and benches force one kernel to compare it with another at the same shape; a path
  // that does not apply to a call falls back to the choice by shape (kSplit always applies).
  MlaAttentionPath path = MlaAttentionPath::kByShape;
  // Tensor-core path: heads per CTA (16, 32 or 64; must divide the head count); 0 = by shape.
  int tc_heads_per_cta = 0;
  // Absorbed decode on bf16 / fp8 models: kv_b_proj widened to fp32 at load with a transposed
  // W_UK^T copy and both products on the fp32 per-head GEMM, as fp32 models run it, instead of
  // the narrow per-head kernels on kv_b as stored (engine/model/layers.h MlaAttention::w_uk_t).
  // Read when the model loads its weights; a test / bench choice.
  bool absorb_fp32 = false;
};

struct KernelPolicy {
  // Plan launches as a device with at most this much opt-in shared memory per block (bytes;
  // 0 = the device's own). Tests and benches set GB10's 99 KiB (Gb10Limits in device_limits.h)
  // on a larger GPU to run the plans a DGX Spark would run. Caps only ever lower.
  int64_t smem_cap_bytes = 0;
  // Plan as a device with at most this many SMs (0 = the device's own).
  int max_sms = 0;

  LinearPolicy linear;
  MoePolicy moe;
  IndexerPolicy indexer;
  AttentionPolicy attention;
};

}  // namespace glm::kernels
