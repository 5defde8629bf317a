// Bench for topk_radix (and the small decode kernels): time per call, achieved GB/s and the
// fraction of the device-to-device copy bandwidth measured in the same run.
// Timing: N calls over rotating input sets (together >= 512 MiB, so reads come from HBM, not L2)
// are captured in one CUDA graph and replayed; time = median replay / N. Falls back to eager
// back-to-back launches if capture fails, and says so.
// Usage: topk_radix_bench [--quick]   (env GLM_KERNELS_SMEM_CAP_BYTES caps shared memory)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bench_util.h"
#include "absl/strings/str_cat.h"
#include "kernels/argmax.h"
#include "kernels/cuda_util.h"
#include "kernels/rmsnorm.h"
#include "kernels/silu_mul.h"
#include "kernels/topk_radix.h"

namespace glm::kernels {
namespace {

using Timing = BenchTiming;

// Median over `trials` of (time of `calls` enqueues) / calls (bench_util.h).
Timing TimeCalls(const std::function<absl::Status(int)>& enqueue, int calls, int trials,
                 cudaStream_t stream) {
  return TimeEnqueues(enqueue, calls, trials, stream);
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
double MeasureD2D(cudaStream_t stream) {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CHECK(cudaMalloc(&a, bytes));
  BENCH_CHECK(cudaMalloc(&b, bytes));
  BENCH_CHECK(cudaMemset(a, 1, bytes));
  const Timing t = TimeCalls(
      [&](int) {
        return CudaStatus(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream), "memcpy");
      },
      4, 10, stream);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (t.us_per_call * 1e-6) / 1e9;
}

void BenchTopk(double d2d_gbs, bool quick, cudaStream_t stream) {
  const int k = 2048;
  std::printf("\n== topk_radix (k=%d, fp32 scores, rotating inputs) ==\n", k);
  std::printf("%-9s %-5s %-10s %-7s %-6s %-6s %-9s %-10s %-9s %-7s %s\n", "columns", "rows",
              "time_us", "GB/s", "of_d2d", "graph", "cpg", "groups", "chunk", "mode", "smem/cand");
  for (int64_t len : {int64_t{131072}, int64_t{1048576}}) {
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{32}}) {
      // Both paths are measured; "<- auto" marks the one PlanTopkForDevice picks.
      auto auto_plan = PlanTopkForDevice(rows, len, k);
      CheckOk(auto_plan.status(), "plan");
      for (TopkPath path : {TopkPath::kCached, TopkPath::kStreaming}) {
        auto plan = PlanTopkForDevice(rows, len, k, nullptr, path);
        CheckOk(plan.status(), "plan");
        const size_t set_bytes = static_cast<size_t>(rows * len) * 4;
        const int sets = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / set_bytes));
        float* scores = nullptr;
        int32_t* out = nullptr;
        void* ws = nullptr;
        BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&scores), set_bytes * sets));
        BENCH_CHECK(
            cudaMalloc(reinterpret_cast<void**>(&out), static_cast<size_t>(rows * k) * 4 * sets));
        BENCH_CHECK(cudaMalloc(&ws, std::max<size_t>(16, plan->workspace_bytes) * sets));
        {
          // Random scores (never zeros): fill one set on the host, copy it to every set.
          std::vector<float> host(static_cast<size_t>(rows * len));
          std::mt19937 rng(1);
          std::normal_distribution<float> nd(0.0f, 1.0f);
          for (float& v : host) v = nd(rng);
          for (int s = 0; s < sets; ++s) {
            BENCH_CHECK(cudaMemcpy(reinterpret_cast<char*>(scores) + set_bytes * s, host.data(),
                                   set_bytes, cudaMemcpyHostToDevice));
          }
        }
        const size_t ws_stride = std::max<size_t>(16, plan->workspace_bytes);
        auto enqueue = [&](int i) {
          const int s = i % sets;
          return TopkRadix(
              *plan,
              reinterpret_cast<const float*>(reinterpret_cast<const char*>(scores) + set_bytes * s),
              len, nullptr, out + static_cast<size_t>(rows * k) * s,
              static_cast<char*>(ws) + ws_stride * s, plan->workspace_bytes, stream);
        };
        const int calls = std::min(sets, quick ? 20 : 100);
        const Timing t = TimeCalls(enqueue, calls, quick ? 5 : 15, stream);
        // Sanity: set 0's output holds k valid indices per row.
        std::vector<int32_t> h(static_cast<size_t>(rows * k));
        BENCH_CHECK(cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost));
        for (int32_t v : h) {
          if (v < 0 || v >= len) {
            std::fprintf(stderr, "bench output invalid: %d\n", v);
            std::exit(1);
          }
        }
        const double bytes = static_cast<double>(set_bytes) + rows * k * 4.0;
        const double gbs = bytes / (t.us_per_call * 1e-6) / 1e9;
        const bool is_auto = auto_plan->cache_in_smem == plan->cache_in_smem &&
                             auto_plan->ctas_per_group == plan->ctas_per_group &&
                             auto_plan->chunk == plan->chunk;
        std::printf("%-9lld %-5lld %-10.2f %-7.0f %-6.3f %-6s %-9d %-10lld %-9lld %-7s %d/%d%s\n",
                    static_cast<long long>(len), static_cast<long long>(rows), t.us_per_call, gbs,
                    gbs / d2d_gbs, t.graph ? "yes" : "no", plan->ctas_per_group,
                    static_cast<long long>(plan->num_groups), static_cast<long long>(plan->chunk),
                    plan->cache_in_smem ? "smem" : "stream", plan->smem_bytes, plan->candidates,
                    is_auto ? "  <- auto" : "");
        cudaFree(scores);
        cudaFree(out);
        cudaFree(ws);
      }
    }
  }
}

