// Greedy sampling: per row, the index of the largest logit, ties to the lowest index (as
// engine/sample ArgMax). NaN is never chosen; a row of only NaN gives 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

// logits: [rows, vocab] with row stride ld, `dtype` on the device; out_ids: [rows] int32.
absl::Status ArgmaxRows(DType dtype, const void* logits, int64_t ld, int64_t rows, int64_t vocab,
                        int32_t* out_ids, cudaStream_t stream);

}  // namespace glm::kernels
