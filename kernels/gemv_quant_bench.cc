// Bench for gemv_quant (the decode GEMV on INT4 / INT8 / NVFP4 weights) at GLM-5's projection
// and expert widths and M = 1, 8, 16 tokens. Prints per call: time, bytes read (packed weight +
// scales: what must come from HBM), GB/s, the fraction of a device-to-device copy measured in
// the same run (read + write bytes / time: the HBM limit), and the baseline measured on the same
// shape in the same run: gemv_narrow on the fp8 (e4m3, 128x128 block scales) weight, the format
// the project serves today (vs_fp8 = fp8 time / quant time). Row nvfp4a: the opt-in
// FP4-activation path (gemv_quant_fp4.h) where the device and build have it (cc 12.x).
// Timing (as gemv_bench): `calls` back-to-back calls rotating over weight copies that together
// exceed 256 MiB (weights come from HBM, not the L2), captured in one CUDA graph and replayed;
// time = median replay / calls (bench_util.h).
// Usage: gemv_quant_bench [--quick]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bench_util.h"
#include "kernels/cuda_util.h"
#include "kernels/gemv_narrow.h"
#include "kernels/gemv_quant.h"

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

// Weight copies (data + scales) whose total exceeds 256 MiB.
struct WeightSets {
  std::vector<void*> data, scales;
  int sets = 0;
  WeightSets(size_t data_bytes, size_t scale_bytes, bool fp8_scales) {
    const size_t total = data_bytes + scale_bytes;
    sets = static_cast<int>(std::max<size_t>(2, ((size_t{256} << 20) + total - 1) / total));
    for (int i = 0; i < sets; ++i) {
      data.push_back(Alloc(data_bytes));
      scales.push_back(Alloc(scale_bytes));
    }
    FillRandom(data[0], data_bytes, /*fp8=*/true, 7);
    FillRandom(scales[0], scale_bytes, fp8_scales, 11);
    for (int i = 1; i < sets; ++i) {
      BENCH_CHECK(cudaMemcpy(data[i], data[0], data_bytes, cudaMemcpyDeviceToDevice));
      BENCH_CHECK(cudaMemcpy(scales[i], scales[0], scale_bytes, cudaMemcpyDeviceToDevice));
    }
  }
  ~WeightSets() {
    for (void* p : data) cudaFree(p);
    for (void* p : scales) cudaFree(p);
  }
};

double TimeFp8(const Proj& p, int64_t m, const float* x, float* y, int32_t* counters,
               int64_t num_counters, cudaStream_t stream, double* bytes) {
  const int64_t nb = (p.n + 127) / 128, kb = (p.k + 127) / 128, kb4 = (kb + 3) / 4 * 4;
  const size_t wbytes = static_cast<size_t>(p.n) * p.k;
  const size_t sbytes = static_cast<size_t>(nb) * kb4 * 4;
  WeightSets w(wbytes, sbytes, false);
  std::vector<float> ones(static_cast<size_t>(nb * kb4), 1e-3f);
  for (void* s : w.scales) {
    BENCH_CHECK(cudaMemcpy(s, ones.data(), sbytes, cudaMemcpyHostToDevice));
  }
  auto plan = GemvNarrowPlan::Create({m, p.n, p.k, GemvWeight::kF8E4M3Block128});
  CheckOk(plan.status(), "fp8 gemv plan");
  void* work = Alloc(plan->workspace_bytes());
  const double us = TimeEnqueues(
                        [&](int i) {
                          GemvNarrowArgs a;
                          a.x = x;
                          a.ldx = p.k;
                          a.w = w.data[i % w.sets];
                          a.ldw = p.k;
                          a.w_scales = static_cast<const float*>(w.scales[i % w.sets]);
                          a.w_scale_ld = kb4;
                          a.y = y;
                          a.ldy = p.n;
                          return plan->Run(a, work, plan->workspace_bytes(), counters,
                                           num_counters, stream);
                        },
                        std::max(w.sets, 16), 7, stream)
                        .us_per_call;
  cudaFree(work);
  *bytes = static_cast<double>(wbytes + sbytes);
  return us;
}

