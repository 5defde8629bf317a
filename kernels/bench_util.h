// Shared by the kernel benches (host code): fail-fast checks, the timing loops (graph-captured
// and eager) and the D2D copy bandwidth baseline.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
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

struct BenchTiming {
  double us_per_call = 0;
  bool graph = false;  // the calls ran as one captured CUDA graph
};

// Median over `trials` (after two warm-ups) of (time of `calls` enqueues) / calls, in µs. The
// calls are captured into one CUDA graph first; eager launches if capture fails.
inline BenchTiming TimeEnqueues(const std::function<absl::Status(int)>& enqueue, int calls,
                                int trials, cudaStream_t stream) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
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
  std::vector<float> ms;
  for (int trial = 0; trial < trials + 2; ++trial) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    if (captured) {
      BENCH_CHECK(cudaGraphLaunch(exec, stream));
    } else {
      for (int i = 0; i < calls; ++i) CheckOk(enqueue(i), "enqueue");
    }
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float m = 0;
    BENCH_CHECK(cudaEventElapsedTime(&m, start, stop));
    if (trial >= 2) ms.push_back(m);
  }
  BENCH_CHECK(cudaGetLastError());
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2] * 1000.0 / calls, captured};
}

// Median over `trials` (after two warm-ups) of (time of `calls` eager enqueues) / calls, in µs:
// no graph (for what a graph replays differently, e.g. memcpy nodes).
inline double TimeEagerUs(const std::function<absl::Status(int)>& enqueue, int calls, int trials,
                          cudaStream_t stream) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int trial = 0; trial < trials + 2; ++trial) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < calls; ++i) CheckOk(enqueue(i), "enqueue");
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float m = 0;
    BENCH_CHECK(cudaEventElapsedTime(&m, start, stop));
    if (trial >= 2) ms.push_back(m);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0 / calls;
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

}  // namespace glm::kernels
