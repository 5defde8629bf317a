// Writes safetensors files (tests, the tiny-checkpoint maker, conversion tools).
//
// Output matches the reference implementation's layout: header JSON with names sorted, padded
// with spaces to a multiple of 8 bytes; tensor data contiguous, in name order, no gaps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/weights/dequantize.h"
#include "engine/weights/dtype.h"

namespace glm::engine {

// Not thread-safe. Holds all tensor bytes in memory until WriteFile.
class SafetensorsWriter {
 public:
  // Adds a tensor from raw little-endian bytes; `bytes` must be numel * DTypeSize(dtype) long.
  // kInvalidArgument for a duplicate or reserved name, a negative dim or a size mismatch.
  absl::Status Add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                   std::span<const std::byte> bytes);
  // Adds fp32 values converted to `dtype` (F32, F16, BF16 round to nearest even; F8_E4M3
  // rounds to nearest even and saturates at ±448, without a scale).
  absl::Status AddFloat(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                        std::span<const float> values);
  // Block-quantizes a 2-D fp32 matrix [rows, cols]: per block scale = amax / 448 (1 for an
  // all-zero block), stored as `name` (F8_E4M3, must end in ".weight") and
  // "<name>_scale_inv" (F32 [ceil(rows / block.rows), ceil(cols / block.cols)]).
  absl::Status AddFp8BlockQuantized(const std::string& name, const std::vector<int64_t>& shape,
                                    std::span<const float> values, BlockSize block = {});
  // compressed-tensors pack-quantized, symmetric (specs/quantized-checkpoints.md §1.5): per
  // group of `group_size` inputs (0 = per output channel) scale = bf16(absmax / 7.5) for INT4,
  // bf16(absmax / 127.5) for INT8 (1 for an all-zero group); q = clamp(round_half_even(x /
  // scale)). Writes "<module>.weight_packed" I32, "<module>.weight_scale" BF16 and
  // "<module>.weight_shape" I64 [2]. `dequantized` (may be null) receives q * scale, [rows, cols].
  absl::Status AddPackQuantized(const std::string& module, const std::vector<int64_t>& shape,
                                std::span<const float> values, int num_bits, int64_t group_size,
                                std::vector<float>* dequantized = nullptr);
  // ModelOpt NVFP4 (§2.4): weight_scale_2 = amax / (6 * 448) (`weight_scale_2` overrides it
  // when > 0, e.g. to give gate and up different global scales); per 16 inputs
  // weight_scale = e4m3(amax / (6 * weight_scale_2)), at least 2^-9 (1 for a zero block); codes
  // = e2m1 round-half-even of x / (weight_scale * weight_scale_2). Writes "<module>.weight" U8,
  // "<module>.weight_scale" F8_E4M3, "<module>.weight_scale_2" and "<module>.input_scale" F32
  // scalars. `cols` must be even. `dequantized` receives e2m1 * weight_scale * weight_scale_2.
  absl::Status AddNvfp4Quantized(const std::string& module, const std::vector<int64_t>& shape,
                                 std::span<const float> values,
                                 std::vector<float>* dequantized = nullptr,
                                 float weight_scale_2 = 0.0f, float input_scale = 1.0f);
  void SetMetadata(const std::string& key, const std::string& value);

  // The complete file contents.
  std::vector<std::byte> Serialize() const;
  // Writes Serialize() to `path` (through a temporary file renamed into place).
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes a model.safetensors.index.json; total_size goes to metadata when given.
absl::Status WriteSafetensorsIndex(const std::string& path,
                                   const std::map<std::string, std::string>& weight_map,
                                   std::optional<uint64_t> total_size);

}  // namespace glm::engine
