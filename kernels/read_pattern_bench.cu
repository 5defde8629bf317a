// read_pattern_bench: how fast can a weight-streaming kernel read HBM with a given access
// pattern? Measures a pure read (XOR-folded so nothing is optimized away; one word per thread
// written) of a [rows, row_bytes] matrix laid out like a Linear weight, the way the decode GEMV
// walks it: a CTA of 8 warps owns 8 x rows_per_warp consecutive rows and one K range, each warp
// keeps `depth` steps of 2 KiB in flight, a step being rows_per_warp rows x (2048 /
// rows_per_warp) contiguous bytes. rows_per_warp = 16 is gemv_narrow's pattern (128-byte row
// pieces); fewer rows per warp read longer contiguous runs of each row. A contiguous grid-stride
// read and a D2D copy of the same bytes, in the same process, are the baselines.
//
// Two more tables test an L2 prefetch (cp.async.bulk.prefetch.L2) of part of o_proj issued ahead
// of its read, with a spin kernel standing in for the latency-bound attention chain in between:
// the prefetch of the first MiB, and of the first fraction of every CTA's row pieces.
// Usage: read_pattern_bench [--iters N]. Prints one table row per (shape, pattern).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/bench_util.h"
#include "kernels/load_util.cuh"

namespace {

using glm::kernels::detail::LoadStreaming16;

constexpr int kWarps = 8;
constexpr int kStepBytes = 2048;  // per warp per step: 32 lanes x 4 x 16 bytes

// grid (ceil(rows / (8 * RW)), splits), block 256. Each CTA reads rows [8 RW bx, +8 RW) x bytes
// [by * range, +range) of a row_bytes-strided matrix; range % (2048 / RW) == 0.
template <int RW, int kDepth>
__global__ void __launch_bounds__(256, 2)
    RowPatternKernel(const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t range,
                     uint32_t* out) {
  constexpr int kBS = kStepBytes / RW;  // contiguous bytes of one row per step
  constexpr int kChunksPerRow = kBS / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = int64_t{blockIdx.x} * kWarps * RW + warp * RW;
  const int64_t c0 = int64_t{blockIdx.y} * range;
  const int64_t c1 = min(c0 + range, row_bytes);
  const int nsteps = static_cast<int>((c1 - c0) / kBS);
  // Chunk q = lane + 32 j of the step: row q / kChunksPerRow, 16 bytes at (q % kChunksPerRow).
  const uint8_t* base[4];
  bool valid[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int q = lane + 32 * j;
    const int64_t r = r0 + q / kChunksPerRow;
    valid[j] = r < rows;
    base[j] = w + (valid[j] ? r : 0) * row_bytes + c0 + (q % kChunksPerRow) * 16;
  }
  uint4 ring[kDepth][4];
  auto load = [&](uint4(&dst)[4], int s) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      dst[j] = valid[j] ? LoadStreaming16(base[j] + int64_t{s} * kBS) : make_uint4(0, 0, 0, 0);
    }
  };
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    if (d < nsteps) load(ring[d], d);
  }
  uint32_t acc = 0;
  for (int s = 0; s < nsteps; s += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (s + d < nsteps) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc ^= ring[d][j].x ^ ring[d][j].y ^ ring[d][j].z ^ ring[d][j].w;
        }
        if (s + d + kDepth < nsteps) load(ring[d], s + d + kDepth);
      }
    }
  }
  out[(int64_t{blockIdx.y} * gridDim.x + blockIdx.x) * 256 + threadIdx.x] = acc;
}

// Contiguous: the whole buffer as one stream, each warp 2 KiB per step, kDepth steps in flight.
template <int kDepth>
__global__ void __launch_bounds__(256, 2)
    ContiguousKernel(const uint8_t* w, int64_t bytes, uint32_t* out) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const int64_t nw = (int64_t{gridDim.x} * blockDim.x) >> 5;
  const int64_t steps = bytes / kStepBytes;
  uint32_t acc = 0;
  for (int64_t s0 = gw * kDepth; s0 < steps; s0 += nw * kDepth) {
    uint4 v[kDepth][4];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[d][j] = s0 + d < steps ? LoadStreaming16(w + (s0 + d) * kStepBytes + (lane + 32 * j) * 16)
                                 : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc ^= v[d][j].x ^ v[d][j].y ^ v[d][j].z ^ v[d][j].w;
    }
  }
  out[int64_t{blockIdx.x} * blockDim.x + threadIdx.x] = acc;
}

// Bulk L2 prefetch (sm_90 cp.async.bulk.prefetch.L2) of [p, p + bytes): thread i of the grid
// issues chunks i, i + threads, ... of kChunk bytes. Changes no memory.
constexpr int64_t kChunk = 64 * 1024;
__global__ void PrefetchL2Kernel(const uint8_t* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t n = (bytes + kChunk - 1) / kChunk;
  for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < n;
       c += int64_t{gridDim.x} * blockDim.x) {
    const int64_t len = min(kChunk, bytes - c * kChunk) & ~int64_t{15};
    if (len > 0) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + c * kChunk),
                   "r"(static_cast<uint32_t>(len))
                   : "memory");
    }
  }