void BenchProjection(const Proj& p, const std::vector<int64_t>& ms, double d2d_gbs,
                     int32_t* counters, int64_t num_counters, cudaStream_t stream) {
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  float* x = static_cast<float*>(Alloc(static_cast<size_t>(max_m) * p.k * 4));
  float* y = static_cast<float*>(Alloc(static_cast<size_t>(max_m) * p.n * 4));
  FillConst(x, static_cast<size_t>(max_m) * p.k, 0.37f);
  for (int64_t m : ms) {
    double fp8_bytes = 0;
    const double fp8_us = TimeFp8(p, m, x, y, counters, num_counters, stream, &fp8_bytes);
    std::printf("%-16s %-6s %3lld %6lld %6lld %8.2f %8.2f %6.0f %6.3f %7s\n", p.name, "fp8",
                static_cast<long long>(m), static_cast<long long>(p.n),
                static_cast<long long>(p.k), fp8_us, fp8_bytes / 1e6,
                fp8_bytes / (fp8_us * 1e-6) / 1e9, fp8_bytes / (fp8_us * 1e-6) / 1e9 / d2d_gbs,
                "1.00x");
    // nvfp4 twice: the weight-only default and, where the device has it, the FP4-activation path
    // (LinearPolicy::Nvfp4Path::kFp4Mma, row "nvfp4a").
    for (int variant = 0; variant < 4; ++variant) {
      const QuantFormat f = variant == 0   ? QuantFormat::kInt4
                            : variant == 1 ? QuantFormat::kInt8
                                           : QuantFormat::kNvfp4;
      KernelPolicy policy;
      if (variant == 3) policy.linear.nvfp4_path = LinearPolicy::Nvfp4Path::kFp4Mma;
      QuantWeightView v;
      v.format = f;
      v.rows = p.n;
      v.cols = p.k;
      v.group_size = f == QuantFormat::kNvfp4 ? 16 : 128;  // the checkpoints' groups
      v.ld_bytes = p.k * v.bits() / 8;
      v.scale_ld = p.k / v.group_size;
      v.global_scale = 0.5f;
      const size_t dbytes = static_cast<size_t>(p.n * v.ld_bytes);
      const size_t sbytes = static_cast<size_t>(p.n * v.scale_ld) * (f == QuantFormat::kNvfp4 ? 1 : 2);
      auto plan = GemvQuantPlan::Create(m, v, policy);
      if (variant == 3 && !plan.ok()) {
        std::printf("%-16s %-6s %3lld  skipped: %s\n", p.name, "nvfp4a",
                    static_cast<long long>(m), std::string(plan.status().message()).c_str());
        continue;
      }
      CheckOk(plan.status(), "gemv_quant plan");
      WeightSets w(dbytes, sbytes, f == QuantFormat::kNvfp4);
      void* work = Alloc(plan->workspace_bytes());
      const double us = TimeEnqueues(
                            [&](int i) {
                              GemvQuantArgs a;
                              a.x = x;
                              a.ldx = p.k;
                              a.w = v;
                              a.w.data = w.data[i % w.sets];
                              a.w.scales = w.scales[i % w.sets];
                              a.y = y;
                              a.ldy = p.n;
                              return plan->Run(a, work, plan->workspace_bytes(), counters,
                                               num_counters, stream);
                            },
                            std::max(w.sets, 16), 7, stream)
                            .us_per_call;
      cudaFree(work);
      const double bytes = static_cast<double>(dbytes + sbytes);
      const double gbs = bytes / (us * 1e-6) / 1e9;
      std::printf("%-16s %-6s %3lld %6lld %6lld %8.2f %8.2f %6.0f %6.3f %6.2fx  %s\n", p.name,
                  variant == 3 ? "nvfp4a" : QuantFormatName(f), static_cast<long long>(m),
                  static_cast<long long>(p.n),
                  static_cast<long long>(p.k), us, bytes / 1e6, gbs, gbs / d2d_gbs, fp8_us / us,
                  plan->tiling().DebugString().c_str());
    }
  }
  cudaFree(x);
  cudaFree(y);
}

int Main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "gemv_quant_bench: unknown flag '%s' (flags: --quick)\n", argv[i]);
      return 2;
    }
  }
  cudaStream_t stream = PrintDeviceAndCreateStream();
  const double d2d = MeasureD2DGBps(size_t{2} << 30, stream);
  std::printf("limit: D2D copy %.0f GB/s (read+write bytes / time, eager memcpy)\n", d2d);
  constexpr int64_t kCounters = 1 << 16;
  int32_t* counters = static_cast<int32_t*>(Alloc(kCounters * 4));
  BENCH_CHECK(cudaMemset(counters, 0, kCounters * 4));
  std::printf("\n%-16s %-6s %3s %6s %6s %8s %8s %6s %6s %7s  %s\n", "projection", "w", "M", "N",
              "K", "us", "MB_read", "GB/s", "of_d2d", "vs_fp8", "tiling");
  // GLM-5 widths [out, in] (../shared/specs/glm5-architecture.md, quantized-checkpoints.md
  // §1.4): q_a, the shared and routed experts' gate/up share 2048 x 6144; their down 6144 x 2048.
  std::vector<Proj> projs = {{"q_a|exp_gate_up", 2048, 6144}, {"q_b", 16384, 2048},
                             {"kv_a", 576, 6144},             {"o_proj", 6144, 16384},
                             {"exp_down", 6144, 2048},        {"idx_wq_b", 4096, 2048}};
  std::vector<int64_t> ms = {1, 8, 16};
  if (quick) {
    projs = {{"q_a|exp_gate_up", 2048, 6144}, {"o_proj", 6144, 16384}};
    ms = {1, 16};
  }
  for (const Proj& p : projs) BenchProjection(p, ms, d2d, counters, kCounters, stream);
  std::printf("\nus: one call (graph replay over weight copies > 256 MiB); MB_read = packed "
              "weight + scale bytes (fp8: e4m3 + fp32 block scales); GB/s = MB_read / us; "
              "of_d2d = GB/s / D2D copy GB/s; vs_fp8 = fp8 gemv_narrow us / this us (same shape, "
              "same run). int4 / int8: group 128 (bf16 scales); nvfp4: 16-input e4m3 scales; "
              "nvfp4a: nvfp4 with the activations quantized to nvfp4 on the FP4 tensor cores "
              "(gemv_quant_fp4.h; cc 12.x with sm_120a / sm_121a code only).\n");
  cudaFree(counters);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace glm::kernels

int main(int argc, char** argv) { return glm::kernels::Main(argc, argv); }
