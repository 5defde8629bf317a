// A random GlmMoeDsa checkpoint generated tensor by tensor on request, for benchmarks at full
// GLM-5 widths (a 256-expert layer is ~39 GB in fp32: InMemoryWeights cannot hold a model).
//
// Contract:
// - The tensor set and shapes are exactly MakeRandomWeights' (random_weights.h) for the same
//   config: every decoder layer, model.norm, lm_head, the embedding and, when
//   config.num_nextn_predict_layers > 0, the MTP layer. The scaling is the same too (Linear
//   weights with standard deviation gain / sqrt(in), norms ~ 1 +- 0.1, embedding ~ 1), so
//   activations stay O(1); the values are uniform (same variance), not normal, and differ from
//   MakeRandomWeights'.
// - Values are a pure function of (seed, tensor name, element index): a counter-based hash, so a
//   tensor is the same whichever thread count or request order produced it.
// - With Options::fp8_linear, the Linear weights the loader may keep narrow (IsLinearWeight:
//   projections incl. kv_b_proj, experts, lm_head, eh_proj; not the router, norms or embedding)
//   are also served as e4m3 + 128 x 128 block scales (IsFp8Block / ReadFp8Block, for
//   ModelLoadOptions::weight_dtype "auto"), with the same standard deviation; ReadFloat still
//   serves them in fp32 (different values).
// - With Options::quantized, the Linear weights a quantized checkpoint of that layout stores
//   narrow are also served as stored (QuantizedInfoOf / ReadQuantized, for weight_dtype "auto";
//   ../shared/specs/quantized-checkpoints.md):
//     kInt4Int8Mix  routed experts INT4 group 128; attention projections (q_a, q_b,
//                   kv_a_proj_with_mqa, kv_b, o), dense MLP and shared experts INT8 group 128;
//                   the indexer, router, lm_head and eh_proj stay plain. (The real checkpoint
//                   also keeps layer 0 plain; here every layer is quantized, so a one-layer model
//                   measures the quantized layout.)
//     kNvfp4        routed experts NVFP4 (e2m1, one e4m3 scale per 16 inputs, fp32 global
//                   scale); everything else plain.
//   Codes are uniform random bits; the scales (one value per tensor) give the fp32 tensor's
//   standard deviation. ReadFloat still serves the fp32 values (different values).
// - Host memory: the tensor returned plus at most one prefetched tensor (the one that follows the
//   last request in the loader's order, generated in the background while the caller uploads).
// - Not thread-safe: one ReadFloat at a time (the model loader's thread); bytes_served() may be
//   read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config/model_config.h"
#include "engine/model/random_weights.h"
#include "engine/model/weight_source.h"

namespace glm::engine {

class LazyRandomWeights : public WeightSource {
 public:
  struct Options {
    uint64_t seed = 1;
    int num_threads = 0;    // generator threads; 0 = hardware concurrency
    bool prefetch = true;   // generate the next tensor (load order) in the background
    bool fp8_linear = false;  // serve Linear weights as e4m3 block-scaled tensors too
    enum class Quantized { kNone, kInt4Int8Mix, kNvfp4 };
    Quantized quantized = Quantized::kNone;  // serve a quantized checkpoint's weights too
  };
  // One tensor (random_weights.h): values = mean + sqrt(3) * stddev * u, u uniform in [-1, 1).
  using Spec = RandomTensorSpec;

  LazyRandomWeights(const ModelConfig& config, Options options);
  ~LazyRandomWeights() override;

  bool Has(const std::string& name) const override { return index_.count(name) > 0; }
  absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                               std::vector<int64_t>* shape) override;
  bool IsFp8Block(const std::string& name) const override;
  absl::StatusOr<Fp8BlockTensor> ReadFp8Block(const std::string& name) override;
  std::optional<QuantizedInfo> QuantizedInfoOf(const std::string& name) const override;
  absl::StatusOr<QuantizedTensor> ReadQuantized(const std::string& name,
                                                const TensorSlice& slice) override;

  // Whether GlmMoeDsa's loader stores `name` through WeightLoader::Linear (narrow dtypes apply).
  static bool IsLinearWeight(const std::string& name);

  // Every tensor, in the order GlmMoeDsa's loader requests them.
  const std::vector<Spec>& specs() const { return specs_; }
  // Bytes (fp32) of all tensors, and of the tensors whose name starts with `prefix`.
  int64_t TotalBytes(const std::string& prefix = "") const;
  // Progress: fp32 bytes handed out, and wall seconds ReadFloat spent generating or waiting for
  // the prefetch (the rest of a load is the caller's upload).
  int64_t bytes_served() const { return bytes_served_.load(); }
  double seconds_generating() const { return seconds_generating_; }

  // Fills out[i] = mean + bound * u(seed, i) with `num_threads` threads (0 = hardware
  // concurrency). Exposed for tests.
  static void Fill(uint64_t seed, float mean, float bound, int num_threads, std::vector<float>* out);

 private:
  std::vector<float> Generate(size_t spec_index) const;

  std::vector<Spec> specs_;
  std::map<std::string, size_t> index_;
  Options options_;
  std::future<std::vector<float>> pending_;
  size_t pending_index_ = 0;
  std::atomic<int64_t> bytes_served_{0};  // read by progress threads
  double seconds_generating_ = 0.0;
};

}  // namespace glm::engine
