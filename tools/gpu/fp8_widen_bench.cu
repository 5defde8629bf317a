// Exploratory microbenchmark: how fast can one token's fp8 (e4m3) weight stream be widened and
// multiplied at HBM rate? Streams an fp8 matrix [rows, 6144] once per launch with the MoE decode
// kernel's pattern (a warp owns 4 rows; lane l reads 16-byte chunks l, l + 32, ... of each row,
// two chunks in flight) and dots every row with an fp32 x, under different widening methods.
// Build and run on the GPU machine, from the repo root:
//   nvcc -O3 -arch=sm_90a -I. -o fp8_widen_bench tools/gpu/fp8_widen_bench.cu
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/load_util.cuh"

constexpr int kK = 6144;
constexpr int kWarps = 8;

using glm::kernels::detail::LoadStreaming16;

// e4m3 pair (low 16 bits of w) -> f16x2 of value * 2^-8, exact, integer ops only.
__device__ __forceinline__ uint32_t Trick16(uint32_t lo8) {
  // lo8: bytes placed at bits 8..15 and 24..31.
  return (lo8 & 0x80008000u) | ((lo8 & 0x7F007F00u) >> 1);
}

template <int kMode>
__device__ __forceinline__ void Widen(uint32_t w, float (&f)[4]) {
  if constexpr (kMode == 1) {
    __nv_fp8x4_e4m3 h;
    h.__x = w;
    const float4 v = static_cast<float4>(h);
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  } else if constexpr (kMode == 2) {
    const uint32_t a = Trick16(__byte_perm(w, 0, 0x1404));
    const uint32_t b = Trick16(__byte_perm(w, 0, 0x3424));
    __half2 ha, hb;
    memcpy(&ha, &a, 4);
    memcpy(&hb, &b, 4);
    const float2 x = __half22float2(ha), y = __half22float2(hb);
    f[0] = x.x, f[1] = x.y, f[2] = y.x, f[3] = y.y;
  } else if constexpr (kMode == 3) {
    // straight to f32 bits (value * 2^-120): sign bit 31, magnitude at bits 20..26.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int s = static_cast<int>(w << (24 - 8 * i)) >> 4;
      f[i] = __int_as_float(s & static_cast<int>(0x87F00000u));
    }
  } else if constexpr (kMode == 4) {
    // cvt to f16x2, then f16 -> f32
    __half2_raw ra =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
    __half2_raw rb =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
    __half2 ha, hb;
    memcpy(&ha, &ra, 4);
    memcpy(&hb, &rb, 4);
    const float2 x = __half22float2(ha), y = __half22float2(hb);
    f[0] = x.x, f[1] = x.y, f[2] = y.x, f[3] = y.y;
  }
}

// Chunk c of 4 rows (`cur`, 16 fp8 values each) dotted with x[16c..16c+16), widened by kMode
// (1..4), times the chunk's block scale, added into acc.
template <int kMode>
__device__ __forceinline__ void DotChunk(const uint4 (&cur)[4], const float* x, const float* sc,
                                         int c, float (&acc)[4]) {
  float xv[16];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x + c * 16) + j);
    xv[4 * j] = v.x, xv[4 * j + 1] = v.y, xv[4 * j + 2] = v.z, xv[4 * j + 3] = v.w;
  }
  const float s = __ldg(sc + (c * 16) / 128);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t q[4] = {cur[m].x, cur[m].y, cur[m].z, cur[m].w};
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float f[4];
      Widen<kMode>(q[i], f);
#pragma unroll
      for (int e = 0; e < 4; ++e) t += xv[4 * i + e] * f[e];
    }
    acc[m] += t * s;
  }
}

