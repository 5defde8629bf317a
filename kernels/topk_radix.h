// Top-k indices per row of fp32 scores (radix select; device code in topk_radix.cuh, plan in
// topk_plan.h). Used by the DSA indexer: rows of up to 1,048,576 logits, k up to 2048.
//
// Usage (setup, once per shape class):  plan = PlanTopkForDevice(rows, max_len, k);
// allocate plan.workspace_bytes of device memory; then per step: TopkRadix(plan, ...).
// The output order within a row is unspecified; the set is a valid top-k (every selected score
// >= the k-th largest, exactly min(k, len) indices, the rest -1). NaN ranks below -inf.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_limits.h"
#include "kernels/topk_plan.h"

namespace glm::kernels {

// Plans for the current device: its attributes (QueryDeviceLimits, env caps applied), lowered
// further by `caps` when given (each non-zero field of *caps is an upper bound), and the exact
// kernel's occupancy (cudaOccupancyMaxActiveBlocksPerMultiprocessor at the plan's shared memory).
absl::StatusOr<TopkPlan> PlanTopkForDevice(int64_t rows, int64_t max_len, int k,
                                           const DeviceLimits* caps = nullptr,
                                           TopkPath path = TopkPath::kAuto);

// scores: [plan.rows, row_stride] fp32 on the device, row_stride >= plan.max_len.
// lengths: [plan.rows] int32 valid columns per row (clamped to [0, max_len]), or null.
// out:     [plan.rows, plan.k] int32.
// workspace: plan.workspace_bytes of device memory (zeroed here, on `stream`, every call).
absl::Status TopkRadix(const TopkPlan& plan, const float* scores, int64_t row_stride,
                       const int32_t* lengths, int32_t* out, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream);

}  // namespace glm::kernels
