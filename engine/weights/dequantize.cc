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

  const int64_t total = out_rows * out_cols;
  unsigned num_threads = 1;
  if (total >= kParallelMinElements && out_rows > 1) {
    num_threads = std::clamp(std::thread::hardware_concurrency(), 1u, kMaxThreads);
    num_threads = static_cast<unsigned>(std::min<int64_t>(num_threads, out_rows));
  }
  if (num_threads <= 1) {
    convert_rows(0, out_rows);
    return out;
  }
  std::vector<std::thread> workers;
  workers.reserve(num_threads - 1);
  const int64_t per_thread = CeilDiv(out_rows, num_threads);
  for (unsigned t = 1; t < num_threads; ++t) {
    const int64_t first = std::min<int64_t>(out_rows, t * per_thread);
    const int64_t last = std::min<int64_t>(out_rows, first + per_thread);
    if (first < last) workers.emplace_back(convert_rows, first, last);
  }
  convert_rows(0, std::min(out_rows, per_thread));
  for (auto& worker : workers) worker.join();
  return out;
}

absl::StatusOr<std::vector<float>> DecodeToFloat(const TensorView& tensor,
                                                 const TensorView* scale, BlockSize block) {
  const MatrixExtent extent = AsMatrix(tensor.shape);
  return DecodeRegion(tensor, scale, block, 0, extent.rows, 0, extent.cols);
}

}  // namespace glm::engine
