// fp8 KV cache writes and the prefill gather (Backend::WriteLatentFp8 / WriteIndexKeysFp8 /
// GatherLatentFp8), layouts and rule in engine/backend/kv_fp8_layout.h. The quantized bytes are
// bit-identical to the CPU backend (cpu_kv_fp8.cc): the same amax fold (finite values only), the
// same power-of-two scale (frexpf / ldexpf, exact), IEEE division by the scale (exact) and
// cvt.rn.satfinite e4m3 (NaN -> 0x7F, +-inf -> +-448), k_pe rounded to bf16 (RNE).
// Memory-bound and tiny at decode (one row per token): one warp per 128-dim group / key row.
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/status_util.h"
#include "engine/backend/cuda/cuda_ops_util.h"
#include "engine/backend/kv_fp8_layout.h"

namespace glm::engine::cuda {
namespace {

constexpr int kThreads = 128;

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

// grid: rows; block kThreads. Warp w quantizes 128-dim groups w, w + 4, ...; lane l dims 4l..4l+3.
__global__ void __launch_bounds__(kThreads)
    WriteLatentKernel(const float* src, int64_t ld, const int32_t* slots, uint8_t* cache,
                      int kvr, int rope) {
  PdlEnter();
  const int64_t r = blockIdx.x;
  const float* x = src + r * ld;
  const int64_t row_bytes = kv_fp8::LatentRowBytes(kvr, rope);
  uint8_t* out = cache + int64_t{slots[r]} * row_bytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = static_cast<int>(kv_fp8::LatentNumScales(kvr));
  for (int g = warp; g < groups; g += kThreads / 32) {
    const int d = g * kv_fp8::kScaleGroup + 4 * lane;
    const bool ok = d < kvr && 4 * lane < kv_fp8::kScaleGroup;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    float amax = 0.f;
    if (ok) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = x[d + j];
        amax = kv_fp8::AmaxFold(amax, v[j]);
      }
    }
    const float scale = kv_fp8::Ue8m0Scale(WarpMax(amax));
    if (ok) *reinterpret_cast<uint32_t*>(out + d) = Quant4(v, scale);
    if (lane == 0) {
      reinterpret_cast<float*>(out + kv_fp8::LatentScaleOffset(kvr))[g] = scale;
    }
  }
  uint8_t* rp = out + kv_fp8::LatentRopeOffset(kvr);
  for (int i = threadIdx.x; i < rope / 2; i += kThreads) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(x[kvr + 2 * i], x[kvr + 2 * i + 1]);
    *reinterpret_cast<__nv_bfloat162*>(rp + 4 * i) = b;
  }
}

