#include "engine/weights/safetensors_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/weights/float_codec.h"
#include "engine/weights/tensor_view.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

using nlohmann::json;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::StatusOr<int64_t> CountElements(const std::string& name,
                                      const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(count, dim, &count)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': bad shape ",
                                                     ShapeToString(shape)));
    }
  }
  return count;
}

absl::Status WriteBytes(const std::string& path, std::span<const std::byte> bytes) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(temp, ": cannot create"));
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) return absl::DataLossError(absl::StrCat(temp, ": write failed (disk full?)"));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat(path, ": rename from ", temp, " failed: ",
                                            std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SafetensorsWriter::Add(const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape,
                                    std::span<const std::byte> bytes) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("tensor name '", name, "' is reserved"));
  }
  if (tensors_.count(name) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' added twice"));
  }
  GLM_ASSIGN_OR_RETURN(int64_t count, CountElements(name, shape));
  if (static_cast<uint64_t>(count) * DTypeSize(dtype) != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': ", bytes.size(), " bytes given but ", ToAbsl(DTypeName(dtype)),
        " ", ShapeToString(shape), " needs ", static_cast<uint64_t>(count) * DTypeSize(dtype)));
  }
  tensors_.emplace(name, Tensor{dtype, shape, std::vector<std::byte>(bytes.begin(), bytes.end())});
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddFloat(const std::string& name, DType dtype,
                                         const std::vector<int64_t>& shape,
                                         std::span<const float> values) {
  GLM_ASSIGN_OR_RETURN(int64_t count, CountElements(name, shape));
  if (static_cast<uint64_t>(count) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", values.size(),
                                                   " values given for shape ",
                                                   ShapeToString(shape)));
  }
  std::vector<std::byte> bytes(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&bytes[4 * i], &values[i], 4);
        break;
      case DType::kBF16: {
        const uint16_t bits = FloatToBf16(values[i]);
        std::memcpy(&bytes[2 * i], &bits, 2);
        break;
      }
      case DType::kF16: {
        const uint16_t bits = FloatToF16(values[i]);
        std::memcpy(&bytes[2 * i], &bits, 2);
        break;
      }
      case DType::kF8E4M3:
        bytes[i] = static_cast<std::byte>(FloatToFp8E4M3(values[i]));
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", name, "': AddFloat cannot write ", ToAbsl(DTypeName(dtype)),
            "; use Add with raw bytes"));
    }
  }
  return Add(name, dtype, shape, bytes);
}

absl::Status SafetensorsWriter::AddFp8BlockQuantized(const std::string& name,
                                                     const std::vector<int64_t>& shape,
                                                     std::span<const float> values,
                                                     BlockSize block) {
  if (shape.size() != 2 || name.size() < 7 || name.substr(name.size() - 7) != ".weight" ||
      block.rows <= 0 || block.cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': FP8 block quantization needs a 2-D \"*.weight\" and a positive "
        "block size, got shape ", ShapeToString(shape)));
  }
  GLM_ASSIGN_OR_RETURN(int64_t count, CountElements(name, shape));
  if (static_cast<uint64_t>(count) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", values.size(),
                                                   " values given for shape ",
                                                   ShapeToString(shape)));
  }
  const int64_t rows = shape[0];
  const int64_t cols = shape[1];
  const int64_t block_rows = CeilDiv(rows, block.rows);
  const int64_t block_cols = CeilDiv(cols, block.cols);
  std::vector<float> scales(static_cast<size_t>(block_rows * block_cols));
  std::vector<std::byte> codes(values.size());
  for (int64_t br = 0; br < block_rows; ++br) {
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const int64_t r0 = br * block.rows, r1 = std::min(rows, r0 + block.rows);
      const int64_t c0 = bc * block.cols, c1 = std::min(cols, c0 + block.cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(values[r * cols + c]));
      }
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      scales[br * block_cols + bc] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          codes[r * cols + c] = static_cast<std::byte>(FloatToFp8E4M3(values[r * cols + c] / scale));
        }
      }
    }
  }
  GLM_RETURN_IF_ERROR(Add(name, DType::kF8E4M3, shape, codes));
  return AddFloat(name + "_scale_inv", DType::kF32, {block_rows, block_cols}, scales);
}

