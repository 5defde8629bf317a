// SiLU·mul (SwiGLU's gate): out = silu(gate) * up elementwise, silu(g) = g / (1 + exp(-g)).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_util.h"

namespace glm::kernels {

// gate, up, out: [rows, cols] with their own row strides, `dtype` on the device. out may alias
// gate or up (same stride). rows == 0 is a no-op.
absl::Status SiluMul(DType dtype, const void* gate, int64_t gate_ld, const void* up,
                     int64_t up_ld, void* out, int64_t out_ld, int64_t rows, int64_t cols,
                     cudaStream_t stream);

}  // namespace glm::kernels