// grid: ceil(rows / 4); block kThreads: one warp per key row.
__global__ void __launch_bounds__(kThreads)
    WriteIndexKernel(const float* src, int64_t ld, int64_t rows, const int32_t* slots,
                     uint8_t* cache, int dim, int block_size) {
  PdlEnter();
  const int64_t r = int64_t{blockIdx.x} * (kThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* x = src + r * ld;
  float amax = 0.f;
  for (int d = lane; d < dim; d += 32) amax = kv_fp8::AmaxFold(amax, x[d]);
  const float scale = kv_fp8::Ue8m0Scale(WarpMax(amax));
  const int64_t slot = slots[r];
  uint8_t* v = cache + kv_fp8::IndexValueOffset(slot, block_size, dim);
  for (int d = 4 * lane; d < dim; d += 128) {
    const float q[4] = {x[d], x[d + 1], x[d + 2], x[d + 3]};
    *reinterpret_cast<uint32_t*>(v + d) = Quant4(q, scale);
  }
  if (lane == 0) {
    *reinterpret_cast<float*>(cache + kv_fp8::IndexScaleOffset(slot, block_size, dim)) = scale;
  }
}

// grid: rows; block kThreads. out[r] = dequantized latent of slots[r].
__global__ void __launch_bounds__(kThreads)
    GatherLatentKernel(const uint8_t* cache, const int32_t* slots, int kvr, int rope, float* out,
                       int64_t ld) {
  PdlEnter();
  const int64_t r = blockIdx.x;
  const uint8_t* row = cache + int64_t{slots[r]} * kv_fp8::LatentRowBytes(kvr, rope);
  const float* scales = reinterpret_cast<const float*>(row + kv_fp8::LatentScaleOffset(kvr));
  float* o = out + r * ld;
  for (int d4 = threadIdx.x; d4 < kvr / 4; d4 += kThreads) {
    __nv_fp8x4_e4m3 q;
    q.__x = *reinterpret_cast<const __nv_fp8x4_storage_t*>(row + 4 * d4);
    const float4 f = static_cast<float4>(q);
    const float s = scales[(4 * d4) / kv_fp8::kScaleGroup];
    o[4 * d4] = f.x * s;
    o[4 * d4 + 1] = f.y * s;
    o[4 * d4 + 2] = f.z * s;
    o[4 * d4 + 3] = f.w * s;
  }
  const __nv_bfloat162* rp =
      reinterpret_cast<const __nv_bfloat162*>(row + kv_fp8::LatentRopeOffset(kvr));
  for (int i = threadIdx.x; i < rope / 2; i += kThreads) {
    const float2 f = __bfloat1622float2(rp[i]);
    o[kvr + 2 * i] = f.x;
    o[kvr + 2 * i + 1] = f.y;
  }
}

absl::Status CheckLatent(const Fp8LatentCache& c, const char* op) {
  if (!kv_fp8::LatentShapeOk(c.kv_lora_rank, c.rope_dim) || !detail::Aligned16(c.data)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", op, ": fp8 latent cache needs kv_lora_rank % 4 == 0 (", c.kv_lora_rank,
        "), an even rope dim (", c.rope_dim, ") and 16-byte aligned data"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteLatentFp8(const MatView& src, const int32_t* slots, const Fp8LatentCache& dst,
                            cudaStream_t stream) {
  if (src.rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckLatent(dst, "WriteLatentFp8"));
  if (src.cols != dst.kv_lora_rank + dst.rope_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda WriteLatentFp8: src has ", src.cols, " columns, the cache rows ",
        dst.kv_lora_rank + dst.rope_dim, " (kv_lora_rank + rope)"));
  }
  LaunchKernel(WriteLatentKernel, static_cast<unsigned>(src.rows), kThreads, 0, stream, src.data,
               src.ld, slots, dst.data, dst.kv_lora_rank, dst.rope_dim);
  return detail::CudaCheck(cudaGetLastError(), "WriteLatentFp8", "launch");
}

absl::Status WriteIndexKeysFp8(const MatView& src, const int32_t* slots, const Fp8IndexCache& dst,
                               cudaStream_t stream) {
  if (src.rows == 0) return absl::OkStatus();
  if (!kv_fp8::IndexShapeOk(dst.dim) || src.cols != dst.dim || dst.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda WriteIndexKeysFp8: key dim ", dst.dim, " (src cols ", src.cols,
        ") must match and be a multiple of 4, block_size ", dst.block_size, " > 0"));
  }
  const int64_t ctas = detail::CeilDiv(src.rows, kThreads / 32);
  LaunchKernel(WriteIndexKernel, static_cast<unsigned>(ctas), kThreads, 0, stream, src.data, src.ld,
               src.rows, slots, dst.data, dst.dim, dst.block_size);
  return detail::CudaCheck(cudaGetLastError(), "WriteIndexKeysFp8", "launch");
}

absl::Status GatherLatentFp8(const Fp8LatentCache& src, const int32_t* slots, const MatView& out,
                             cudaStream_t stream) {
  if (out.rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckLatent(src, "GatherLatentFp8"));
  if (out.cols != src.kv_lora_rank + src.rope_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda GatherLatentFp8: out has ", out.cols, " columns, the cache rows ",
        src.kv_lora_rank + src.rope_dim));
  }
  LaunchKernel(GatherLatentKernel, static_cast<unsigned>(out.rows), kThreads, 0, stream, src.data,
               slots, src.kv_lora_rank, src.rope_dim, out.data, out.ld);
  return detail::CudaCheck(cudaGetLastError(), "GatherLatentFp8", "launch");
}

}  // namespace glm::engine::cuda