// The small decode kernels at GLM-5 widths (bf16): bytes moved / time.
void BenchSmallOps(double d2d_gbs, cudaStream_t stream) {
  std::printf("\n== small decode kernels (bf16, rotating inputs) ==\n");
  std::printf("%-28s %-10s %-7s %s\n", "op [shape]", "time_us", "GB/s", "of_d2d");
  const size_t pool_bytes = size_t{512} << 20;
  void* pool = nullptr;
  void* pool2 = nullptr;
  BENCH_CHECK(cudaMalloc(&pool, pool_bytes));
  BENCH_CHECK(cudaMalloc(&pool2, pool_bytes));
  BENCH_CHECK(cudaMemset(pool, 0x3f, pool_bytes));  // bf16 0x3f3f ~ 0.75: not zeros
  BENCH_CHECK(cudaMemset(pool2, 0x3f, pool_bytes));
  int32_t* ids = nullptr;
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids), 1 << 20));
  for (int64_t rows : {int64_t{1}, int64_t{64}}) {
    {
      const int64_t cols = 6144;
      const size_t set = static_cast<size_t>(rows * cols) * 2;
      const int sets = static_cast<int>(std::min<size_t>(200, pool_bytes / set - 1));
      const Timing t = TimeCalls(
          [&](int i) {
            char* x = static_cast<char*>(pool) + set * (i % sets);
            char* y = static_cast<char*>(pool2) + set * (i % sets);
            return RmsNorm(DType::kBF16, x, cols, pool, 1e-5f, y, cols, rows, cols, stream);
          },
          sets, 10, stream);
      const double gbs = (2.0 * set + cols * 2) / (t.us_per_call * 1e-6) / 1e9;
      std::printf("%-28s %-10.2f %-7.0f %.3f\n",
                  absl::StrCat("rmsnorm [", rows, ",", cols, "]").c_str(), t.us_per_call, gbs,
                  gbs / d2d_gbs);
    }
    {
      const int64_t cols = 12288;  // 2 x moe-ish intermediate; dense MLP width
      const size_t set = static_cast<size_t>(rows * cols) * 2;
      const int sets = static_cast<int>(std::min<size_t>(200, pool_bytes / (2 * set) - 1));
      const Timing t = TimeCalls(
          [&](int i) {
            char* g = static_cast<char*>(pool) + 2 * set * (i % sets);
            char* o = static_cast<char*>(pool2) + set * (i % sets);
            return SiluMul(DType::kBF16, g, cols, g + set, cols, o, cols, rows, cols, stream);
          },
          sets, 10, stream);
      const double gbs = 3.0 * set / (t.us_per_call * 1e-6) / 1e9;
      std::printf("%-28s %-10.2f %-7.0f %.3f\n",
                  absl::StrCat("silu_mul [", rows, ",", cols, "]").c_str(), t.us_per_call, gbs,
                  gbs / d2d_gbs);
    }
    {
      const int64_t vocab = 154880;
      const size_t set = static_cast<size_t>(rows * vocab) * 4;
      const int sets = static_cast<int>(std::min<size_t>(200, pool_bytes / set - 1));
      const Timing t = TimeCalls(
          [&](int i) {
            char* x = static_cast<char*>(pool) + set * (i % sets);
            return ArgmaxRows(DType::kF32, x, vocab, rows, vocab, ids, stream);
          },
          sets, 10, stream);
      const double gbs = set / (t.us_per_call * 1e-6) / 1e9;
      std::printf("%-28s %-10.2f %-7.0f %.3f\n",
                  absl::StrCat("argmax f32 [", rows, ",", vocab, "]").c_str(), t.us_per_call, gbs,
                  gbs / d2d_gbs);
    }
  }
  cudaFree(pool);
  cudaFree(pool2);
  cudaFree(ids);
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("topk_radix_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  auto limits = QueryDeviceLimits();
  CheckOk(limits.status(), "limits");
  std::printf("device: %s, sm_%d%d, %s\n", prop.name, prop.major, prop.minor,
              limits->DebugString().c_str());
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double d2d = MeasureD2D(stream);
  std::printf("measured D2D copy bandwidth (read+write): %.0f GB/s\n", d2d);
  BenchTopk(d2d, quick, stream);
  BenchSmallOps(d2d, stream);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace glm::kernels

int main(int argc, char** argv) { return glm::kernels::Main(argc, argv); }
