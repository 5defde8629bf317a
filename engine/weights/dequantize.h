// Conversion of checkpoint tensors to fp32, including FP8 E4M3 with block scales.
//
// Block-scaled FP8 (DeepSeek-V3 / GLM-5 "fp8", ../shared/specs/glm5-architecture.md §4):
//   weight            F8_E4M3 [rows, cols]
//   weight_scale_inv  F32     [ceil(rows / block.rows), ceil(cols / block.cols)]
//   W[i, j] = fp8(weight[i, j]) * weight_scale_inv[i / block.rows, j / block.cols]
// (the name says "inv" but the tensor is the multiplier). Edge blocks may be partial.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/weights/tensor_view.h"

namespace glm::engine {

// quantization_config.weight_block_size ([rows, cols]).
struct BlockSize {
  int64_t rows = 128;
  int64_t cols = 128;
};

// How a tensor is seen for slicing: rows = shape[0] (1 for a scalar), cols = product of the
// remaining dims (1 for a vector).
struct MatrixExtent {
  int64_t rows = 1;
  int64_t cols = 1;
};
MatrixExtent AsMatrix(const std::vector<int64_t>& shape);

// True for the dtypes DecodeRegion converts: F32, F16, BF16, F8_E4M3.
bool IsFloatDType(DType dtype);

// Checks that `scale` is the block scale of `weight`: weight F8_E4M3 and 2-D, scale a float
// dtype (F32, BF16 or F16) of shape [ceil(rows / block.rows), ceil(cols / block.cols)].
absl::Status CheckBlockScale(const TensorView& weight, const TensorView& scale, BlockSize block);

// Decodes rows [row_begin, row_end) x cols [col_begin, col_end) of `tensor` (seen as AsMatrix)
// to fp32, row-major [row_end - row_begin, col_end - col_begin]. `scale` (may be null) is the
// block scale of an F8_E4M3 weight and is validated with CheckBlockScale. Large regions are
// converted on several threads. kInvalidArgument for a bad range, kUnimplemented for a
// non-float dtype.
absl::StatusOr<std::vector<float>> DecodeRegion(const TensorView& tensor, const TensorView* scale,
                                                BlockSize block, int64_t row_begin,
                                                int64_t row_end, int64_t col_begin,
                                                int64_t col_end);

// The whole tensor as fp32 in its own shape (row-major).
absl::StatusOr<std::vector<float>> DecodeToFloat(const TensorView& tensor,
                                                 const TensorView* scale = nullptr,
                                                 BlockSize block = {});

}  // namespace glm::engine
