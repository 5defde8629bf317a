#include "engine/model/weight_source.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::engine {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// The slice's rows [r0, r1) and columns [c0, c1) of a 2-D tensor of `shape`.
struct Region {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};

absl::StatusOr<Region> RegionOf(const std::string& name, const std::vector<int64_t>& shape,
                                const TensorSlice& slice) {
  if (shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " has shape ", ShapeString(shape), "; a slice needs a 2-D tensor"));
  }
  Region r{0, shape[0], 0, shape[1]};
  if (slice.dim == TensorSlice::kWhole) return r;
  const int64_t size = slice.dim == TensorSlice::kRows ? shape[0] : shape[1];
  if (slice.begin < 0 || slice.end > size || slice.begin > slice.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " of shape ", ShapeString(shape), ": ",
        slice.dim == TensorSlice::kRows ? "rows" : "columns", " [", slice.begin, ", ", slice.end,
        ") are outside it. Check that config.json belongs to this checkpoint"));
  }
  if (slice.dim == TensorSlice::kRows) {
    r.r0 = slice.begin, r.r1 = slice.end;
  } else {
    r.c0 = slice.begin, r.c1 = slice.end;
  }
  return r;
}

}  // namespace

bool Fp8SliceAligned(const std::vector<int64_t>& shape, const TensorSlice& slice) {
  if (slice.dim == TensorSlice::kWhole) return true;
  if (shape.size() != 2) return false;
  const int64_t size = slice.dim == TensorSlice::kRows ? shape[0] : shape[1];
  return slice.begin % 128 == 0 && (slice.end % 128 == 0 || slice.end == size);
}

absl::StatusOr<Fp8BlockTensor> SliceFp8Block(const std::string& name, const uint8_t* data,
                                             const std::vector<int64_t>& shape,
                                             const std::vector<float>& scales,
                                             const TensorSlice& slice) {
  GLM_ASSIGN_OR_RETURN(const Region r, RegionOf(name, shape, slice));
  const int64_t cols = shape[1];
  const int64_t scols = (cols + 127) / 128;
  if (!Fp8SliceAligned(shape, slice)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " is fp8 with 128 x 128 block scales, and this rank's ",
        slice.dim == TensorSlice::kRows ? "rows" : "columns", " [", slice.begin, ", ", slice.end,
        ") of ", ShapeString(shape), " do not fall on 128 boundaries. Fix: a tp_size that "
        "divides the dimension into multiples of 128, or weight_dtype bf16 / fp32 (dequantized "
        "at load)"));
  }
  if (static_cast<int64_t>(scales.size()) != ((shape[0] + 127) / 128) * scols) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " of shape ",
                                                   ShapeString(shape), " has ", scales.size(),
                                                   " block scales; expected ",
                                                   ((shape[0] + 127) / 128) * scols));
  }
  Fp8BlockTensor t;
  t.full_shape = shape;
  const int64_t rows = r.r1 - r.r0, n = r.c1 - r.c0;
  t.shape = {rows, n};
  t.data.resize(rows * n);
  for (int64_t i = 0; i < rows; ++i) {
    std::copy_n(data + (r.r0 + i) * cols + r.c0, n, t.data.data() + i * n);
  }
  const int64_t sb0 = r.r0 / 128, sb1 = (r.r1 + 127) / 128;  // scale rows and columns kept
  const int64_t sc0 = r.c0 / 128, sc1 = (r.c1 + 127) / 128;
  t.scales.reserve((sb1 - sb0) * (sc1 - sc0));
  for (int64_t i = sb0; i < sb1; ++i) {
    for (int64_t j = sc0; j < sc1; ++j) t.scales.push_back(scales[i * scols + j]);
  }
  return t;
}

absl::StatusOr<std::vector<float>> WeightSource::ReadFloatSlice(const std::string& name,
                                                                const TensorSlice& slice,
                                                                std::vector<int64_t>* shape) {
  std::vector<int64_t> full;
  GLM_ASSIGN_OR_RETURN(std::vector<float> data, ReadFloat(name, &full));
  if (shape != nullptr) *shape = full;
  if (slice.dim == TensorSlice::kWhole) return data;
  GLM_ASSIGN_OR_RETURN(const Region r, RegionOf(name, full, slice));
  const int64_t cols = full[1], n = r.c1 - r.c0;
  std::vector<float> out((r.r1 - r.r0) * n);
  for (int64_t i = r.r0; i < r.r1; ++i) {
    std::copy_n(data.data() + i * cols + r.c0, n, out.data() + (i - r.r0) * n);
  }
  return out;
}

absl::StatusOr<Fp8BlockTensor> WeightSource::ReadFp8BlockSlice(const std::string& name,
                                                               const TensorSlice& slice) {
  GLM_ASSIGN_OR_RETURN(Fp8BlockTensor whole, ReadFp8Block(name));
  if (slice.dim == TensorSlice::kWhole) {
    whole.full_shape = whole.shape;
    return whole;
  }
  return SliceFp8Block(name, whole.data.data(), whole.shape, whole.scales, slice);
}

absl::StatusOr<std::vector<float>> InMemoryWeights::ReadFloat(const std::string& name,
                                                              std::vector<int64_t>* shape) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", name, " is not in the weight set"));
  }
  if (shape != nullptr) *shape = it->second.shape;
  return it->second.data;
}

}  // namespace glm::engine
