// Sampling on the device: one token id per row of fp32 logits, by the rule in
// kernels/sample_rule.h (the same rule as engine/sample and the CPU backend's Sample op, so
// both backends pick the same token from the same logits, seed and index).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

// All pointers are device memory. Per-row parameters are arrays of `rows`.
struct SampleRowsArgs {
  const float* logits = nullptr;  // [rows, vocab], row stride ld (elements)
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t vocab = 0;
  const float* temperature = nullptr;  // [rows]; <= 1e-5 = greedy
  const int32_t* top_k = nullptr;      // [rows]; 0 = off, 1 = greedy
  const float* top_p = nullptr;        // [rows]; in (0, 1], 1 = off
  const uint64_t* seed = nullptr;      // [rows]; the request's stream
  const int64_t* index = nullptr;      // [rows]; the draw number (tokens generated so far)
  int32_t* out_ids = nullptr;          // [rows]
  // [rows] or null: log softmax(logits)[id] (no T, no top-k/p). fp32 log-sum-exp combined over
  // the row's CTAs: its last bits may change with the CTAs per row (batch size, device); the
  // token never does.
  float* out_logprobs = nullptr;
  // CTAs per row (a thread-block cluster, sm_90+): 0 = sized from the device, the vocab (~8K
  // ids per CTA at least) and the rows (rows x CTAs <= SMs); N > 0 = N, capped by the device
  // (tests force 1, 2, 4...). The token does not depend on it.
  int32_t max_cluster = 0;
};

// The CTAs per row SampleRows uses for `vocab`, `rows` and `max_cluster` on the current device:
// 1 below sm_90; never more than cudaOccupancyMaxPotentialClusterSize allows.
absl::StatusOr<int> SampleClusterSize(int64_t vocab, int64_t rows, int32_t max_cluster);

// Checks shapes (0 < vocab < 2^22, ld >= vocab) and pointers, then launches on `stream`.
absl::Status SampleRows(const SampleRowsArgs& args, cudaStream_t stream);

}  // namespace glm::kernels
