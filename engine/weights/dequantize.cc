#include "engine/weights/dequantize.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/weights/float_codec.h"

namespace glm::engine {
namespace {

// Regions with fewer elements are converted on the calling thread.
constexpr int64_t kParallelMinElements = int64_t{1} << 21;
constexpr unsigned kMaxThreads = 16;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Converts `count` consecutive elements starting at `src` into `dst`.
void DecodeRun(DType dtype, const std::byte* src, int64_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = Bf16ToFloat(bits);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = F16ToFloat(bits);
      }
      return;
    case DType::kF8E4M3:
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = Fp8E4M3ToFloat(static_cast<uint8_t>(src[i]));
      }
      return;
    default:
      return;  // rejected before we get here
  }
}

absl::Status CheckView(const TensorView& tensor) {
  const int64_t numel = tensor.num_elements();
  if (static_cast<uint64_t>(numel) * DTypeSize(tensor.dtype) != tensor.nbytes ||
      (tensor.data == nullptr && tensor.nbytes != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "': view holds ", tensor.nbytes, " bytes but ",
                     ToAbsl(DTypeName(tensor.dtype)), " ", ShapeToString(tensor.shape),
                     " needs ", static_cast<uint64_t>(numel) * DTypeSize(tensor.dtype)));
  }
  return absl::OkStatus();
}

// Runs fn(first, last) over [0, rows) on the calling thread, or split across up to kMaxThreads
// threads when the region holds at least kParallelMinElements values.
template <typename Fn>
void ForEachRowRange(int64_t rows, int64_t total, const Fn& fn) {
  unsigned num_threads = 1;
  if (total >= kParallelMinElements && rows > 1) {
    num_threads = std::clamp(std::thread::hardware_concurrency(), 1u, kMaxThreads);
    num_threads = static_cast<unsigned>(std::min<int64_t>(num_threads, rows));
  }
  if (num_threads <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(num_threads - 1);
  const int64_t per_thread = CeilDiv(rows, num_threads);
  for (unsigned t = 1; t < num_threads; ++t) {
    const int64_t first = std::min<int64_t>(rows, t * per_thread);
    const int64_t last = std::min<int64_t>(rows, first + per_thread);
    if (first < last) workers.emplace_back([&fn, first, last] { fn(first, last); });
  }
  fn(int64_t{0}, std::min(rows, per_thread));
  for (auto& worker : workers) worker.join();
}

// Rejects a region outside [rows, cols] and a column range that splits a `group`-wide
// quantization group (group 0: no constraint).
absl::Status CheckRegion(std::string_view name, int64_t rows, int64_t cols, int64_t group,
                         int64_t row_begin, int64_t row_end, int64_t col_begin,
                         int64_t col_end) {
  if (row_begin < 0 || row_begin > row_end || row_end > rows || col_begin < 0 ||
      col_begin > col_end || col_end > cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", ToAbsl(name), "' [", rows, ", ", cols, "]: region rows [", row_begin, ", ",
        row_end, ") cols [", col_begin, ", ", col_end, ") is out of range"));
  }
  if (group > 0 && (col_begin % group != 0 || (col_end % group != 0 && col_end != cols))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", ToAbsl(name), "' [", rows, ", ", cols, "]: column slice [", col_begin, ", ",
        col_end, ") splits a quantization group of ", group,
        " inputs; a tensor-parallel share of the input dimension must be a multiple of the "
        "group size: choose a tensor-parallel size that divides ", cols / group, " groups"));
  }
  return absl::OkStatus();
}

// A small scale tensor (any float dtype) as fp32.
std::vector<float> DecodeAll(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  DecodeRun(t.dtype, t.data, t.num_elements(), out.data());
  return out;
}

}  // namespace

MatrixExtent AsMatrix(const std::vector<int64_t>& shape) {
  MatrixExtent extent;
  if (shape.empty()) return extent;
  extent.rows = shape[0];
  for (size_t i = 1; i < shape.size(); ++i) extent.cols *= shape[i];
  return extent;
}

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF8E4M3;
}

