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

// Asynchronous 16-byte copy global -> shared (cp.async.cg: through L2 only, no registers held
// while in flight; sm_80+). Both addresses 16-byte aligned; `dst` a shared-memory address
// (__cvta_generic_to_shared). The copies a thread issued become visible to that thread after
// AsyncCommit() and an AsyncWait<n>() that leaves at most n of its groups pending. The memory
// clobbers keep the compiler from moving shared-memory reads of a ring slot across its refill
// or its wait (a per-lane ring has no barrier that would).
__device__ __forceinline__ void AsyncCopy16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void AsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void AsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Word j (0..3) of a 16-byte load.
__device__ __forceinline__ uint32_t Word4(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

}  // namespace glm::kernels::detail
