// fp32 GEMMs of the CUDA backend through cuBLASLt (Linear, LinearPerHead).
//
// In the backend's row-major terms, per batch item b < batch:
//   y_b[m, n] = x_b[m, k] . w_b[n, k]^T  (+ y_b when accumulate)
// with x_b = x + b * x_batch_stride (row stride x_ld), likewise w_b and y_b. cuBLASLt sees the
// column-major transpose: D[n, m] = op_T(W)[n, k] . X^T[k, m], W stored [k, n] with ld w_ld.
// Precision: CUBLAS_COMPUTE_32F, fp32 in and out (no TF32: fp32 is the reference precision).
//
// Plans (matmul descriptor, layouts, chosen algorithm) are cached per shape and per pointer
// alignment, so after the first call of a shape a Run does no host allocation and no heuristic
// query (graph-capturable). The cache holds at most max_plans (least recently used evicted):
// prefill chunk lengths make new shapes without end, decode reuses a few. An evicted plan is
// safe to drop even when a captured graph used it (cublasLtMatmul copies its arguments into the
// launch). Not thread-safe (the backend's step thread only).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glm::engine::cuda {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  int64_t x_ld = 0, w_ld = 0, y_ld = 0;
  int64_t batch = 1;
  int64_t x_batch_stride = 0, w_batch_stride = 0, y_batch_stride = 0;  // elements; 0 broadcasts
};

class LtMatmul {
 public:
  static constexpr size_t kDefaultMaxPlans = 1024;
  // A cuBLASLt handle and a device workspace of workspace_bytes on the current device; at most
  // max_plans (>= 1) cached plans.
  static absl::StatusOr<std::unique_ptr<LtMatmul>> Create(size_t workspace_bytes,
                                                          size_t max_plans = kDefaultMaxPlans);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Enqueues the GEMM on `stream`. m, n or k == 0 is the caller's business (not accepted here).
  absl::Status Run(const GemmShape& shape, const float* x, const float* w, float* y,
                   bool accumulate, cudaStream_t stream);
  size_t num_plans() const { return plans_.size(); }
  // Plans made (heuristic queries) since creation; more than num_plans() once plans were evicted.
  size_t plans_made() const { return plans_made_; }

 private:
  struct Key {
    GemmShape s;
    uint32_t align_x = 0, align_w = 0, align_y = 0;
    bool operator==(const Key& o) const;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  LtMatmul() = default;
  absl::StatusOr<const Plan*> GetPlan(const Key& key);
  static void Destroy(Plan& plan);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  size_t max_plans_ = kDefaultMaxPlans;
  size_t plans_made_ = 0;
  std::list<Key> lru_;  // most recently used first
  struct Entry {
    Plan plan;
    std::list<Key>::iterator pos;  // in lru_
  };
  std::unordered_map<Key, Entry, KeyHash> plans_;
};

}  // namespace glm::engine::cuda