absl::Status CheckBlockScale(const TensorView& weight, const TensorView& scale, BlockSize block) {
  if (block.rows <= 0 || block.cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", weight.name, "': weight_block_size [", block.rows, ", ", block.cols,
        "] must be positive; fix quantization_config.weight_block_size in config.json"));
  }
  if (weight.dtype != DType::kF8E4M3 || weight.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", weight.name, "' is ", ToAbsl(DTypeName(weight.dtype)), " ",
        ShapeToString(weight.shape), " but has a block scale '", scale.name,
        "'; only 2-D F8_E4M3 weights are block-scaled: the checkpoint is inconsistent, "
        "re-export it"));
  }
  if (scale.dtype != DType::kF32 && scale.dtype != DType::kBF16 && scale.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale '", scale.name, "' is ", ToAbsl(DTypeName(scale.dtype)),
        "; block scales must be F32 (or BF16/F16): the checkpoint is inconsistent, re-export it"));
  }
  const std::vector<int64_t> expected = {CeilDiv(weight.shape[0], block.rows),
                                         CeilDiv(weight.shape[1], block.cols)};
  if (scale.shape != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale '", scale.name, "' has shape ", ShapeToString(scale.shape), " but weight '",
        weight.name, "' ", ShapeToString(weight.shape), " with ", block.rows, "x", block.cols,
        " blocks needs ", ShapeToString(expected),
        "; check quantization_config.weight_block_size in config.json or re-export the "
        "checkpoint"));
  }
  return CheckView(scale);
}

absl::StatusOr<std::vector<float>> DecodeRegion(const TensorView& tensor, const TensorView* scale,
                                                BlockSize block, int64_t row_begin,
                                                int64_t row_end, int64_t col_begin,
                                                int64_t col_end) {
  if (!IsFloatDType(tensor.dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor '", tensor.name, "' is ", ToAbsl(DTypeName(tensor.dtype)),
        "; only F32, F16, BF16 and F8_E4M3 convert to fp32 (read integer tensors raw)"));
  }
  GLM_RETURN_IF_ERROR(CheckView(tensor));
  const MatrixExtent extent = AsMatrix(tensor.shape);
  if (row_begin < 0 || row_begin > row_end || row_end > extent.rows || col_begin < 0 ||
      col_begin > col_end || col_end > extent.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor.name, "' ", ShapeToString(tensor.shape), " (as ", extent.rows, "x",
        extent.cols, "): region rows [", row_begin, ", ", row_end, ") cols [", col_begin, ", ",
        col_end, ") is out of range"));
  }
  std::vector<float> scales;
  int64_t scale_cols = 0;
  if (scale != nullptr) {
    GLM_RETURN_IF_ERROR(CheckBlockScale(tensor, *scale, block));
    scales.resize(static_cast<size_t>(scale->num_elements()));
    DecodeRun(scale->dtype, scale->data, scale->num_elements(), scales.data());
    scale_cols = scale->shape[1];
  }

  const int64_t out_rows = row_end - row_begin;
  const int64_t out_cols = col_end - col_begin;
  std::vector<float> out(static_cast<size_t>(out_rows * out_cols));
  const size_t element_size = DTypeSize(tensor.dtype);

  // Converts output rows [first, last).
  auto convert_rows = [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t row = row_begin + r;
      float* dst = out.data() + r * out_cols;
      const std::byte* src =
          tensor.data + static_cast<size_t>(row * extent.cols + col_begin) * element_size;
      DecodeRun(tensor.dtype, src, out_cols, dst);
      if (scale == nullptr) continue;
      const float* scale_row = scales.data() + (row / block.rows) * scale_cols;
      for (int64_t c = 0; c < out_cols;) {
        const int64_t col = col_begin + c;
        const int64_t block_end = std::min(col_end, (col / block.cols + 1) * block.cols);
        const float factor = scale_row[col / block.cols];
        for (; c < block_end - col_begin; ++c) dst[c] *= factor;
      }
    }
  };

  ForEachRowRange(out_rows, out_rows * out_cols, convert_rows);
  return out;
}