#endif
}

// Bulk L2 prefetch of the first `len` bytes of every (row, K range) piece: rows x splits pieces
// at w + row * row_bytes + split * range (what a split-K GEMV CTA reads first).
__global__ void PrefetchPiecesKernel(const uint8_t* w, int64_t rows, int64_t row_bytes,
                                     int64_t range, int splits, int64_t len) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t n = rows * splits;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / splits, sp = i % splits;
    const int64_t off = sp * range;
    const int64_t l = min(len, row_bytes - off) & ~int64_t{15};
    if (l > 0) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w + r * row_bytes + off),
                   "r"(static_cast<uint32_t>(l))
                   : "memory");
    }
  }
#endif
}

// Spins one thread per CTA for `ns` nanoseconds (the latency-bound attention chain that would
// run while the prefetch fills the L2).
__global__ void SpinKernel(int64_t ns) {
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  uint64_t t = t0;
  while (t - t0 < static_cast<uint64_t>(ns)) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}

struct Shape {
  const char* name;
  int64_t rows, row_bytes;
};

template <typename F>
float TimeUs(F&& launch, int iters) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  launch();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    BENCH_CHECK(cudaEventRecord(a));
    launch();
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

// Launches rotate through the 1 GiB buffer so that each reads bytes the previous ones did not
// (decode reads every layer's weights once: nothing is in L2).
struct Rotation {
  const uint8_t* buffer;
  int64_t slots;  // whole copies of the shape in the buffer
  int64_t bytes;
  int64_t next = 0;
  const uint8_t* Next() { return buffer + (next++ % slots) * bytes; }
};

