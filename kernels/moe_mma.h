// fp8 routed experts on tensor cores (moe_mma.cuh). Launchers for kernels/moe.cu (CUDA sources
// only: op_util.h).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe_common.h"
#include "kernels/op_util.h"

namespace glm::kernels::moe {

inline constexpr int kMmaWarps = 8;
inline constexpr int kMmaKB = 128;                // K block (= the fp8 scale block)
inline constexpr int kMmaSplitRow = 3 * kMmaKB;   // f16 values per K block of a split row
inline constexpr int kMmaChunk = 64;              // k per fragment load

struct MmaParams {
  const MoeExpert* experts;
  const __half* bsplit;  // split rows: fused x [tokens, ...], down act [pairs, ...]
  const float* binv;     // [rows, kblocks]
  int kblocks, n, k, top_k;
  float* c;  // [pairs, n]
};

// Splits `rows` rows of src (k = p.k wide, row stride src_ld) into p.bsplit / p.binv ([rows,
// p.kblocks, 3, kMmaKB] f16, [rows, p.kblocks] fp32), then runs MoeMmaKernel<fused> over the
// lists' slots (at most max_slots). fp8 weights only (the caller checks).
absl::Status LaunchMma(bool fused, const MmaParams& p, const float* src, int64_t src_ld,
                       int64_t rows, const DecodeLists& l, int64_t max_slots,
                       const detail::DeviceInfo& info, cudaStream_t stream);

}  // namespace glm::kernels::moe
