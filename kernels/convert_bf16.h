// fp32 rows to bf16 (round to nearest even): the activation conversion in front of the bf16 /
// fp8 GEMMs of the narrow-weight Linear (engine/backend/cuda/cuda_linear.h; gemm_bf16.h and
// gemm_fp8_block.h take bf16 x).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace glm::kernels {

// dst[r, c] = bf16(src[r, c]) for r < rows, c < cols; row strides in elements (src fp32, dst
// bf16, both device memory, not overlapping). One launch of at most 4096 CTAs x 256 threads,
// enqueued on `stream`; nothing for an empty matrix.
absl::Status ConvertRowsToBf16(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                               void* dst, int64_t dst_ld, cudaStream_t stream);

}  // namespace glm::kernels
