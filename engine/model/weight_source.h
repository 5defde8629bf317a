// Where the model gets its parameters from: a safetensors checkpoint (engine/weights) or, in
// tests and benchmarks, an in-memory map of random tensors.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace glm::engine {

class WeightStore;  // engine/weights/weight_store.h

// A 2-D e4m3 weight as stored in an fp8 checkpoint, with its 128 x 128 block scales.
struct Fp8BlockTensor {
  std::vector<int64_t> shape;        // [rows, cols]
  std::vector<uint8_t> data;         // e4m3 bytes, row-major [rows, cols]
  std::vector<float> scales;         // [ceil(rows / 128), ceil(cols / 128)] (weight_scale_inv)
  std::vector<int64_t> full_shape;   // the whole tensor's [rows, cols] (== shape unless sliced)
};

// A block of a 2-D tensor along one dimension (a tensor-parallel rank's share of a weight):
// rows [begin, end) for kRows, columns [begin, end) for kCols, everything for kWhole.
struct TensorSlice {
  enum Dim { kWhole, kRows, kCols };
  Dim dim = kWhole;
  int64_t begin = 0, end = 0;
};

// The slice of a whole fp8 tensor `t` (t.shape is the whole [rows, cols]). The sliced dimension's
// begin must be a multiple of 128 and end a multiple of 128 or the dimension's size, so that the
// slice is made of whole scale blocks; InvalidArgument naming `name` otherwise.
absl::StatusOr<Fp8BlockTensor> SliceFp8Block(const std::string& name, const uint8_t* data,
                                             const std::vector<int64_t>& shape,
                                             const std::vector<float>& scales,
                                             const TensorSlice& slice);
// Whether `slice` of an fp8 tensor of `shape` falls on 128 x 128 scale-block boundaries.
bool Fp8SliceAligned(const std::vector<int64_t>& shape, const TensorSlice& slice);

// How a 4/8-bit Linear weight is stored in its checkpoint (../shared/specs/
// quantized-checkpoints.md), without reading it.
struct QuantizedInfo {
  WeightDType dtype = WeightDType::kInt4;  // kInt4, kInt8 or kNvfp4
  int64_t group_size = 0;                  // inputs per scale; 0 = one scale per output channel
  std::vector<int64_t> shape;              // logical [rows, cols]
};

// A 4/8-bit Linear weight (or a slice of it) as stored: packed rows and scales, byte for byte.
//   kInt4 / kInt8: data = weight_packed rows, int32 words (little-endian), row_bytes =
//                  4 * ceil(cols * bits / 32); scales = weight_scale as bf16 (2 bytes each)
//   kNvfp4:        data = e2m1 byte pairs, row_bytes = ceil(cols / 2); scales = e4m3 bytes;
//                  global_scale = weight_scale_2
// W[r][k] = q[r][k] * scale[r][k / group_size] (* global_scale), group_size = cols for a
// per-channel weight (one scale per row).
struct QuantizedTensor {
  WeightDType dtype = WeightDType::kInt4;
  std::vector<int64_t> shape;       // [rows, cols] of the slice
  std::vector<int64_t> full_shape;  // the whole tensor's [rows, cols]
  std::vector<uint8_t> data;        // [rows, row_bytes]
  int64_t row_bytes = 0;
  std::vector<uint8_t> scales;      // [rows, scale_cols] entries of scale_bytes each
  int64_t scale_cols = 0;
  int scale_bytes = 2;              // 2 (bf16) or 1 (e4m3)
  int64_t group_size = 0;           // > 0 (cols for per-channel)
  float global_scale = 1.0f;
};

// Whether `slice` of a quantized weight stored as `info` keeps whole groups and whole storage
// units: row slices always; a column slice must begin on a group boundary and end on one or at
// the last column, and (INT4 / INT8) on an int32 word boundary (8 / 4 codes), so that the slice's
// packed rows and scales are a contiguous part of each stored row.
bool QuantizedSliceAligned(const QuantizedInfo& info, const TensorSlice& slice);

