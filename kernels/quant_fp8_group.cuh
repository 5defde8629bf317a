// Device code of quant_fp8_group (see quant_fp8_group.h for the contract).
//
// Algorithm: one warp per (row, 128-column group); each lane loads 4 bf16 (8 bytes), the warp
// reduces amax with shuffles, lane 0 writes the scale, every lane writes its 4 e4m3 bytes.
// Memory-bound (2 bytes in, ~1 byte out per element); no shared memory.
// NOTE: the scale and the quantized values must be bit-identical to QuantizeFp8GroupHost: plain
// IEEE division (nvcc's default -prec-div=true) and the cvt.rn.satfinite e4m3 conversion.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline constexpr int kQuantThreads = 256;

__device__ __forceinline__ float QuantScale(float amax) { return amax / 448.0f; }

__device__ __forceinline__ uint8_t QuantE4m3(float v, float scale) {
  if (!(scale > 0.0f)) return 0;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3));
}

__global__ void __launch_bounds__(kQuantThreads)
    QuantFp8GroupKernel(const __nv_bfloat16* __restrict__ x, int64_t ldx, int64_t m, int64_t k,
                        uint8_t* __restrict__ q, int64_t ldq, float* __restrict__ scales,
                        int64_t scale_ld) {
  PdlEnter();
  const int64_t groups = (k + 127) / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (kQuantThreads / 32) + threadIdx.x / 32;
  if (item >= m * groups) return;
  const int64_t row = item / groups, g = item % groups;
  const int lane = threadIdx.x % 32;
  const int64_t col = g * 128 + lane * 4;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (col < k) {  // k % 4 == 0: the 4 columns exist together
    const uint2 raw = *reinterpret_cast<const uint2*>(x + row * ldx + col);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    v[0] = __low2float(lo);
    v[1] = __high2float(lo);
    v[2] = __low2float(hi);
    v[3] = __high2float(hi);
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float scale = QuantScale(amax);
  if (lane == 0) scales[g * scale_ld + row] = scale;
  if (col < k) {
    const uint32_t packed = static_cast<uint32_t>(QuantE4m3(v[0], scale)) |
                            static_cast<uint32_t>(QuantE4m3(v[1], scale)) << 8 |
                            static_cast<uint32_t>(QuantE4m3(v[2], scale)) << 16 |
                            static_cast<uint32_t>(QuantE4m3(v[3], scale)) << 24;
    *reinterpret_cast<uint32_t*>(q + row * ldq + col) = packed;
  }
}

}  // namespace glm::kernels::detail
