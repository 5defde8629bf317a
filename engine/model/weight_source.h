// Where the model gets its parameters from: a safetensors checkpoint (engine/weights) or, in
// tests and benchmarks, an in-memory map of random tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::engine {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool Has(const std::string& name) const = 0;
  // The tensor converted to fp32 (dequantized when block-scaled), row-major, with its shape.
  // NotFound names the tensor when it is absent.
  virtual absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                                       std::vector<int64_t>* shape) = 0;
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
