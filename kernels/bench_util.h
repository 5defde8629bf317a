// Shared by the kernel benches (host code): fail-fast checks, the timing loops (graph-captured
// and eager) and the D2D copy bandwidth baseline.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "absl/status/status.h"

// A CUDA call that must succeed, else the bench stops naming the call.
#define BENCH_CHECK(expr)                                                                        \
  do {                                                                                           \
    const cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace glm::kernels {

inline void CheckOk(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Median over `trials` (after two warm-ups) of the event-timed milliseconds of `run` (which
// enqueues work on `stream`).
inline double MedianTrialMs(const std::function<void()>& run, int trials, cudaStream_t stream) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int trial = 0; trial < trials + 2; ++trial) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    run();
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float m = 0;
    BENCH_CHECK(cudaEventElapsedTime(&m, start, stop));
    if (trial >= 2) ms.push_back(m);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Fills device memory with pseudo-random bytes (an up-to-8 MiB host pattern block copied over).
// For e4m3 weights `fp8` avoids the NaN encodings; for bf16 it writes finite values near +-1.
inline void FillRandom(void* dst, size_t bytes, bool fp8, uint32_t seed) {
  const size_t block = std::min<size_t>(bytes, size_t{8} << 20);
  std::vector<uint8_t> h(block);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < block; ++i) {
    s = s * 1664525u + 1013904223u;
    uint8_t b = static_cast<uint8_t>(s >> 24);
    if (fp8) {
      if ((b & 0x7F) == 0x7F) b = 0x38;
    } else if (i % 2 == 1) {
      b = static_cast<uint8_t>(0x3C + (b & 3));  // bf16 high byte: exponent near 1.0, sign +/-
      if (s & 0x100) b |= 0x80;
    }
    h[i] = b;
  }
  for (size_t off = 0; off < bytes; off += block) {
    BENCH_CHECK(cudaMemcpy(static_cast<char*>(dst) + off, h.data(), std::min(block, bytes - off),
                           cudaMemcpyHostToDevice));
  }
}

// n floats of value v, uploaded to dst.
inline void FillConst(float* dst, size_t n, float v) {
  std::vector<float> h(n, v);
  BENCH_CHECK(cudaMemcpy(dst, h.data(), n * 4, cudaMemcpyHostToDevice));
}

struct BenchTiming {
  double us_per_call = 0;
  bool graph = false;  // the calls ran as one captured CUDA graph
};

// Median over `trials` (after two warm-ups) of (time of `calls` enqueues) / calls, in µs. The
// calls are captured into one CUDA graph first; eager launches if capture fails.
inline BenchTiming TimeEnqueues(const std::function<absl::Status(int)>& enqueue, int calls,
                                int trials, cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool captured = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) == cudaSuccess;
  if (captured) {
    for (int i = 0; i < calls && captured; ++i) captured = enqueue(i).ok();
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    captured =
        captured && end == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  }
  (void)cudaGetLastError();
  const double ms = MedianTrialMs(
      [&] {
        if (captured) {
          BENCH_CHECK(cudaGraphLaunch(exec, stream));
        } else {
          for (int i = 0; i < calls; ++i) CheckOk(enqueue(i), "enqueue");
        }
      },
      trials, stream);
  BENCH_CHECK(cudaGetLastError());
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  return {ms * 1000.0 / calls, captured};
}

// Median over `trials` (after two warm-ups) of (time of `calls` eager enqueues) / calls, in µs:
// no graph (for what a graph replays differently, e.g. memcpy nodes).
inline double TimeEagerUs(const std::function<absl::Status(int)>& enqueue, int calls, int trials,
                          cudaStream_t stream) {
  return MedianTrialMs(
             [&] {
               for (int i = 0; i < calls; ++i) CheckOk(enqueue(i), "enqueue");
             },
             trials, stream) *
         1000.0 / calls;
}

// The bandwidth baseline of the benches: device-to-device cudaMemcpyAsync of `bytes` (use >= 1
// GiB), read + write bytes / time in GB/s, median of 5 trials of 4 copies after 2 warm-ups.
// Eager on purpose (as glm-bench-cuda-decode measures it): a memcpy node replayed from a CUDA
// graph runs on the copy engines at ~2/3 of this (~2.8 TB/s on the H200).
inline double MeasureD2DGBps(size_t bytes, cudaStream_t stream = nullptr) {
  void *a = nullptr, *b = nullptr;
  BENCH_CHECK(cudaMalloc(&a, bytes));
  BENCH_CHECK(cudaMalloc(&b, bytes));
  BENCH_CHECK(cudaMemset(a, 1, bytes));
  BENCH_CHECK(cudaDeviceSynchronize());
  const double us = TimeEagerUs(
      [&](int) {
        const cudaError_t e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
        return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
      },
      4, 5, stream);
  BENCH_CHECK(cudaFree(a));
  BENCH_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9;
}

// Prints "device: NAME, N SMs, compute capability X.Y, L2 MB" for the current device and returns
// a new non-blocking stream for the bench.
inline cudaStream_t PrintDeviceAndCreateStream() {
  int dev = 0;
  BENCH_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs, compute capability %d.%d, %.0f MB L2\n", prop.name,
              prop.multiProcessorCount, prop.major, prop.minor, prop.l2CacheSize / 1e6);
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

}  // namespace glm::kernels
