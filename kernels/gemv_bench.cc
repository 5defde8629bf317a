// Bench for gemv_narrow (the decode GEMV of narrow-weight Linears) at GLM-5's projection widths
// and M = 1, 2, 4, 8, 16 tokens. Prints per call: time, weight GB/s (weights + fp8 scales, the
// bytes that must come from HBM), the fraction of a device-to-device copy measured in the same
// run (read + write bytes / time: the HBM limit), and the baseline measured on the same shape:
// fp8: gemm_fp8_block's kAuto path (activation quantization + cuBLASLt block-scaled GEMM, or
// our split-K kernel + its reduction where cuBLASLt does not apply), fed bf16 x (the fp32->bf16
// conversion launch of the old Linear path is not included); bf16: cuBLASLt bf16 GEMM. The
// "speedup" column is baseline time / gemv time. prev_us: the same plan with the previous
// kernel's latency behaviour (GemvNarrowTuning::Previous()); st4_us / st8_us / nopf_us: one
// latency knob changed (A/B in one run).
// Timing: `calls` back-to-back calls rotating over weight copies that together exceed 256 MiB
// (weights come from HBM, not the L2), captured in one CUDA graph and replayed; time = median
// replay / calls (bench_util.h).
// Usage: gemv_bench [--quick] [--fp8-only] [--all-m]   (M = 1, 8, 16; --all-m: 1, 2, 4, 8, 16)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bench_util.h"
#include "kernels/cuda_util.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_fp8_block.h"
#include "kernels/gemv_narrow.h"

