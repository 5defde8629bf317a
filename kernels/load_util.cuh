// Device-side global loads shared by the weight-streaming kernels (GEMV, fp8 GEMM, MoE decode).
#pragma once

#include <cstdint>

namespace glm::kernels::detail {

// 16 bytes from global memory that is read once: read-only path, not kept in L1. `p` must be
// 16-byte aligned.
__device__ __forceinline__ uint4 LoadStreaming16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Word j (0..3) of a 16-byte load.
__device__ __forceinline__ uint32_t Word4(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

}  // namespace glm::kernels::detail