absl::Status SafetensorsWriter::AddPackQuantized(const std::string& module,
                                                 const std::vector<int64_t>& shape,
                                                 std::span<const float> values, int num_bits,
                                                 int64_t group_size,
                                                 std::vector<float>* dequantized) {
  if (shape.size() != 2 || (num_bits != 4 && num_bits != 8) || group_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module '", module, "': pack quantization needs a 2-D shape, num_bits 4 or 8 and "
        "group_size >= 0, got shape ", ShapeToString(shape), ", num_bits ", num_bits,
        ", group_size ", group_size));
  }
  GLM_ASSIGN_OR_RETURN(int64_t count, CountElements(module, shape));
  if (static_cast<uint64_t>(count) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("module '", module, "': ", values.size(),
                                                   " values given for shape ",
                                                   ShapeToString(shape)));
  }
  const int64_t rows = shape[0];
  const int64_t cols = shape[1];
  const int64_t group = group_size > 0 ? group_size : cols;
  const int64_t groups = CeilDiv(cols, group);
  const int64_t per_word = 32 / num_bits;
  const int64_t words = CeilDiv(cols, per_word);
  const float qmax = static_cast<float>((1 << (num_bits - 1)) - 1);  // 7 or 127
  const float qmin = -qmax - 1.0f;
  const float half_range = (qmax - qmin) / 2.0f;                     // 7.5 or 127.5
  std::vector<float> scales(static_cast<size_t>(rows * groups));
  std::vector<uint32_t> packed(static_cast<size_t>(rows * words), 0);
  if (dequantized != nullptr) dequantized->assign(values.size(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group, c1 = std::min(cols, c0 + group);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(values[r * cols + c]));
      const float scale = Bf16ToFloat(FloatToBf16(amax > 0.0f ? amax / half_range : 1.0f));
      scales[r * groups + g] = scale;
      for (int64_t c = c0; c < c1; ++c) {
        const float q = std::clamp(std::nearbyint(values[r * cols + c] / scale), qmin, qmax);
        const uint32_t u = static_cast<uint32_t>(static_cast<int32_t>(q) + (1 << (num_bits - 1)));
        packed[r * words + c / per_word] |= u << (num_bits * (c % per_word));
        if (dequantized != nullptr) (*dequantized)[r * cols + c] = q * scale;
      }
    }
  }
  std::vector<std::byte> packed_bytes(packed.size() * 4);
  if (!packed.empty()) std::memcpy(packed_bytes.data(), packed.data(), packed_bytes.size());
  GLM_RETURN_IF_ERROR(Add(module + ".weight_packed", DType::kI32, {rows, words}, packed_bytes));
  GLM_RETURN_IF_ERROR(AddFloat(module + ".weight_scale", DType::kBF16, {rows, groups}, scales));
  const int64_t dims[2] = {rows, cols};
  return Add(module + ".weight_shape", DType::kI64, {2},
             std::as_bytes(std::span<const int64_t>(dims, 2)));
}