namespace glm::kernels {
namespace {

void* Alloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return p;
}

struct Proj {
  const char* name;
  int64_t n, k;
};

void BenchProjection(const BlasLtHandle& lt, const Proj& p, const std::vector<int64_t>& ms,
                     bool fp8, double d2d_gbs, int32_t* counters, int64_t num_counters,
                     cudaStream_t stream) {
  const int64_t nb = (p.n + 127) / 128, kb = (p.k + 127) / 128, kb4 = (kb + 3) / 4 * 4;
  const size_t wbytes = static_cast<size_t>(p.n) * p.k * (fp8 ? 1 : 2);
  const size_t scale_bytes = fp8 ? static_cast<size_t>(nb) * kb4 * 4 : 0;
  const int sets =
      static_cast<int>(std::max<size_t>(2, ((size_t{256} << 20) + wbytes - 1) / wbytes));
  std::vector<void*> ws(sets);
  std::vector<float*> scales(sets, nullptr);
  for (int i = 0; i < sets; ++i) {
    ws[i] = Alloc(wbytes);
    if (fp8) scales[i] = static_cast<float*>(Alloc(scale_bytes));
  }
  FillRandom(ws[0], wbytes, fp8, 7);
  if (fp8) FillConst(scales[0], nb * kb4, 1e-3f);
  for (int i = 1; i < sets; ++i) {
    BENCH_CHECK(cudaMemcpy(ws[i], ws[0], wbytes, cudaMemcpyDeviceToDevice));
    if (fp8) {
      BENCH_CHECK(cudaMemcpy(scales[i], scales[0], scale_bytes, cudaMemcpyDeviceToDevice));
    }
  }
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  float* x = static_cast<float*>(Alloc(static_cast<size_t>(max_m) * p.k * 4));
  void* xb = Alloc(static_cast<size_t>(max_m) * p.k * 2);
  float* y = static_cast<float*>(Alloc(static_cast<size_t>(max_m) * p.n * 4));
  FillRandom(xb, static_cast<size_t>(max_m) * p.k * 2, false, 9);
  FillConst(x, static_cast<size_t>(max_m) * p.k, 0.37f);
  const double bytes = static_cast<double>(wbytes + scale_bytes);
  const GemvWeight type = fp8 ? GemvWeight::kF8E4M3Block128 : GemvWeight::kBF16;
  for (int64_t m : ms) {
    const int calls = std::max(sets, 16);
    auto plan = GemvNarrowPlan::Create({m, p.n, p.k, type});
    CheckOk(plan.status(), "gemv plan");
    // A/B in the same process: the previous kernel (GemvNarrowTuning::Previous(): one staging
    // item per warp at a time, no L2 prefetch, serial reduction loads; same splits), and the
    // latency knobs one at a time: 4 / 8 staging items (prefetch auto), prefetch off.
    auto plan_prev = GemvNarrowPlan::Create({m, p.n, p.k, type}, GemvSplitReduce::kAuto, 0,
                                            GemvNarrowTuning::Previous());
    CheckOk(plan_prev.status(), "gemv plan (previous kernel)");
    auto plan_s4 = GemvNarrowPlan::Create({m, p.n, p.k, type}, GemvSplitReduce::kAuto, 0,
                                          {4, -1, 1});
    CheckOk(plan_s4.status(), "gemv plan (stage 4)");
    auto plan_s8 = GemvNarrowPlan::Create({m, p.n, p.k, type}, GemvSplitReduce::kAuto, 0,
                                          {8, -1, 1});
    CheckOk(plan_s8.status(), "gemv plan (stage 8)");
    auto plan_nopf = GemvNarrowPlan::Create({m, p.n, p.k, type}, GemvSplitReduce::kAuto, 0,
                                            {0, 0, 1});
    CheckOk(plan_nopf.status(), "gemv plan (no prefetch)");
    // K split to fill one CTA per SM (half the CTAs, twice the K range each).
    auto plan_one = GemvNarrowPlan::Create({m, p.n, p.k, type}, GemvSplitReduce::kAuto, 1);
    CheckOk(plan_one.status(), "gemv plan (one CTA per SM)");
    void* work = Alloc(std::max({plan->workspace_bytes(), plan_prev->workspace_bytes(),
                                 plan_s4->workspace_bytes(), plan_s8->workspace_bytes(),
                                 plan_nopf->workspace_bytes(), plan_one->workspace_bytes()}));
    auto time_gemv = [&](const GemvNarrowPlan& pl, bool overlap) {
      return TimeEnqueues(
            [&](int i) {
              GemvNarrowArgs a;
              a.x = x;
              a.ldx = p.k;
              a.w = ws[i % sets];
              a.ldw = p.k;
              a.w_scales = scales[i % sets];
              a.w_scale_ld = kb4;
              a.y = y;
              a.ldy = p.n;
              a.overlap_previous = overlap;
              return pl.Run(a, work, pl.workspace_bytes(), counters, num_counters, stream);
            },
            calls, 7, stream)
            .us_per_call;
    };
    const double us = time_gemv(*plan, true);
    const double us_prev = time_gemv(*plan_prev, true);
    const double us_s4 = time_gemv(*plan_s4, true);
    const double us_s8 = time_gemv(*plan_s8, true);
    const double us_nopf = time_gemv(*plan_nopf, true);
    const double us_one = time_gemv(*plan_one, true);
    cudaFree(work);
    // Baseline on the same shape.
    double base_us = 0;
    std::string base_name;
    if (fp8) {
      GemmFp8BlockShape fs;
      fs.m = m;
      fs.n = p.n;
      fs.k = p.k;
      fs.w_scale_ld = kb4;
      fs.out = DType::kF32;
      auto bp = GemmFp8BlockPlan::Create(lt, fs, GemmFp8Path::kAuto);
      CheckOk(bp.status(), "fp8 baseline plan");
      base_name = (*bp)->path() == GemmFp8Path::kCublasLt ? "quant+lt" : "quant+own";
      void* bws = Alloc((*bp)->workspace_bytes());
      base_us = TimeEnqueues(
                    [&](int i) {
                      return (*bp)->Run(xb, ws[i % sets], scales[i % sets], y, false, bws,
                                        (*bp)->workspace_bytes(), stream);
                    },
                    calls, 7, stream)
                    .us_per_call;
      cudaFree(bws);
    } else {
      GemmBf16Shape bs{m, p.n, p.k};
      bs.out = DType::kF32;
      auto bp = GemmBf16Plan::Create(lt, bs);
      CheckOk(bp.status(), "bf16 baseline plan");
      base_name = "cublaslt";
      void* bws = Alloc((*bp)->workspace_bytes());
      base_us = TimeEnqueues(
                    [&](int i) {
                      return (*bp)->Run(xb, ws[i % sets], y, false, bws, (*bp)->workspace_bytes(),
                                        stream);
                    },
                    calls, 7, stream)
                    .us_per_call;
      cudaFree(bws);
    }
    const double gbs = bytes / (us * 1e-6) / 1e9;
    const double base_gbs = bytes / (base_us * 1e-6) / 1e9;
    std::printf("%-13s %-4s %3lld %6lld %6lld %8.2f %6.0f %6.3f %8.2f %6.3f %6.2fx %7.2f %7.2f "
                "%7.2f %7.2f   %-9s %8.2f %6.3f %6.2fx  %s | one: %s\n",
                p.name, fp8 ? "fp8" : "bf16", static_cast<long long>(m),
                static_cast<long long>(p.n), static_cast<long long>(p.k), us, gbs, gbs / d2d_gbs,
                us_prev, bytes / (us_prev * 1e-6) / 1e9 / d2d_gbs, us_prev / us, us_s4, us_s8,
                us_nopf, us_one, base_name.c_str(), base_us, base_gbs / d2d_gbs, base_us / us,
                plan->tiling().DebugString().c_str(), plan_one->tiling().DebugString().c_str());
  }
  for (void* q : ws) cudaFree(q);
  for (float* q : scales) cudaFree(q);
  cudaFree(x);
  cudaFree(xb);
  cudaFree(y);
}

int Main(int argc, char** argv) {
  bool quick = false, fp8_only = false, all_m = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--fp8-only") == 0) {
      fp8_only = true;
    } else if (std::strcmp(argv[i], "--all-m") == 0) {
      all_m = true;
    } else {
      std::fprintf(stderr, "gemv_bench: unknown flag '%s' (flags: --quick, --fp8-only, --all-m)\n",
                   argv[i]);
      return 2;
    }
  }
  cudaStream_t stream = PrintDeviceAndCreateStream();
  auto lt = BlasLtHandle::Create();
  CheckOk(lt.status(), "cublasLtCreate");
  const double d2d = MeasureD2DGBps(size_t{2} << 30, stream);
  std::printf("limit: D2D copy %.0f GB/s (read+write bytes / time, eager memcpy)\n", d2d);
  constexpr int64_t kCounters = 1 << 16;
  int32_t* counters = static_cast<int32_t*>(Alloc(kCounters * 4));
  BENCH_CHECK(cudaMemset(counters, 0, kCounters * 4));
  std::printf("\n%-13s %-4s %3s %6s %6s %8s %6s %6s %8s %6s %7s %7s %7s %7s %7s   %-9s %8s %6s "
              "%7s  %s\n",
              "projection", "w", "M", "N", "K", "gemv_us", "GB/s", "of_d2d", "prev_us", "of_d2d",
              "vs_prev", "st4_us", "st8_us", "nopf_us", "one_us", "baseline", "base_us", "of_d2d",
              "speedup", "gemv tiling");
  // GLM-5 projections [out, in] (../shared/specs/glm5-architecture.md): q_a and the shared
  // expert's gate/up share 2048 x 6144.
  std::vector<Proj> projs = {{"q_a|sh_gate", 2048, 6144}, {"q_b", 16384, 2048},
                             {"kv_a", 576, 6144},         {"o_proj", 6144, 16384},
                             {"sh_down", 6144, 2048},     {"idx_wq_b", 4096, 2048},
                             {"idx_wk", 128, 6144},       {"idx_wproj", 32, 6144},
                             {"lm_head", 154880, 6144}};
  std::vector<int64_t> ms = {1, 8, 16};
  if (all_m) ms = {1, 2, 4, 8, 16};
  if (quick) {
    projs = {{"q_a|sh_gate", 2048, 6144}, {"o_proj", 6144, 16384}};
    ms = {1, 8};
  }
  for (const Proj& p : projs) BenchProjection(**lt, p, ms, true, d2d, counters, kCounters, stream);
  if (!fp8_only) {
    for (const Proj& p : projs) {
      BenchProjection(**lt, p, {1, 8, 16}, false, d2d, counters, kCounters, stream);
    }
  }
  std::printf("\ngemv_us: the default plan (kAuto), launched with overlap_previous (programmatic "
              "dependent launch: a call's weight prefetch overlaps the previous call's tail); "
              "prev_us: the previous kernel (GemvNarrowTuning::Previous(), same splits and "
              "reduction; vs_prev = prev_us / gemv_us); st4_us / st8_us: 4 / 8 staging items per "
              "warp, L2 prefetch auto; nopf_us: staging auto, no L2 prefetch; one_us: K split to "
              "fill one CTA per SM (kAuto reduction, default knobs). "
              "GB/s = (weight + fp8 scale bytes) / gemv_us; of_d2d = GB/s / D2D copy GB/s; "
              "speedup = baseline time / gemv_us.\n");
  cudaFree(counters);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace glm::kernels

int main(int argc, char** argv) { return glm::kernels::Main(argc, argv); }
