// The pair-indexed combine of the streaming MoE paths (decode, token-group, tensor-core: act / y
// indexed by (token, slot) pair): out[t] += sum_j w[t, j] * y[t * top_k + j] over the valid ids,
// j in order (deterministic). Launched by kernels/moe.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/launch.cuh"
#include "kernels/moe_common.h"

namespace glm::kernels::moe {

// grid (tokens, ceil(hidden / kCombineThreads)).
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineByPairKernel(const float* y, const int32_t* ids, const float* weights, int top_k,
                           int num_experts, int hidden, float* out, int64_t out_ld) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int col = blockIdx.y * kCombineThreads + threadIdx.x;
  if (col >= hidden) return;
  float* o = out + t * out_ld + col;
  float acc = *o;
  for (int j = 0; j < top_k; ++j) {
    const int64_t i = t * top_k + j;
    const int e = ids[i];
    if (e >= 0 && e < num_experts) acc += weights[i] * y[i * hidden + col];
  }
  *o = acc;
}

}  // namespace glm::kernels::moe
