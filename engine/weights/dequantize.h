// Conversion of checkpoint tensors to fp32: plain floats, FP8 E4M3 with block scales, and the
// two 4/8-bit weight formats of ../shared/specs/quantized-checkpoints.md (compressed-tensors
// pack-quantized INT4/INT8, ModelOpt NVFP4). Dequantization is exact: every decoded value is
// code * scale(s) computed in fp32, as the reference implementations compute it.
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

// compressed-tensors pack-quantized INT4/INT8 (spec §1.4-1.5), symmetric:
//   weight_packed  I32 [rows, ceil(cols * num_bits / 32)]: element k of a row sits at bit offset
//                  num_bits * (k mod (32 / num_bits)) of word k / (32 / num_bits), low bits first,
//                  offset-unsigned: q = u - 8 (INT4, -8..7) or u - 128 (INT8, -128..127)
//   weight_scale   BF16 (or F16/F32) [rows, ceil(cols / group_size)], or [rows, 1] per channel
//   W[r, k] = q[r, k] * scale[r, k / group_size]
struct PackedIntLayout {
  int64_t rows = 0;        // weight_shape[0] (out)
  int64_t cols = 0;        // weight_shape[1] (in)
  int num_bits = 4;        // 4 or 8
  int64_t group_size = 0;  // inputs per scale; 0 = one scale per output channel
};
// Checks dtypes and shapes of `packed` and `scale` against `layout`; messages name the tensors.
absl::Status CheckPackedInt(const TensorView& packed, const TensorView& scale,
                            const PackedIntLayout& layout);
// Rows [row_begin, row_end) x cols [col_begin, col_end) of the logical [rows, cols] weight as
// fp32. A column range must start on a group boundary and end on one or at `cols` (a tensor-
// parallel slice may not split a quantization group; per-channel scales allow any range).
absl::StatusOr<std::vector<float>> DecodePackedIntRegion(const TensorView& packed,
                                                         const TensorView& scale,
                                                         const PackedIntLayout& layout,
                                                         int64_t row_begin, int64_t row_end,
                                                         int64_t col_begin, int64_t col_end);

// ModelOpt NVFP4 (spec §2.3-2.4), 16 inputs per block scale:
//   weight          U8 [rows, cols / 2]: e2m1 codes, element 2i in the low nibble of byte i
//   weight_scale    F8_E4M3 [rows, ceil(cols / 16)], row-major as on disk
//   weight_scale_2  F32 scalar (per tensor; gate and up projections each keep their own)
//   W[r, k] = e2m1(code[r, k]) * e4m3(weight_scale[r, k / 16]) * weight_scale_2
constexpr int64_t kNvfp4GroupSize = 16;
// e2m1 code (bit 3 = sign) to its value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
float E2m1ToFloat(uint8_t code);
// Checks dtypes and shapes; the logical shape is [weight.rows, 2 * weight.cols].
absl::Status CheckNvfp4(const TensorView& weight, const TensorView& scale,
                        const TensorView& scale_2);
// As DecodePackedIntRegion, with column ranges on 16-input block boundaries.
absl::StatusOr<std::vector<float>> DecodeNvfp4Region(const TensorView& weight,
                                                     const TensorView& scale,
                                                     const TensorView& scale_2, int64_t row_begin,
                                                     int64_t row_end, int64_t col_begin,
                                                     int64_t col_end);

}  // namespace glm::engine