// mode 0: loads only (xor fold); 1: cvt fp8x4 -> float4 (today's MoE decode); 2: integer trick to
// f16 then f16 -> f32; 3: integer trick to f32; 4: cvt to f16x2 then f16 -> f32;
// 5: mma.sync m16n8k16 f16 with cvt (today's GEMV); 6: the same mma with the integer trick.
template <int kMode, int kMinBlocks = 2, int kPf = 0>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    Stream(const uint8_t* w, const float* x, const float* sc, int rows, float* out) {
  const int lane = threadIdx.x & 31;
  const int gw = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int nw = gridDim.x * kWarps;
  constexpr int kChunks = kK / 16;
  for (int r0 = gw * 4; r0 < rows; r0 += nw * 4) {
    const uint8_t* wr[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) wr[m] = w + static_cast<int64_t>(r0 + m) * kK;
    float acc[4] = {0, 0, 0, 0};
    uint32_t fold = 0;
    uint4 cur[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) cur[m] = LoadStreaming16(wr[m] + lane * 16);
    // L2 prefetch of iterations 1..kPf ahead (each iteration: 4 rows x 512 bytes = 16 lines;
    // lane l < 16 takes row l / 4, line l % 4).
    const uint8_t* pf_base = wr[(lane >> 2) & 3] + (lane & 3) * 128;
    if (kPf > 0 && lane < 16) {
      for (int d = 1; d <= kPf; ++d) {
        if (d * 512 < kK) asm volatile("prefetch.global.L2 [%0];" ::"l"(pf_base + d * 512));
      }
    }
    for (int c = lane; c < kChunks; c += 32) {
      if (kPf > 0 && lane < 16) {
        const int it = (c - lane) / 32 + 1 + kPf;  // iteration to prefetch
        if (it * 512 < kK) asm volatile("prefetch.global.L2 [%0];" ::"l"(pf_base + it * 512));
      }
      uint4 nxt[4];
      if (c + 32 < kChunks) {
#pragma unroll
        for (int m = 0; m < 4; ++m) nxt[m] = LoadStreaming16(wr[m] + (c + 32) * 16);
      }
      if constexpr (kMode == 0) {
#pragma unroll
        for (int m = 0; m < 4; ++m) fold ^= cur[m].x ^ cur[m].y ^ cur[m].z ^ cur[m].w;
      } else if constexpr (kMode <= 4) {
        DotChunk<kMode>(cur, x, sc, c, acc);
      } else {
        // 16 rows per mma: rows = the 4 rows' chunks seen as a 16 x k tile (timing only: the
        // operand layout is not a real matrix product), B = x as f16 from registers.
        const uint32_t b0 = __float_as_uint(x[lane]), b1 = b0 ^ 0x3c003c00u;
        float d[4] = {0, 0, 0, 0};
#pragma unroll
        for (int m = 0; m < 4; m += 2) {
          const uint32_t qa[4] = {cur[m].x, cur[m].y, cur[m].z, cur[m].w};
          const uint32_t qb[4] = {cur[m + 1].x, cur[m + 1].y, cur[m + 1].z, cur[m + 1].w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint32_t a0, a1, a2, a3;
            if constexpr (kMode == 5) {
              __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2(
                  static_cast<__nv_fp8x2_storage_t>(qa[j] & 0xffffu), __NV_E4M3);
              __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2(
                  static_cast<__nv_fp8x2_storage_t>(qb[j] & 0xffffu), __NV_E4M3);
              __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(
                  static_cast<__nv_fp8x2_storage_t>(qa[j] >> 16), __NV_E4M3);
              __half2_raw h3 = __nv_cvt_fp8x2_to_halfraw2(
                  static_cast<__nv_fp8x2_storage_t>(qb[j] >> 16), __NV_E4M3);
              memcpy(&a0, &h0, 4);
              memcpy(&a1, &h1, 4);
              memcpy(&a2, &h2, 4);
              memcpy(&a3, &h3, 4);
            } else {
              a0 = Trick16(__byte_perm(qa[j], 0, 0x1404));
              a1 = Trick16(__byte_perm(qb[j], 0, 0x1404));
              a2 = Trick16(__byte_perm(qa[j], 0, 0x3424));
              a3 = Trick16(__byte_perm(qb[j], 0, 0x3424));
            }
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
          }
        }
        const float s = __ldg(sc + (c * 16) / 128);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] += d[e] * s;
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) cur[m] = nxt[m];
    }
    float v = acc[0] + acc[1] + acc[2] + acc[3] + __uint_as_float(fold & 0x3fffffffu);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[r0 / 4] = v;
  }
}

