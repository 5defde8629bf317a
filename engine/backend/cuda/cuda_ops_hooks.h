// Test hooks of cuda_ops_attention.cu for the CUDA op tests and benches (not part of cuda_ops.h:
// production code does not call them). The definitions document each mode in full.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"  // cuda_ops.h uses it without including it
#include "engine/backend/cuda/cuda_ops.h"

namespace glm::engine::cuda {

// The kernel the last Attention call ran (kByShape: none yet). The kernel is chosen by
// KernelPolicy::attention (Backend::SetKernelPolicy, or cuda::Attention's policy argument).
kernels::MlaAttentionPath LastAttentionPathForTest();

}  // namespace glm::engine::cuda