// Median µs of `read` alone (events around it) over `iters` rounds of: pick the next weight
// copy p, prefetch(p), a spin of spin_ns, read(p).
template <typename Prefetch, typename Read>
float TimeReadAfterPrefetch(Rotation& rot, int iters, int64_t spin_ns, Prefetch&& prefetch,
                            Read&& read) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    const uint8_t* p = rot.Next();
    prefetch(p);
    SpinKernel<<<1, 1>>>(spin_ns);
    BENCH_CHECK(cudaEventRecord(a));
    read(p);
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <int RW, int kDepth>
void RunRow(const Shape& s, Rotation& rot, uint32_t* out, int sms, int iters, float copy_gbs) {
  constexpr int kBS = kStepBytes / RW;
  const int64_t row_blocks = (s.rows + kWarps * RW - 1) / (kWarps * RW);
  const int64_t slots = 2 * int64_t{sms};
  const int64_t max_splits = s.row_bytes / kBS;
  int64_t splits = std::clamp<int64_t>((slots + row_blocks - 1) / row_blocks, 1, max_splits);
  int64_t range = (s.row_bytes / splits + kBS - 1) / kBS * kBS;
  splits = (s.row_bytes + range - 1) / range;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
  const float us = TimeUs(
      [&] {
        RowPatternKernel<RW, kDepth><<<grid, 256>>>(rot.Next(), s.rows, s.row_bytes, range, out);
      },
      iters);
  BENCH_CHECK(cudaGetLastError());
  const double gbs = static_cast<double>(s.rows) * s.row_bytes / us / 1e3;
  std::printf("| %s | rows %d x %d B | %d | %lld x %lld | %.2f | %.0f | %.3f |\n", s.name, RW, kBS,
              kDepth, static_cast<long long>(row_blocks), static_cast<long long>(splits), us, gbs,
              gbs / copy_gbs);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: read_pattern_bench [--iters N]\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("read_pattern_bench: no CUDA device; nothing measured\n");
    return 0;
  }
  int sms = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Shape shapes[] = {{"o_proj 6144 x 16384", 6144, 16384},
                          {"b_proj 20480 x 2048", 20480, 2048},
                          {"a_proj 2848 x 6144", 2848, 6144},
                          {"expert gate|up 4096 x 6144", 4096, 6144}};
  const int64_t copy_bytes = int64_t{1} << 30;
  uint8_t *w = nullptr, *dst = nullptr;
  uint32_t* out = nullptr;
  BENCH_CHECK(cudaMalloc(&w, copy_bytes));
  BENCH_CHECK(cudaMalloc(&dst, copy_bytes));
  BENCH_CHECK(cudaMalloc(&out, int64_t{1} << 26));
  BENCH_CHECK(cudaMemset(w, 0x5a, copy_bytes));
  const float copy_us =
      TimeUs([&] { BENCH_CHECK(cudaMemcpyAsync(dst, w, copy_bytes, cudaMemcpyDeviceToDevice)); },
             std::max(iters / 5, 3));
  const float copy_gbs = static_cast<float>(2.0 * copy_bytes / copy_us / 1e3);
  const float cont_us = TimeUs([&] { ContiguousKernel<4><<<2 * sms, 256>>>(w, copy_bytes, out); },
                               std::max(iters / 5, 3));
  std::printf(
      "read_pattern_bench: %d SMs; D2D copy 1 GiB %.0f GB/s (read + write); contiguous "
      "read 1 GiB %.0f GB/s (%.3f of copy)\n\n",
      sms, copy_gbs, copy_bytes / cont_us / 1e3, copy_bytes / cont_us / 1e3 / copy_gbs);
  std::printf(
      "| shape | step per warp | depth | grid | us | GB/s | of copy "
      "|\n|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const int64_t bytes = s.rows * s.row_bytes;
    Rotation rot{w, copy_bytes / bytes, bytes};
    const float c_us =
        TimeUs([&] { ContiguousKernel<4><<<2 * sms, 256>>>(rot.Next(), bytes, out); }, iters);
    std::printf("| %s | contiguous 2048 B | 4 | %d | %.2f | %.0f | %.3f |\n", s.name, 2 * sms, c_us,
                bytes / c_us / 1e3, bytes / c_us / 1e3 / copy_gbs);
    RunRow<16, 4>(s, rot, out, sms, iters, copy_gbs);
    RunRow<16, 8>(s, rot, out, sms, iters, copy_gbs);
    RunRow<8, 4>(s, rot, out, sms, iters, copy_gbs);
    RunRow<4, 4>(s, rot, out, sms, iters, copy_gbs);
    RunRow<2, 4>(s, rot, out, sms, iters, copy_gbs);
    RunRow<1, 4>(s, rot, out, sms, iters, copy_gbs);
  }
  // o_proj read (gemv_narrow's 16 x 128 B pattern) after an L2 prefetch of its first `mb` MiB and
  // a 60 us spin (time of the read alone: events around it).
  std::printf(
      "\n| o_proj read after prefetching its first MiB into L2 (60 us spin between) | us | "
      "GB/s (all bytes) |\n|---|---|---|\n");
  {
    const Shape s = shapes[0];
    const int64_t bytes = s.rows * s.row_bytes;
    Rotation rot{w, copy_bytes / bytes, bytes};
    const int64_t row_blocks = s.rows / 128;
    const dim3 grid(static_cast<unsigned>(row_blocks), 6);
    const int64_t range = (s.row_bytes / 6 + 127) / 128 * 128;
    for (int mb : {0, 8, 16, 24, 32, 40, 48, 56, 64}) {
      const float us = TimeReadAfterPrefetch(
          rot, iters, 60000,
          [&](const uint8_t* p) {
            if (mb > 0) PrefetchL2Kernel<<<32, 32>>>(p, int64_t{mb} << 20);
          },
          [&](const uint8_t* p) {
            RowPatternKernel<16, 4><<<grid, 256>>>(p, s.rows, s.row_bytes, range, out);
          });
      std::printf("| %d MiB | %.2f | %.0f |\n", mb, us, bytes / us / 1e3);
    }
  }
  // The same with the prefetch spread over every CTA's piece: the first fraction of each (row,
  // K range), splits 5 (gemv_narrow's o_proj plan: 240 CTAs, one wave).
  std::printf(
      "\n| o_proj (5 splits) after prefetching the first fraction of every CTA's row pieces "
      "| prefetched MiB | spin us | us | GB/s (all bytes) |\n|---|---|---|---|---|\n");
  {
    const Shape s = shapes[0];
    const int64_t bytes = s.rows * s.row_bytes;
    Rotation rot{w, copy_bytes / bytes, bytes};
    const int splits = 5;
    const int64_t range = (s.row_bytes / splits + 127) / 128 * 128;
    const dim3 grid(static_cast<unsigned>(s.rows / 128), splits);
    for (int spin : {20000, 60000}) {
      for (int pct : {0, 10, 20, 30, 40, 50, 60}) {
        const int64_t len = range * pct / 100 / 16 * 16;
        const float us = TimeReadAfterPrefetch(
            rot, iters, spin,
            [&](const uint8_t* p) {
              if (len > 0) {
                PrefetchPiecesKernel<<<64, 128>>>(p, s.rows, s.row_bytes, range, splits, len);
              }
            },
            [&](const uint8_t* p) {
              RowPatternKernel<16, 4><<<grid, 256>>>(p, s.rows, s.row_bytes, range, out);
            });
        std::printf("| %d %% | %.1f | %d | %.2f | %.0f |\n", pct,
                    static_cast<double>(len) * s.rows * splits / (1 << 20), spin / 1000, us,
                    bytes / us / 1e3);
      }
    }
  }
  BENCH_CHECK(cudaFree(w));
  BENCH_CHECK(cudaFree(dst));
  BENCH_CHECK(cudaFree(out));
  return 0;
}
