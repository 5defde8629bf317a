// fp8 KV cache device code (kv_fp8.h has the contract; layouts and the quantization rule in
// kv_fp8_layout.h). The quantized bytes are bit-identical to the host rule: the same amax fold
// (finite values only), the same power-of-two scale (frexpf / ldexpf, exact), IEEE division by the
// scale (exact) and cvt.rn.satfinite e4m3 (NaN -> 0x7F, +-inf -> +-448), k_pe rounded to bf16
// (RNE). Memory-bound and tiny at decode (one row per token): one warp per 128-dim group / key row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/kv_fp8_layout.h"
#include "kernels/launch.cuh"

namespace glm::kernels::kv_fp8 {

inline constexpr int kKvFp8Threads = 128;

__device__ __forceinline__ uint32_t Quant4(const float (&v)[4], float scale) {
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t b = __nv_cvt_float_to_fp8(v[j] / scale, __NV_SATFINITE, __NV_E4M3);
    packed |= b << (8 * j);
  }
  return packed;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// grid: rows; block kKvFp8Threads. Warp w quantizes 128-dim groups w, w + 4, ...; lane l dims
// 4l..4l+3.
__global__ void __launch_bounds__(kKvFp8Threads)
    WriteLatentKernel(const float* src, int64_t ld, const int32_t* slots, uint8_t* cache,
                      int kvr, int rope) {
  PdlEnter();
  const int64_t r = blockIdx.x;
  const float* x = src + r * ld;
  const int64_t row_bytes = LatentRowBytes(kvr, rope);
  uint8_t* out = cache + int64_t{slots[r]} * row_bytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = static_cast<int>(LatentNumScales(kvr));
  for (int g = warp; g < groups; g += kKvFp8Threads / 32) {
    const int d = g * kScaleGroup + 4 * lane;
    const bool ok = d < kvr && 4 * lane < kScaleGroup;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    float amax = 0.f;
    if (ok) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = x[d + j];
        amax = AmaxFold(amax, v[j]);
      }
    }
    const float scale = Ue8m0Scale(WarpMax(amax));
    if (ok) *reinterpret_cast<uint32_t*>(out + d) = Quant4(v, scale);
    if (lane == 0) {
      reinterpret_cast<float*>(out + LatentScaleOffset(kvr))[g] = scale;
    }
  }
  uint8_t* rp = out + LatentRopeOffset(kvr);
  for (int i = threadIdx.x; i < rope / 2; i += kKvFp8Threads) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(x[kvr + 2 * i], x[kvr + 2 * i + 1]);
    *reinterpret_cast<__nv_bfloat162*>(rp + 4 * i) = b;
  }
}

// grid: ceil(rows / 4); block kKvFp8Threads: one warp per key row.
__global__ void __launch_bounds__(kKvFp8Threads)
    WriteIndexKernel(const float* src, int64_t ld, int64_t rows, const int32_t* slots,
                     uint8_t* cache, int dim, int block_size) {
  PdlEnter();
  const int64_t r = int64_t{blockIdx.x} * (kKvFp8Threads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* x = src + r * ld;
  float amax = 0.f;
  for (int d = lane; d < dim; d += 32) amax = AmaxFold(amax, x[d]);
  const float scale = Ue8m0Scale(WarpMax(amax));
  const int64_t slot = slots[r];
  uint8_t* v = cache + IndexValueOffset(slot, block_size, dim);
  for (int d = 4 * lane; d < dim; d += 128) {
    const float q[4] = {x[d], x[d + 1], x[d + 2], x[d + 3]};
    *reinterpret_cast<uint32_t*>(v + d) = Quant4(q, scale);
  }
  if (lane == 0) {
    *reinterpret_cast<float*>(cache + IndexScaleOffset(slot, block_size, dim)) = scale;
  }
}

// grid: rows; block kKvFp8Threads. out[r] = dequantized latent of slots[r].
__global__ void __launch_bounds__(kKvFp8Threads)
    GatherLatentKernel(const uint8_t* cache, const int32_t* slots, int kvr, int rope, float* out,
                       int64_t ld) {
  PdlEnter();
  const int64_t r = blockIdx.x;
  const uint8_t* row = cache + int64_t{slots[r]} * LatentRowBytes(kvr, rope);
  const float* scales = reinterpret_cast<const float*>(row + LatentScaleOffset(kvr));
  float* o = out + r * ld;
  for (int d4 = threadIdx.x; d4 < kvr / 4; d4 += kKvFp8Threads) {
    __nv_fp8x4_e4m3 q;
    q.__x = *reinterpret_cast<const __nv_fp8x4_storage_t*>(row + 4 * d4);
    const float4 f = static_cast<float4>(q);
    const float s = scales[(4 * d4) / kScaleGroup];
    o[4 * d4] = f.x * s;
    o[4 * d4 + 1] = f.y * s;
    o[4 * d4 + 2] = f.z * s;
    o[4 * d4 + 3] = f.w * s;
  }
  const __nv_bfloat162* rp =
      reinterpret_cast<const __nv_bfloat162*>(row + LatentRopeOffset(kvr));
  for (int i = threadIdx.x; i < rope / 2; i += kKvFp8Threads) {
    const float2 f = __bfloat1622float2(rp[i]);
    o[kvr + 2 * i] = f.x;
    o[kvr + 2 * i + 1] = f.y;
  }
}

}  // namespace glm::kernels::kv_fp8