// The MoE pattern with the weight chunks staged through a per-warp shared-memory ring of kStages
// iterations (cp.async.cg 16-byte copies: bytes in flight cost no registers), today's widening.
template <int kStages>
__global__ void __launch_bounds__(kWarps * 32, 2)
    StreamAsync(const uint8_t* w, const float* x, const float* sc, int rows, float* out) {
  extern __shared__ __align__(16) uint4 ring[];  // [warp][stage][4 rows][32 lanes]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * kWarps + warp;
  const int nw = gridDim.x * kWarps;
  constexpr int kChunks = kK / 16;
  constexpr int kIters = kChunks / 32;
  uint4* my = ring + warp * kStages * 4 * 32;
  const unsigned my_s = static_cast<unsigned>(__cvta_generic_to_shared(my));
  for (int r0 = gw * 4; r0 < rows; r0 += nw * 4) {
    const uint8_t* wr[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) wr[m] = w + static_cast<int64_t>(r0 + m) * kK;
    auto issue = [&](int it) {
      if (it < kIters) {
        const int st = it % kStages;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const unsigned dst = my_s + ((st * 4 + m) * 32 + lane) * 16;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst),
                       "l"(wr[m] + (it * 32 + lane) * 16)
                       : "memory");
        }
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int it = 0; it < kStages - 1; ++it) issue(it);
    float acc[4] = {0, 0, 0, 0};
    for (int it = 0; it < kIters; ++it) {
      issue(it + kStages - 1);
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
      const int c = it * 32 + lane;
      const int st = it % kStages;
      uint4 cur[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) cur[m] = my[(st * 4 + m) * 32 + lane];
      DotChunk<1>(cur, x, sc, c, acc);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    float v = acc[0] + acc[1] + acc[2] + acc[3];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[r0 / 4] = v;
  }
}

// Every non-NaN e4m3 byte: the integer tricks give value * 2^-8 (f16) / 2^-120 (f32) exactly.
__global__ void CheckTricks(int* bad) {
  const uint32_t b = threadIdx.x;
  if ((b & 0x7f) == 0x7f) return;
  const uint32_t w = b | (b << 8) | (b << 16) | (b << 24);
  float ref[4], f2[4], f3[4];
  Widen<1>(w, ref);
  Widen<2>(w, f2);
  Widen<3>(w, f3);
  for (int i = 0; i < 4; ++i) {
    if (f2[i] * 256.0f != ref[i] || f3[i] * 0x1p120f != ref[i]) atomicAdd(bad, 1);
  }
}

#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                                    \
    }                                                              \
  } while (0)

// Times `launch(buffer offset)` (4 warm-up launches, then 40 over the rotating buffers), prints
// µs, GB/s and the fraction of the D2D rate.
template <typename Launch>
int Time(const char* name, int nbuf, int64_t buf_bytes, double d2d, Launch launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int iters = 40;
  for (int i = 0; i < 4; ++i) launch(int64_t{0});
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) launch((i % nbuf) * buf_bytes);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  const double us = 1e3 * ms / iters;
  const double gbs = buf_bytes / (us * 1e-6) / 1e9;
  std::printf("%-34s %8.2f us  %7.0f GB/s  %.3f of D2D\n", name, us, gbs, gbs / d2d);
  return 0;
}