absl::StatusOr<std::vector<float>> DecodeToFloat(const TensorView& tensor,
                                                 const TensorView* scale, BlockSize block) {
  const MatrixExtent extent = AsMatrix(tensor.shape);
  return DecodeRegion(tensor, scale, block, 0, extent.rows, 0, extent.cols);
}

absl::Status CheckPackedInt(const TensorView& packed, const TensorView& scale,
                            const PackedIntLayout& layout) {
  if (layout.num_bits != 4 && layout.num_bits != 8) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", packed.name, "': num_bits ",
                                                   layout.num_bits, " is not supported; expected "
                                                   "4 or 8"));
  }
  if (packed.dtype != DType::kI32 || packed.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", packed.name, "' is ", ToAbsl(DTypeName(packed.dtype)), " ",
        ShapeToString(packed.shape), "; pack-quantized weights are 2-D I32: the checkpoint is "
        "inconsistent, re-export it"));
  }
  const int64_t per_word = 32 / layout.num_bits;
  const std::vector<int64_t> want_packed = {layout.rows, CeilDiv(layout.cols, per_word)};
  if (packed.shape != want_packed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", packed.name, "' has shape ", ShapeToString(packed.shape), " but a [",
        layout.rows, ", ", layout.cols, "] weight of ", layout.num_bits, "-bit values packs to ",
        ShapeToString(want_packed), "; weight_shape, num_bits (config_groups) and the packed "
        "tensor disagree: check quantization_config or re-export the checkpoint"));
  }
  if (scale.dtype != DType::kBF16 && scale.dtype != DType::kF16 && scale.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale '", scale.name, "' is ", ToAbsl(DTypeName(scale.dtype)),
        "; pack-quantized scales are BF16 (or F16/F32): re-export the checkpoint"));
  }
  const int64_t groups = layout.group_size > 0 ? CeilDiv(layout.cols, layout.group_size) : 1;
  const std::vector<int64_t> want_scale = {layout.rows, groups};
  if (scale.shape != want_scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale '", scale.name, "' has shape ", ShapeToString(scale.shape), " but a [",
        layout.rows, ", ", layout.cols, "] weight with ",
        layout.group_size > 0 ? absl::StrCat("group_size ", layout.group_size)
                              : std::string("per-channel scales"),
        " needs ", ShapeToString(want_scale),
        "; quantization_config (strategy / group_size) and the tensors disagree: check "
        "config.json or re-export the checkpoint"));
  }
  GLM_RETURN_IF_ERROR(CheckView(packed));
  return CheckView(scale);
}

absl::StatusOr<std::vector<float>> DecodePackedIntRegion(const TensorView& packed,
                                                         const TensorView& scale,
                                                         const PackedIntLayout& layout,
                                                         int64_t row_begin, int64_t row_end,
                                                         int64_t col_begin, int64_t col_end) {
  GLM_RETURN_IF_ERROR(CheckPackedInt(packed, scale, layout));
  GLM_RETURN_IF_ERROR(CheckRegion(packed.name, layout.rows, layout.cols, layout.group_size,
                                  row_begin, row_end, col_begin, col_end));
  const std::vector<float> scales = DecodeAll(scale);
  const int64_t scale_cols = scale.shape[1];
  const int64_t group = layout.group_size > 0 ? layout.group_size : layout.cols;
  const int bits = layout.num_bits;
  const int64_t per_word = 32 / bits;
  const uint32_t mask = (uint32_t{1} << bits) - 1;
  const int32_t offset = 1 << (bits - 1);  // 8 (INT4) or 128 (INT8)
  const int64_t words_per_row = packed.shape[1];
  const int64_t out_rows = row_end - row_begin;
  const int64_t out_cols = col_end - col_begin;
  std::vector<float> out(static_cast<size_t>(out_rows * out_cols));
  auto convert_rows = [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t row = row_begin + r;
      const std::byte* words = packed.data + static_cast<size_t>(row * words_per_row) * 4;
      const float* scale_row = scales.data() + row * scale_cols;
      float* dst = out.data() + r * out_cols;
      for (int64_t c = 0; c < out_cols; ++c) {
        const int64_t k = col_begin + c;
        uint32_t word;
        std::memcpy(&word, words + static_cast<size_t>(k / per_word) * 4, 4);
        const uint32_t u = (word >> (bits * (k % per_word))) & mask;
        const int32_t q = static_cast<int32_t>(u) - offset;
        dst[c] = static_cast<float>(q) * scale_row[k / group];
      }
    }
  };
  ForEachRowRange(out_rows, out_rows * out_cols, convert_rows);
  return out;
}

