#include "engine/model/weight_source.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#ifdef GLM_HAVE_WEIGHTS
#include "engine/weights/dequantize.h"
#include "engine/weights/weight_store.h"
#endif

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

bool QuantizedSliceAligned(const QuantizedInfo& info, const TensorSlice& slice) {
  if (slice.dim != TensorSlice::kCols) return true;
  if (info.shape.size() != 2) return false;
  const int64_t cols = info.shape[1];
  // Codes per storage unit: an int32 word (INT4: 8, INT8: 4) or an NVFP4 byte (2).
  const int64_t unit = info.dtype == WeightDType::kInt4   ? 8
                       : info.dtype == WeightDType::kInt8 ? 4
                                                          : 2;
  auto on = [&](int64_t c, int64_t m) { return m <= 0 || c % m == 0; };
  return on(slice.begin, info.group_size) && on(slice.begin, unit) &&
         (slice.end == cols || (on(slice.end, info.group_size) && on(slice.end, unit)));
}

#ifdef GLM_HAVE_WEIGHTS

std::optional<QuantizedInfo> StoreQuantizedInfo(const WeightStore& store,
                                                const std::string& name) {
  absl::StatusOr<WeightStore::QuantizedParts> p = store.QuantizedPartsOf(name);
  if (!p.ok() || p->shape.size() != 2) return std::nullopt;
  QuantizedInfo info;
  info.shape = p->shape;
  if (p->encoding == WeightStore::Encoding::kNvfp4) {
    if (p->scale.dtype != DType::kF8E4M3) return std::nullopt;
    info.dtype = WeightDType::kNvfp4;
    info.group_size = kNvfp4GroupSize;
    return info;
  }
  // INT scales stay narrow only as bf16 (the kernels' scale type; F16 / F32 would round).
  if (p->scale.dtype != DType::kBF16) return std::nullopt;
  info.dtype = p->layout.num_bits == 4 ? WeightDType::kInt4 : WeightDType::kInt8;
  info.group_size = p->layout.group_size;
  return info;
}

absl::StatusOr<QuantizedTensor> ReadStoreQuantized(const WeightStore& store,
                                                   const std::string& name,
                                                   const TensorSlice& slice) {
  const std::optional<QuantizedInfo> info = StoreQuantizedInfo(store, name);
  if (!info.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " is not an INT4 / INT8 weight with bf16 scales or an NVFP4 weight; "
        "read it widened (ReadFloat)"));
  }
  GLM_ASSIGN_OR_RETURN(const WeightStore::QuantizedParts p, store.QuantizedPartsOf(name));
  GLM_ASSIGN_OR_RETURN(const Region r, RegionOf(name, p.shape, slice));
  if (!QuantizedSliceAligned(*info, slice)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " ", ShapeString(p.shape), " is quantized in groups of ",
        info->group_size > 0 ? info->group_size : p.shape[1], " inputs, and this rank's columns [",
        slice.begin, ", ", slice.end, ") split a group or a packed word. Fix: a tp_size that "
        "divides the input dimension into whole groups, or weight_dtype bf16 / fp32 (dequantized "
        "at load)"));
  }
  const bool nvfp4 = info->dtype == WeightDType::kNvfp4;
  const int64_t cols = p.shape[1];
  const int64_t per_unit = nvfp4 ? 2 : 32 / p.layout.num_bits;  // codes per byte / word
  const int64_t unit_bytes = nvfp4 ? 1 : 4;
  const int64_t stored_row_bytes = p.data.shape[1] * static_cast<int64_t>(DTypeSize(p.data.dtype));
  QuantizedTensor t;
  t.dtype = info->dtype;
  t.full_shape = p.shape;
  t.shape = {r.r1 - r.r0, r.c1 - r.c0};
  const int64_t u0 = r.c0 / per_unit, u1 = (r.c1 + per_unit - 1) / per_unit;
  t.row_bytes = (u1 - u0) * unit_bytes;
  t.data.resize(t.shape[0] * t.row_bytes);
  const auto* src = reinterpret_cast<const uint8_t*>(p.data.data);
  for (int64_t i = 0; i < t.shape[0]; ++i) {
    std::copy_n(src + (r.r0 + i) * stored_row_bytes + u0 * unit_bytes, t.row_bytes,
                t.data.data() + i * t.row_bytes);
  }
  const int64_t group = info->group_size > 0 ? info->group_size : cols;
  const int64_t stored_scale_cols = p.scale.shape.size() == 2 ? p.scale.shape[1] : 1;
  t.scale_bytes = static_cast<int>(DTypeSize(p.scale.dtype));
  const int64_t s0 = info->group_size > 0 ? r.c0 / group : 0;
  const int64_t s1 = info->group_size > 0 ? (r.c1 + group - 1) / group : 1;
  t.scale_cols = s1 - s0;
  t.scales.resize(t.shape[0] * t.scale_cols * t.scale_bytes);
  const auto* scale_src = reinterpret_cast<const uint8_t*>(p.scale.data);
  for (int64_t i = 0; i < t.shape[0]; ++i) {
    std::copy_n(scale_src + ((r.r0 + i) * stored_scale_cols + s0) * t.scale_bytes,
                t.scale_cols * t.scale_bytes, t.scales.data() + i * t.scale_cols * t.scale_bytes);
  }
  // Per channel: one scale per row covers all of the slice's columns.
  t.group_size = info->group_size > 0 ? info->group_size : t.shape[1];
  if (nvfp4) {
    GLM_ASSIGN_OR_RETURN(std::vector<float> g, DecodeToFloat(*p.scale_2));
    if (g.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, ": weight_scale_2 has ", g.size(), " values; expected 1"));
    }
    t.global_scale = g[0];
  }
  return t;
}

#else  // !GLM_HAVE_WEIGHTS

std::optional<QuantizedInfo> StoreQuantizedInfo(const WeightStore&, const std::string&) {
  return std::nullopt;
}

absl::StatusOr<QuantizedTensor> ReadStoreQuantized(const WeightStore&, const std::string& name,
                                                   const TensorSlice&) {
  return absl::UnimplementedError(absl::StrCat(
      "tensor ", name, ": this build has no checkpoint reader (engine/weights)"));
}

#endif  // GLM_HAVE_WEIGHTS

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