// The stored form of `name` in `store` when it is a pack-quantized INT4 / INT8 weight with bf16
// scales or an NVFP4 weight; nullopt for anything else (plain, fp8, INT with F16 / F32 scales:
// those are read widened). Needs the engine built with engine/weights (GLM_HAVE_WEIGHTS).
std::optional<QuantizedInfo> StoreQuantizedInfo(const WeightStore& store, const std::string& name);
// The weight `name` of `store` (or its slice, QuantizedSliceAligned) as stored: only the slice's
// bytes are copied out of the mapped file. InvalidArgument naming the tensor for a weight that is
// not one StoreQuantizedInfo describes, or a slice that splits a group or a word.
absl::StatusOr<QuantizedTensor> ReadStoreQuantized(const WeightStore& store,
                                                   const std::string& name,
                                                   const TensorSlice& slice);

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool Has(const std::string& name) const = 0;
  // The tensor converted to fp32 (dequantized when block-scaled), row-major, with its shape.
  // NotFound names the tensor when it is absent.
  virtual absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                                       std::vector<int64_t>* shape) = 0;
  // The slice of a 2-D tensor as fp32 (dequantized when block-scaled), row-major
  // [slice rows, slice cols]; *shape receives the whole tensor's shape. InvalidArgument when the
  // tensor is not 2-D or the slice is outside it. Sources over checkpoint files read only the
  // slice; the default reads the whole tensor and cuts (in-memory sources).
  virtual absl::StatusOr<std::vector<float>> ReadFloatSlice(const std::string& name,
                                                            const TensorSlice& slice,
                                                            std::vector<int64_t>* shape);
  // True when `name` is a 2-D e4m3 tensor with a 128 x 128 block scale (ReadFp8Block works).
  virtual bool IsFp8Block(const std::string& name) const {
    (void)name;
    return false;
  }
  // The raw e4m3 bytes and scales of such a tensor (weights kept in fp8 on the device).
  virtual absl::StatusOr<Fp8BlockTensor> ReadFp8Block(const std::string& name) {
    return absl::UnimplementedError("tensor " + name + ": this weight source has no fp8 tensors");
  }
  // A slice of such a tensor on scale-block boundaries (SliceFp8Block's rule), its scales cut to
  // the slice's blocks. The default reads the whole tensor and cuts.
  virtual absl::StatusOr<Fp8BlockTensor> ReadFp8BlockSlice(const std::string& name,
                                                           const TensorSlice& slice);
  // How `name` is stored when it is an INT4 / INT8 / NVFP4 weight ReadQuantized can read raw;
  // nullopt otherwise (in-memory sources: always).
  virtual std::optional<QuantizedInfo> QuantizedInfoOf(const std::string& name) const {
    (void)name;
    return std::nullopt;
  }
  // Such a weight (or its TP slice, on group and word boundaries: QuantizedSliceAligned) as
  // stored, for backends that keep it narrow. Unimplemented on sources without such tensors.
  virtual absl::StatusOr<QuantizedTensor> ReadQuantized(const std::string& name,
                                                        const TensorSlice& slice) {
    (void)slice;
    return absl::UnimplementedError("tensor " + name +
                                    ": this weight source has no INT4 / INT8 / NVFP4 tensors");
  }
};

// A WeightSource over tensors held in memory (tests, synthetic benchmark models).
class InMemoryWeights : public WeightSource {
 public:
  struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  void Put(const std::string& name, std::vector<int64_t> shape, std::vector<float> data) {
    tensors_[name] = Tensor{std::move(shape), std::move(data)};
  }
  bool Has(const std::string& name) const override { return tensors_.count(name) > 0; }
  absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                               std::vector<int64_t>* shape) override;
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }

 private:
  std::map<std::string, Tensor> tensors_;
};

}  // namespace glm::engine