float E2m1ToFloat(uint8_t code) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float magnitude = kValues[code & 7];
  return (code & 8) != 0 ? -magnitude : magnitude;
}

absl::Status CheckNvfp4(const TensorView& weight, const TensorView& scale,
                        const TensorView& scale_2) {
  if (weight.dtype != DType::kU8 || weight.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", weight.name, "' is ", ToAbsl(DTypeName(weight.dtype)), " ",
        ShapeToString(weight.shape), " next to an NVFP4 block scale; NVFP4 weights are 2-D U8 "
        "(two e2m1 codes per byte): the checkpoint is inconsistent, re-export it"));
  }
  const int64_t rows = weight.shape[0];
  const int64_t cols = weight.shape[1] * 2;
  const std::vector<int64_t> want_scale = {rows, CeilDiv(cols, kNvfp4GroupSize)};
  if (scale.dtype != DType::kF8E4M3 || scale.shape != want_scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale '", scale.name, "' is ", ToAbsl(DTypeName(scale.dtype)), " ",
        ShapeToString(scale.shape), " but NVFP4 weight '", weight.name, "' [", rows, ", ", cols,
        "] needs F8_E4M3 ", ShapeToString(want_scale),
        " (one scale per 16 inputs): re-export the checkpoint"));
  }
  if ((scale_2.dtype != DType::kF32 && scale_2.dtype != DType::kBF16 &&
       scale_2.dtype != DType::kF16) ||
      scale_2.num_elements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", scale_2.name, "' is ", ToAbsl(DTypeName(scale_2.dtype)), " ",
        ShapeToString(scale_2.shape), "; weight_scale_2 is one F32 value per weight: "
        "re-export the checkpoint"));
  }
  GLM_RETURN_IF_ERROR(CheckView(weight));
  GLM_RETURN_IF_ERROR(CheckView(scale));
  return CheckView(scale_2);
}

absl::StatusOr<std::vector<float>> DecodeNvfp4Region(const TensorView& weight,
                                                     const TensorView& scale,
                                                     const TensorView& scale_2, int64_t row_begin,
                                                     int64_t row_end, int64_t col_begin,
                                                     int64_t col_end) {
  GLM_RETURN_IF_ERROR(CheckNvfp4(weight, scale, scale_2));
  const int64_t rows = weight.shape[0];
  const int64_t cols = weight.shape[1] * 2;
  GLM_RETURN_IF_ERROR(CheckRegion(weight.name, rows, cols, kNvfp4GroupSize, row_begin, row_end,
                                  col_begin, col_end));
  const float global = DecodeAll(scale_2)[0];
  const int64_t scale_cols = scale.shape[1];
  const int64_t out_rows = row_end - row_begin;
  const int64_t out_cols = col_end - col_begin;
  std::vector<float> out(static_cast<size_t>(out_rows * out_cols));
  auto convert_rows = [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t row = row_begin + r;
      const auto* bytes = reinterpret_cast<const uint8_t*>(weight.data) + row * weight.shape[1];
      const auto* block_scales = reinterpret_cast<const uint8_t*>(scale.data) + row * scale_cols;
      float* dst = out.data() + r * out_cols;
      for (int64_t c = 0; c < out_cols; ++c) {
        const int64_t k = col_begin + c;
        const uint8_t byte = bytes[k / 2];
        const uint8_t code = (k % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
        // e2m1 * e4m3 is exact in fp32 (at most 6 significant bits), so the result is the
        // correctly rounded product of the three factors.
        dst[c] = E2m1ToFloat(code) * Fp8E4M3ToFloat(block_scales[k / kNvfp4GroupSize]) * global;
      }
    }
  };
  ForEachRowRange(out_rows, out_rows * out_cols, convert_rows);
  return out;
}

}  // namespace glm::engine