template <int kStages>
int RunAsync(const char* name, const uint8_t* w, const float* x, const float* sc, int rows,
             float* out, int nbuf, int64_t buf_bytes, int blocks, double d2d) {
  const int smem = kWarps * kStages * 4 * 32 * 16;
  CK(cudaFuncSetAttribute(StreamAsync<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return Time(name, nbuf, buf_bytes, d2d, [&](int64_t off) {
    StreamAsync<kStages><<<blocks, kWarps * 32, smem>>>(w + off, x, sc, rows, out);
  });
}

template <int kMode, int kMinBlocks = 2, int kPf = 0>
int Run(const char* name, const uint8_t* w, const float* x, const float* sc, int rows, float* out,
        int nbuf, int64_t buf_bytes, int blocks, double d2d) {
  return Time(name, nbuf, buf_bytes, d2d, [&](int64_t off) {
    Stream<kMode, kMinBlocks, kPf><<<blocks, kWarps * 32>>>(w + off, x, sc, rows, out);
  });
}

int main() {
  const int rows = 16384;  // 100 MB per buffer (o_proj's bytes)
  const int64_t bytes = int64_t{rows} * kK;
  const int nbuf = 4;  // rotate over 400 MB so that no launch finds its bytes in L2
  uint8_t* w;
  float *x, *sc, *out;
  CK(cudaMalloc(&w, bytes * nbuf));
  CK(cudaMalloc(&x, kK * 4));
  CK(cudaMalloc(&sc, kK / 128 * 4));
  CK(cudaMalloc(&out, rows * 4));
  std::vector<uint8_t> hw(bytes);
  for (int64_t i = 0; i < bytes; ++i) hw[i] = static_cast<uint8_t>((i * 2654435761u) >> 13) & 0x77;
  for (int i = 0; i < nbuf; ++i)
    CK(cudaMemcpy(w + i * bytes, hw.data(), bytes, cudaMemcpyHostToDevice));
  std::vector<float> hx(kK, 0.01f);
  CK(cudaMemcpy(x, hx.data(), kK * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sc, hx.data(), kK / 128 * 4, cudaMemcpyHostToDevice));
  // D2D limit in the same process.
  void* big;
  const size_t dbytes = size_t{1} << 30;
  CK(cudaMalloc(&big, 2 * dbytes));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaMemcpy(big, static_cast<char*>(big) + dbytes, dbytes, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(a));
  for (int i = 0; i < 5; ++i) {
    CK(cudaMemcpyAsync(big, static_cast<char*>(big) + dbytes, dbytes, cudaMemcpyDeviceToDevice));
  }
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  const double d2d = 2.0 * dbytes * 5 / (ms * 1e-3) / 1e9;
  CK(cudaFree(big));
  int* bad;
  CK(cudaMallocManaged(&bad, 4));
  *bad = 0;
  CheckTricks<<<1, 256>>>(bad);
  CK(cudaDeviceSynchronize());
  std::printf("integer tricks: %d mismatches over the 254 non-NaN e4m3 values\n", *bad);
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("D2D %.0f GB/s, %d SMs, 100 MB fp8 per launch\n", d2d, sms);
  {
    const int blocks = sms * 2;
    int rc = 0;
    rc |= Run<0>("loads only", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<1>("cvt fp8x4->float4 + FMA (MoE)", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<2>("int trick f16, f16->f32 + FMA", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<3>("int trick f32 + FMA", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<4>("cvt f16x2, f16->f32 + FMA", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<5>("mma f16, cvt (GEMV)", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<6>("mma f16, int trick", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    // 4 CTAs per SM (64 registers per thread): twice the loads in flight per SM.
    rc |= Run<0, 4>("loads only, 4 CTAs/SM", w, x, sc, rows, out, nbuf, bytes, 4 * sms, d2d);
    rc |= Run<1, 4>("cvt float4 + FMA, 4 CTAs/SM", w, x, sc, rows, out, nbuf, bytes, 4 * sms, d2d);
    rc |=
        Run<2, 4>("int trick f16 + FMA, 4 CTAs/SM", w, x, sc, rows, out, nbuf, bytes, 4 * sms, d2d);
    // L2 prefetch of the iterations ahead (2 CTAs/SM, today's register use).
    rc |= Run<0, 2, 2>("loads only, L2 prefetch 2 ahead", w, x, sc, rows, out, nbuf, bytes, blocks,
                       d2d);
    rc |=
        Run<1, 2, 1>("cvt float4 + FMA, prefetch 1", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |=
        Run<1, 2, 2>("cvt float4 + FMA, prefetch 2", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |=
        Run<1, 2, 4>("cvt float4 + FMA, prefetch 4", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |=
        Run<1, 2, 8>("cvt float4 + FMA, prefetch 8", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<5, 2, 2>("mma f16 cvt, prefetch 2", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= Run<1, 4, 2>("cvt float4 + FMA, 4 CTAs/SM, pf 2", w, x, sc, rows, out, nbuf, bytes,
                       4 * sms, d2d);
    rc |= RunAsync<2>("cp.async ring 2 stages + cvt FMA", w, x, sc, rows, out, nbuf, bytes, blocks,
                      d2d);
    rc |= RunAsync<3>("cp.async ring 3 stages", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= RunAsync<4>("cp.async ring 4 stages", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    rc |= RunAsync<6>("cp.async ring 6 stages", w, x, sc, rows, out, nbuf, bytes, blocks, d2d);
    if (rc) return 1;
  }
  return 0;
}
