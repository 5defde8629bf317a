// Where the model gets its parameters from: a safetensors checkpoint (engine/weights) or, in
// tests and benchmarks, an in-memory map of random tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::engine {

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