namespace {

// e2m1 magnitudes by code 0..7.
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Nearest e2m1 code of x (ties to the even code, saturating at 6), sign in bit 3.
uint8_t NearestE2m1(float x) {
  const float m = std::min(std::fabs(x), 6.0f);
  uint8_t best = 0;
  for (uint8_t code = 1; code < 8; ++code) {
    const float d = std::fabs(kE2m1[code] - m);
    const float best_d = std::fabs(kE2m1[best] - m);
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  return static_cast<uint8_t>(best | (x < 0.0f ? 8 : 0));
}

}  // namespace

absl::Status SafetensorsWriter::AddNvfp4Quantized(const std::string& module,
                                                  const std::vector<int64_t>& shape,
                                                  std::span<const float> values,
                                                  std::vector<float>* dequantized,
                                                  float weight_scale_2, float input_scale) {
  if (shape.size() != 2 || shape[1] % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module '", module, "': NVFP4 quantization needs a 2-D shape with an even number of "
        "columns, got ", ShapeToString(shape)));
  }
  GLM_ASSIGN_OR_RETURN(int64_t count, CountElements(module, shape));
  if (static_cast<uint64_t>(count) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("module '", module, "': ", values.size(),
                                                   " values given for shape ",
                                                   ShapeToString(shape)));
  }
  constexpr int64_t kBlock = 16;
  const int64_t rows = shape[0];
  const int64_t cols = shape[1];
  const int64_t blocks = CeilDiv(cols, kBlock);
  if (weight_scale_2 <= 0.0f) {
    float amax = 0.0f;
    for (float v : values) amax = std::max(amax, std::fabs(v));
    weight_scale_2 = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
  }
  std::vector<std::byte> codes(static_cast<size_t>(rows * cols / 2), std::byte{0});
  std::vector<std::byte> block_scales(static_cast<size_t>(rows * blocks));
  if (dequantized != nullptr) dequantized->assign(values.size(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kBlock, c1 = std::min(cols, c0 + kBlock);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(values[r * cols + c]));
      uint8_t scale_code = FloatToFp8E4M3(amax > 0.0f ? amax / (6.0f * weight_scale_2) : 1.0f);
      if (Fp8E4M3ToFloat(scale_code) < 0x1p-9f) scale_code = FloatToFp8E4M3(0x1p-9f);
      block_scales[r * blocks + b] = static_cast<std::byte>(scale_code);
      const float block_scale = Fp8E4M3ToFloat(scale_code);
      for (int64_t c = c0; c < c1; ++c) {
        const uint8_t code = NearestE2m1(values[r * cols + c] / (block_scale * weight_scale_2));
        const size_t at = static_cast<size_t>((r * cols + c) / 2);
        codes[at] |= static_cast<std::byte>(c % 2 == 0 ? code : code << 4);
        if (dequantized != nullptr) {
          const float magnitude = kE2m1[code & 7] * block_scale;
          (*dequantized)[r * cols + c] = ((code & 8) != 0 ? -magnitude : magnitude) * weight_scale_2;
        }
      }
    }
  }
  GLM_RETURN_IF_ERROR(Add(module + ".weight", DType::kU8, {rows, cols / 2}, codes));
  GLM_RETURN_IF_ERROR(Add(module + ".weight_scale", DType::kF8E4M3, {rows, blocks}, block_scales));
  const float scalars[2] = {weight_scale_2, input_scale};
  GLM_RETURN_IF_ERROR(AddFloat(module + ".weight_scale_2", DType::kF32, {}, {scalars, 1}));
  return AddFloat(module + ".input_scale", DType::kF32, {}, {scalars + 1, 1});
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::vector<std::byte> SafetensorsWriter::Serialize() const {
  json header = json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors_) {
    header[name] = {{"dtype", std::string(DTypeName(tensor.dtype))},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size() + offset);
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((length >> (8 * i)) & 0xFF);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::byte* data = out.data() + 8 + text.size();
  for (const auto& [name, tensor] : tensors_) {
    if (!tensor.bytes.empty()) std::memcpy(data, tensor.bytes.data(), tensor.bytes.size());
    data += tensor.bytes.size();
  }
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  return WriteBytes(path, Serialize());
}

absl::Status WriteSafetensorsIndex(const std::string& path,
                                   const std::map<std::string, std::string>& weight_map,
                                   std::optional<uint64_t> total_size) {
  json index = {{"metadata", json::object()}, {"weight_map", weight_map}};
  if (total_size) index["metadata"]["total_size"] = *total_size;
  const std::string text = index.dump(2) + "\n";
  return WriteBytes(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

}  // namespace glm::engine
