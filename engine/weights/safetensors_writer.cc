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
