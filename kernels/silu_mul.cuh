// silu_mul: grid-stride over rows * cols elements, fp32 math. Memory-bound: 3 accesses per
// element. Limits: rows * cols < 2^62.
#pragma once

#include <cstdint>

#include "kernels/dtype_util.cuh"
#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline constexpr int kSiluMulThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kSiluMulThreads) SiluMulKernel(const T* gate, int64_t gate_ld,
                                                                 const T* up, int64_t up_ld,
                                                                 T* out, int64_t out_ld,
                                                                 int64_t rows, int64_t cols) {
  PdlEnter();
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e - r * cols;
    const float g = ToFloat(gate[r * gate_ld + c]);
    const float u = ToFloat(up[r * up_ld + c]);
    out[r * out_ld + c] = FromFloat<T>(g / (1.0f + expf(-g)) * u);
  }
}

}  // namespace glm::kernels::detail
