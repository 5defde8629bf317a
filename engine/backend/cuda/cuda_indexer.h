// Backend::IndexerTopK on the CUDA backend: the engine's views (IndexerTopKArgs, backend.h) as
// the arguments of kernels/dsa_indexer.h, whose launcher checks the limits and runs the kernels.
// Workspace from the backend's Scratch: slot 0 the scores [rows, DsaIndexerLaunch::scores_ld]
// fp32, slot 1 the select histograms. Same contract as cuda_ops.h (device pointers, work on
// `stream`, nothing allocated once scratch has grown to the step's size: graph-capturable).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "kernels/dsa_indexer.h"
#include "kernels/kernel_policy.h"

namespace glm::engine::cuda {

// policy: the backend's (its indexer section and smem_cap_bytes apply). launched (optional): what
// ran, for tests.
absl::Status IndexerTopK(const IndexerTopKArgs& args, const kernels::KernelPolicy& policy,
                         Scratch& scratch, cudaStream_t stream,
                         kernels::DsaIndexerLaunch* launched = nullptr);

}  // namespace glm::engine::cuda
