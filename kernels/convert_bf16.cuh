// convert_bf16 device code (convert_bf16.h): a grid-stride loop over the [rows, cols] elements,
// one bf16 (round to nearest even) per element.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/launch.cuh"

namespace glm::kernels::detail {

__global__ void ConvertRowsToBf16Kernel(const float* __restrict__ src, int64_t src_ld,
                                        int64_t rows, int64_t cols,
                                        __nv_bfloat16* __restrict__ dst, int64_t dst_ld) {
  PdlEnter();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * dst_ld + c] = __float2bfloat16_rn(src[r * src_ld + c]);
  }
}

}  // namespace glm::kernels::detail
