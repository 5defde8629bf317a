// Bench for the Linear GEMMs: gemm_fp8_block (both paths) and gemm_bf16 at GLM-5's projection
// widths, decode-like (M = 1, 8, 64) and prefill-like (M = 4096) token counts. Prints time per
// call, TFLOP/s, GB/s (weights + x + y bytes) and the fraction of two limits measured in the same
// run: the device-to-device copy bandwidth (read + write bytes; the limit at decode sizes) and a
// large cuBLASLt bf16 GEMM's TFLOP/s (the tensor-core limit at prefill sizes; fp8's ceiling is
// also measured on devices where cuBLASLt has 128-block scaling).
// Timing: `calls` back-to-back calls, rotating over weight copies that together exceed 256 MiB
// (so weights come from HBM, not the 50 MB L2), captured in one CUDA graph and replayed; time =
// median replay / calls. The fp8 time includes the activation quantization kernel.
// Usage: gemm_bench [--quick]   (--quick: fewer shapes, for a smoke run)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bench_util.h"
#include "kernels/cuda_util.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_fp8_block.h"
#include "kernels/quant_fp8_group.h"

namespace glm::kernels {
namespace {

// TimeEnqueues (bench_util.h) in µs per call; *graph_used says whether a CUDA graph ran.
double TimeCalls(const std::function<absl::Status(int)>& enqueue, int calls, int trials,
                 cudaStream_t stream, bool* graph_used = nullptr) {
  const BenchTiming t = TimeEnqueues(enqueue, calls, trials, stream);
  if (graph_used) *graph_used = t.graph;
  return t.us_per_call;
}

struct Ceilings {
  double d2d_gbs = 0;
  double bf16_tflops = 0;
  double fp8_tflops = 0;  // 0 when cuBLASLt has no block scaling here
};

void* Alloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return p;
}

Ceilings MeasureCeilings(const BlasLtHandle& lt, cudaStream_t stream) {
  Ceilings c;
  c.d2d_gbs = MeasureD2DGBps(size_t{2} << 30, stream);  // eager (bench_util.h)
  const int64_t s = 8192;
  const double flops = 2.0 * s * s * s;
  void* x = Alloc(s * s * 2);
  void* w = Alloc(s * s * 2);
  void* y = Alloc(s * s * 4);
  FillRandom(x, s * s * 2, false, 1);
  FillRandom(w, s * s * 2, false, 2);
  {
    auto plan = GemmBf16Plan::Create(lt, GemmBf16Shape{s, s, s});
    CheckOk(plan.status(), "bf16 ceiling plan");
    void* ws = Alloc((*plan)->workspace_bytes());
    const double us = TimeCalls(
        [&](int) {
          return (*plan)->Run(x, w, y, false, ws, (*plan)->workspace_bytes(), stream);
        },
        4, 5, stream);
    c.bf16_tflops = flops / (us * 1e-6) / 1e12;
    cudaFree(ws);
  }
  GemmFp8BlockShape fs;
  fs.m = fs.n = fs.k = s;
  auto fplan = GemmFp8BlockPlan::Create(lt, fs, GemmFp8Path::kCublasLt);
  if (fplan.ok()) {
    float* scales = static_cast<float*>(Alloc((s / 128) * (s / 128) * 4));
    FillConst(scales, (s / 128) * (s / 128), 1e-3f);
    void* ws = Alloc((*fplan)->workspace_bytes());
    FillRandom(w, s * s, true, 3);
    const double us = TimeCalls(
        [&](int) {
          return (*fplan)->Run(x, w, scales, y, false, ws, (*fplan)->workspace_bytes(), stream);
        },
        4, 5, stream);
    c.fp8_tflops = flops / (us * 1e-6) / 1e12;
    cudaFree(ws);
    cudaFree(scales);
  } else {
    std::printf("fp8 ceiling: not measured (%s)\n", std::string(fplan.status().message()).c_str());
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  return c;
}

struct Proj {
  const char* name;
  int64_t n, k;
};

void PrintRow(const char* name, int64_t m, const Proj& p, const char* path, double us,
              double bytes, const Ceilings& c, const char* note) {
  const double flops = 2.0 * m * p.n * p.k;
  const double tflops = flops / (us * 1e-6) / 1e12;
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("%-14s %5lld %6lld %6lld  %-9s %10.2f %8.1f %8.0f %7.3f %7.3f  %s\n", name,
              static_cast<long long>(m), static_cast<long long>(p.n),
              static_cast<long long>(p.k), path, us, tflops, gbs, gbs / c.d2d_gbs,
              tflops / c.bf16_tflops, note);
}

void BenchProjection(const BlasLtHandle& lt, const Proj& p, const std::vector<int64_t>& ms,
                     const Ceilings& c, cudaStream_t stream) {
  const int64_t nb = (p.n + 127) / 128, kb = (p.k + 127) / 128, kb4 = (kb + 3) / 4 * 4;
  const size_t w8 = static_cast<size_t>(p.n) * p.k, w16 = w8 * 2;
  const size_t scale_bytes = static_cast<size_t>(nb) * kb4 * 4;
  const int sets8 = static_cast<int>(std::max<size_t>(2, ((size_t{256} << 20) + w8 - 1) / w8));
  const int sets16 = static_cast<int>(std::max<size_t>(2, ((size_t{256} << 20) + w16 - 1) / w16));
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  std::vector<void*> w8s(sets8), w16s(sets16);
  std::vector<float*> scales(sets8);
  for (int i = 0; i < sets8; ++i) {
    w8s[i] = Alloc(w8);
    scales[i] = static_cast<float*>(Alloc(scale_bytes));
  }
  for (int i = 0; i < sets16; ++i) w16s[i] = Alloc(w16);
  FillRandom(w8s[0], w8, true, 7);
  FillRandom(w16s[0], w16, false, 8);
  FillConst(scales[0], nb * kb4, 1e-3f);
  for (int i = 1; i < sets8; ++i) {
    BENCH_CHECK(cudaMemcpy(w8s[i], w8s[0], w8, cudaMemcpyDeviceToDevice));
    BENCH_CHECK(cudaMemcpy(scales[i], scales[0], scale_bytes, cudaMemcpyDeviceToDevice));
  }
  for (int i = 1; i < sets16; ++i) {
    BENCH_CHECK(cudaMemcpy(w16s[i], w16s[0], w16, cudaMemcpyDeviceToDevice));
  }
  void* x = Alloc(static_cast<size_t>(max_m) * p.k * 2);
  void* y = Alloc(static_cast<size_t>(max_m) * p.n * 4);
  FillRandom(x, static_cast<size_t>(max_m) * p.k * 2, false, 9);

  for (int64_t m : ms) {
    const double act_bytes = static_cast<double>(m) * p.k * 2 + static_cast<double>(m) * p.n * 2;
    const int trials = m >= 1024 ? 3 : 7;
    // fp8: both paths, and which one kAuto picks
    GemmFp8BlockShape fs;
    fs.m = m;
    fs.n = p.n;
    fs.k = p.k;
    fs.w_scale_ld = kb4;
    auto auto_plan = GemmFp8BlockPlan::Create(lt, fs, GemmFp8Path::kAuto);
    CheckOk(auto_plan.status(), "fp8 auto plan");
    for (GemmFp8Path path : {GemmFp8Path::kCublasLt, GemmFp8Path::kOwnKernel}) {
      auto plan = GemmFp8BlockPlan::Create(lt, fs, path);
      if (!plan.ok()) continue;  // cuBLASLt not applicable (arch or M % 4)
      void* ws = Alloc((*plan)->workspace_bytes());
      const int calls = std::max(sets8, m >= 1024 ? 4 : 16);
      const double us = TimeCalls(
          [&](int i) {
            return (*plan)->Run(x, w8s[i % sets8], scales[i % sets8], y, false, ws,
                                (*plan)->workspace_bytes(), stream);
          },
          calls, trials, stream);
      cudaFree(ws);
      const std::string note =
          (path == (*auto_plan)->path() ? std::string("<- auto  ") : std::string("         ")) +
          (path == GemmFp8Path::kOwnKernel ? (*plan)->DebugString().substr(
                                                 (*plan)->DebugString().find(" mt="))
                                           : std::string());
      PrintRow(p.name, m, p, path == GemmFp8Path::kCublasLt ? "fp8-lt" : "fp8-own", us,
               static_cast<double>(w8) + scale_bytes + act_bytes, c, note.c_str());
    }
    // the activation quantization alone (part of every fp8 time above)
    {
      const int64_t groups = (p.k + 127) / 128;
      void* q = Alloc(static_cast<size_t>(m) * p.k);
      float* qs = static_cast<float*>(Alloc(static_cast<size_t>(groups) * m * 4));
      const double us = TimeCalls(
          [&](int) { return QuantizeFp8Group(x, p.k, m, p.k, q, p.k, qs, m, stream); }, 16,
          trials, stream);
      cudaFree(q);
      cudaFree(qs);
      PrintRow(p.name, m, p, "quant", us, static_cast<double>(m) * p.k * 3, c,
               "quantization of x only (TFLOP/s columns n/a)");
    }
    // bf16 through cuBLASLt on the same shape
    auto bplan = GemmBf16Plan::Create(lt, GemmBf16Shape{m, p.n, p.k});
    CheckOk(bplan.status(), "bf16 plan");
    void* ws = Alloc((*bplan)->workspace_bytes());
    const int calls = std::max(sets16, m >= 1024 ? 4 : 16);
    const double us = TimeCalls(
        [&](int i) {
          return (*bplan)->Run(x, w16s[i % sets16], y, false, ws, (*bplan)->workspace_bytes(),
                               stream);
        },
        calls, trials, stream);
    cudaFree(ws);
    PrintRow(p.name, m, p, "bf16-lt", us, static_cast<double>(w16) + act_bytes, c, "");
  }
  for (void* q : w8s) cudaFree(q);
  for (float* q : scales) cudaFree(q);
  for (void* q : w16s) cudaFree(q);
  cudaFree(x);
  cudaFree(y);
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaStream_t stream = PrintDeviceAndCreateStream();
  auto lt = BlasLtHandle::Create();
  CheckOk(lt.status(), "cublasLtCreate");
  const Ceilings c = MeasureCeilings(**lt, stream);
  std::printf("limit: D2D copy %.0f GB/s (read+write); cuBLASLt bf16 8192^3 %.0f TFLOP/s; "
              "cuBLASLt fp8 block-scaled 8192^3 %.0f TFLOP/s\n",
              c.d2d_gbs, c.bf16_tflops, c.fp8_tflops);
  std::printf("\n%-14s %5s %6s %6s  %-9s %10s %8s %8s %7s %7s  %s\n", "projection", "M", "N",
              "K", "path", "time_us", "TFLOP/s", "GB/s", "of_d2d", "of_bf16", "note");
  // GLM-5 projections (../shared/specs/glm5-architecture.md, FP8 checkpoint shapes [out, in]).
  // q_a has the routed/shared experts' gate and up shape too (2048 x 6144).
  std::vector<Proj> projs = {{"q_a|exp_gate", 2048, 6144}, {"q_b", 16384, 2048},
                             {"kv_a", 576, 6144},          {"kv_b", 28672, 512},
                             {"o_proj", 6144, 16384},      {"exp_down", 6144, 2048},
                             {"dense_gate", 12288, 6144}};
  std::vector<int64_t> ms = {1, 8, 64, 4096};
  if (quick) {
    projs = {{"q_a|exp_gate", 2048, 6144}, {"exp_down", 6144, 2048}};
    ms = {1, 64};
  }
  for (const Proj& p : projs) BenchProjection(**lt, p, ms, c, stream);
  std::printf("\nbytes = weights (+ fp8 scales) + bf16 x + bf16 y; of_d2d = GB/s / D2D GB/s; "
              "of_bf16 = TFLOP/s / bf16 ceiling.\n");
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace glm::kernels

int main(int argc, char** argv) { return glm::kernels::Main(argc, argv); }
