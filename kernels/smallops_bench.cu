// Decode-size small ops at GLM-5 widths, 1..16 rows: RmsNorm (6144 / 2048 / 512 columns; the
// register kernel against the two-pass kernel it replaced at decode sizes), RopeInterleaved
// (MLA q_pe: 64 heads x 32 pairs in 256-float head slots; k_pe: 1 head; indexer q: 32 heads
// x 32 pairs of 128), PerHeadGemv (absorbed MLA W_UK^T 64 x [512 x 192], W_UV 64 x [256 x 512],
// router 1 x [256 x 6144]), MoeRoute (256 experts top-8, 1, 8 and 64 rows). Each: µs per call
// over `--calls` back-to-back launches, eager and replayed from one CUDA graph (median of trials); PerHeadGemv
// also GB/s of its weight bytes against an eager device-to-device cudaMemcpyAsync of 1 GiB measured
// in the same run. Usage: smallops_bench [--calls N] [--trials N]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/bench_util.h"
#include "kernels/moe_route.cuh"
#include "kernels/moe_route.h"
#include "kernels/per_head_gemv.h"
#include "kernels/rmsnorm.cuh"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

namespace glm::kernels {
namespace {

struct Opts {
  int calls = 200;
  int trials = 7;
};

void Report(const char* what, const std::function<absl::Status(int)>& enqueue, const Opts& o,
            cudaStream_t stream, double bytes = 0, double copy_gbs = 0) {
  const double eager = TimeEagerUs(enqueue, o.calls, o.trials, stream);
  const BenchTiming g = TimeEnqueues(enqueue, o.calls, o.trials, stream);
  std::printf("%-46s eager %7.2f us  graph %7.2f us%s", what, eager, g.us_per_call,
              g.graph ? "" : " (capture failed: eager)");
  if (bytes > 0) {
    const double gbs = bytes / (g.us_per_call * 1e3);
    std::printf("  %7.1f GB/s (%.0f%% of D2D copy)", gbs, 100.0 * gbs / copy_gbs);
  }
  std::printf("\n");
}

float* DeviceRandom(size_t n, unsigned seed) {
  std::vector<float> h(n);
  srand(seed);
  for (float& v : h) v = static_cast<float>(rand()) / RAND_MAX - 0.5f;
  float* d = nullptr;
  BENCH_CHECK(cudaMalloc(&d, n * 4));
  BENCH_CHECK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  return d;
}

int Main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--calls")) o.calls = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--trials")) o.trials = std::atoi(argv[i + 1]);
  }
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; %d calls, median of %d trials\n", prop.name,
              prop.multiProcessorCount, o.calls, o.trials);

  // D2D copy baseline: eager cudaMemcpyAsync of 1 GiB (read + write counted; bench_util.h).
  const double copy_gbs = MeasureD2DGBps(size_t{1} << 30, stream);
  std::printf("D2D cudaMemcpyAsync 1 GiB eager: %.1f us, %.1f GB/s (read + write)\n",
              2.0 * double(size_t{1} << 30) / (copy_gbs * 1e3), copy_gbs);

  // RmsNorm.
  float* x = DeviceRandom(size_t{16} * 6144, 1);
  float* w = DeviceRandom(6144, 2);
  float* y = DeviceRandom(size_t{16} * 6144, 3);
  for (int64_t cols : {6144, 2048, 512}) {
    for (int64_t rows : {1, 8, 16}) {
      char what[96];
      std::snprintf(what, sizeof(what), "RmsNorm fp32 %lldx%lld", (long long)rows,
                    (long long)cols);
      Report(what, [&](int) {
        return RmsNorm(DType::kF32, x, cols, w, 1e-6f, y, cols, rows, cols, stream);
      }, o, stream);
      std::snprintf(what, sizeof(what), "  two-pass kernel (before) %lldx%lld", (long long)rows,
                    (long long)cols);
      Report(what, [&](int) {
        detail::RmsNormKernel<float><<<dim3(rows), detail::kRmsNormThreads, 0, stream>>>(
            x, cols, w, 1e-6f, y, cols, cols);
        return CudaStatus(cudaGetLastError(), "launch");
      }, o, stream);
    }
  }

  // RopeInterleaved (in place; the data drifts, which does not matter for timing).
  float* q = DeviceRandom(size_t{16} * 64 * 256, 4);
  float* freqs = DeviceRandom(64, 5);
  int32_t* pos = nullptr;
  BENCH_CHECK(cudaMalloc(&pos, 16 * 4));
  BENCH_CHECK(cudaMemset(pos, 0, 16 * 4));
  for (int64_t rows : {1, 8, 16}) {
    char what[96];
    std::snprintf(what, sizeof(what), "Rope q_pe %lld rows x 64 heads x 32 pairs", (long long)rows);
    Report(what, [&](int) {
      return RopeInterleaved(DType::kF32, q + 192, rows, 64, 64 * 256, 256, pos, freqs, 32,
                             stream);
    }, o, stream);
    std::snprintf(what, sizeof(what), "Rope k_pe %lld rows x 1 head x 32 pairs", (long long)rows);
    Report(what, [&](int) {
      return RopeInterleaved(DType::kF32, q + 512, rows, 1, 576, 0, pos, freqs, 32, stream);
    }, o, stream);
    std::snprintf(what, sizeof(what), "Rope idx q %lld rows x 32 heads x 32 pairs", (long long)rows);
    Report(what, [&](int) {
      return RopeInterleaved(DType::kF32, q, rows, 32, 32 * 128, 128, pos, freqs, 32, stream);
    }, o, stream);
  }

  // MoeRoute at GLM-5's router (256 experts, top-8, bias, renormalized, scale 2.5).
  {
    float* logits = DeviceRandom(size_t{64} * 256, 9);
    float* bias = DeviceRandom(256, 10);
    int32_t* ids = nullptr;
    float* weights = nullptr;
    BENCH_CHECK(cudaMalloc(&ids, 64 * 9 * 4));
    BENCH_CHECK(cudaMalloc(&weights, 64 * 9 * 4));
    for (int64_t rows : {1, 8, 64}) {
      char what[96];
      std::snprintf(what, sizeof(what), "MoeRoute 256 experts top-8, %lld rows", (long long)rows);
      Report(
          what,
          [&](int) {
            return MoeRoute(logits, 256, bias, rows, 256, 1, 1, 8, true, 2.5f, 256, ids, weights,
                            stream);
          },
          o, stream);
    }
    cudaFree(logits);
    cudaFree(bias);
    cudaFree(ids);
    cudaFree(weights);
  }

  // PerHeadGemv at the absorbed-MLA and router shapes.
  struct G { const char* name; int64_t heads, in, out; };
  const G shapes[] = {{"W_UK^T 64x[512x192]", 64, 192, 512},
                      {"W_UV 64x[256x512]", 64, 512, 256},
                      {"router 1x[256x6144]", 1, 6144, 256}};
  for (const G& g : shapes) {
    // Several weight copies, rotated, so consecutive calls do not hit L2 (50 MB L2 on H200).
    const int copies = 4;
    const size_t wn = static_cast<size_t>(g.heads * g.in * g.out);
    float* wts = DeviceRandom(wn * copies, 6);
    float* xin = DeviceRandom(static_cast<size_t>(16 * g.heads * g.in), 7);
    float* yout = DeviceRandom(static_cast<size_t>(16 * g.heads * g.out), 8);
    for (int64_t rows : {1, 2, 8, 16}) {
      if (!PerHeadGemvSupported(rows, g.in)) continue;
      char what[96];
      std::snprintf(what, sizeof(what), "PerHeadGemv %s M=%lld", g.name, (long long)rows);
      Report(what, [&](int i) {
        return PerHeadGemv(xin, g.heads * g.in, g.in, wts + (i % copies) * wn, g.out * g.in,
                           g.in, yout, g.heads * g.out, g.out, rows, g.heads, g.in, g.out, false,
                           stream);
      }, o, stream, 4.0 * wn, copy_gbs);
    }
    cudaFree(wts);
    cudaFree(xin);
    cudaFree(yout);
  }
  BENCH_CHECK(cudaStreamSynchronize(stream));
  return 0;
}

}  // namespace
}  // namespace glm::kernels

int main(int argc, char** argv) { return glm::kernels::Main(argc, argv); }
