// Bench of the heavy CUDA ops (cuda_ops.h) at GLM-5 decode shapes: per-op time (CUDA events,
// mean over iterations after warm-up) and achieved bandwidth over the bytes the op must read.
//   attention: absorbed MLA, 64 heads, da 512 + db 64, dv 512, 2048 selected of 128K cached keys
//   indexer:   32 heads x 128 dims over 128K keys, top_k 2048
//   moe:       hidden 6144, moe_inter 2048, top-8 of --experts (default 256) experts, batch
//              1/8/16/32/64/128/512,
//              fp8 and bf16 weights, each MoeExperts path, against a D2D copy of the same run
// Usage: cuda_ops_bench [--experts N] [--iters N] [--only moe|route]. 256 bf16 experts need ~19.3 GB.
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_bench_scratch.h"
#include "engine/backend/cuda/cuda_indexer.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "kernels/moe.h"
#include "kernels/bench_util.h"
#include "kernels/moe_route.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace glm::engine::cuda {
namespace {

using kernels::MeasureD2DGBps;  // BENCH_CHECK, the D2D baseline: kernels/bench_util.h

template <typename T>
T* DeviceCopy(const std::vector<T>& v) {
  T* p = nullptr;
  const size_t bytes = std::max<size_t>(v.size(), 1) * sizeof(T);
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), bytes));
  BENCH_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

std::vector<float> Random(std::mt19937& rng, size_t n, float scale = 1.f) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Mean milliseconds per call of `op` over `iters` calls after 2 warm-up calls.
double TimeMs(const std::function<absl::Status()>& op, int iters) {
  for (int i = 0; i < 2; ++i) {
    const absl::Status st = op();
    if (!st.ok()) {
      std::fprintf(stderr, "op failed: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  BENCH_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) (void)op();
  BENCH_CHECK(cudaEventRecord(b));
  BENCH_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  return ms / iters;
}

void Report(const char* name, double ms, double bytes) {
  std::printf("%-44s %9.1f us  %8.1f GB/s\n", name, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
}

void BenchAttention(std::mt19937& rng, BenchScratch& scratch, int iters) {
  const int heads = 64, da = 512, db = 64, dq = da + db, selected = 2048;
  const int num_keys = 131072;
  float* latent = DeviceCopy(Random(rng, size_t(num_keys) * dq));  // [keys, 576]
  std::vector<int32_t> slots(num_keys);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  int32_t* d_slots = DeviceCopy(slots);
  for (int rows : {1, 8}) {
    std::vector<int32_t> offs(rows, 0), nk(rows, num_keys), idx;
    for (int t = 0; t < rows; ++t) {
      std::vector<int32_t> perm(num_keys);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      idx.insert(idx.end(), perm.begin(), perm.begin() + selected);
    }
    float* q = DeviceCopy(Random(rng, size_t(rows) * heads * dq));
    float* out = nullptr;
    BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), size_t(rows) * heads * da * 4));
    int32_t *d_offs = DeviceCopy(offs), *d_nk = DeviceCopy(nk), *d_idx = DeviceCopy(idx);
    AttentionArgs a;
    const HeadsView qv{q, rows, heads, dq, int64_t{heads} * dq, dq};
    const HeadsView lat{latent, num_keys, heads, dq, dq, 0};
    a.q_a = qv.Dims(0, da);
    a.q_b = qv.Dims(da, db);
    a.k_a = lat.Dims(0, da);
    a.k_b = lat.Dims(da, db);
    a.v = lat.Dims(0, da);
    a.table = {d_slots, d_offs, d_nk, num_keys};
    a.indices = d_idx;
    a.index_width = selected;
    a.scale = 1.0f / 24.0f;
    a.out = HeadsView{out, rows, heads, da, int64_t{heads} * da, da};
    const double ms =
        TimeMs([&] { return Attention(a, kernels::KernelPolicy(), scratch, nullptr); }, iters);
    // Each selected latent row (576 floats) once per query row, queries and outputs.
    const double bytes = 4.0 * rows * (double(selected) * dq + heads * dq + heads * da);
    char name[96];
    std::snprintf(name, sizeof(name), "attention absorbed rows=%d h=64 sel=2048", rows);
    Report(name, ms, bytes);
    cudaFree(q), cudaFree(out), cudaFree(d_offs), cudaFree(d_nk), cudaFree(d_idx);
  }
  cudaFree(latent), cudaFree(d_slots);
}

void BenchIndexer(std::mt19937& rng, BenchScratch& scratch, int iters) {
  const int heads = 32, dim = 128, top_k = 2048, num_keys = 131072;
  float* keys = DeviceCopy(Random(rng, size_t(num_keys) * dim));
  std::vector<int32_t> slots(num_keys);
  std::iota(slots.begin(), slots.end(), 0);
  int32_t* d_slots = DeviceCopy(slots);
  for (int rows : {1, 4}) {
    std::vector<int32_t> offs(rows, 0), nk(rows, num_keys);
    float* q = DeviceCopy(Random(rng, size_t(rows) * heads * dim));
    float* w = DeviceCopy(Random(rng, size_t(rows) * heads));
    int32_t* out = nullptr;
    BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), size_t(rows) * top_k * 4));
    int32_t *d_offs = DeviceCopy(offs), *d_nk = DeviceCopy(nk);
    IndexerTopKArgs a;
    a.q = HeadsView{q, rows, heads, dim, int64_t{heads} * dim, dim};
    a.weights = MatView{w, rows, heads, heads};
    a.keys = MatView{keys, num_keys, dim, dim};
    a.table = {d_slots, d_offs, d_nk, num_keys};
    a.weight_scale = 1.0f / std::sqrt(32.0f);
    a.score_scale = 1.0f / std::sqrt(128.0f);
    a.top_k = top_k;
    a.out = out;
    const double ms =
        TimeMs([&] { return IndexerTopK(a, kernels::KernelPolicy{}, scratch, nullptr); }, iters);
    const double bytes = 4.0 * rows * double(num_keys) * (dim + 1 + 1);  // keys, slot, score
    char name[96];
    std::snprintf(name, sizeof(name), "indexer rows=%d 32x128 keys=128K top_k=2048", rows);
    Report(name, ms, bytes);
    cudaFree(q), cudaFree(w), cudaFree(out), cudaFree(d_offs), cudaFree(d_nk);
  }
  cudaFree(keys), cudaFree(d_slots);
}

// Routed experts at GLM-5 widths with fp8 (128x128 block scales) and bf16 weights: per batch
// (1 / 8 / 16 / 32 / 64 / 128 / 512 tokens, top-8 of `num_experts`), every MoeExperts path that
// applies (kernels::MoePolicy: the default by shape, then each path forced), us per call, GB/s of the distinct experts' weight bytes (+ scales) and that as a fraction of a
// D2D copy measured in the same run.
void BenchMoe(std::mt19937& rng, BenchScratch& scratch, int num_experts, int iters) {
  const int hidden = 6144, inter = 2048, top_k = 8;
  const size_t mat = size_t(hidden) * inter;
  const double d2d = MeasureD2DGBps(size_t{1} << 30);  // eager, default stream
  std::printf("d2d copy 1 GiB: %.1f GB/s (read + write)\n", d2d);
  // GLM_BENCH_MOE_QUICK=1: fp8 only, batches 8..128, the auto / mma / grouped paths.
  const bool quick = std::getenv("GLM_BENCH_MOE_QUICK") != nullptr;
  for (WeightDType dtype : {WeightDType::kF8E4M3Block128, WeightDType::kBF16}) {
    const bool fp8 = dtype == WeightDType::kF8E4M3Block128;
    if (quick && !fp8) break;
    const size_t eb = fp8 ? 1 : 2;
    const size_t per_expert = 3 * mat * eb;
    const size_t scale_floats = 3 * size_t(hidden / 128) * (inter / 128);  // per expert
    char* weights = nullptr;  // gate | up | down per expert
    float* scales = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&weights), per_expert * num_experts) != cudaSuccess ||
        cudaMalloc(reinterpret_cast<void**>(&scales),
                   std::max<size_t>(1, scale_floats * num_experts) * 4) != cudaSuccess) {
      std::printf("moe: cannot allocate %.1f GB of expert weights; rerun with fewer --experts\n",
                  per_expert * num_experts / 1e9);
      (void)cudaGetLastError();
      cudaFree(weights);
      return;
    }
    BENCH_CHECK(cudaMemset(weights, 0x3c, per_expert * num_experts));  // fp8 1.5, bf16 0.0115
    BENCH_CHECK(cudaMemset(scales, 0x3c, scale_floats * num_experts * 4));  // 0.0115
    std::vector<MatView> g, u, d;
    for (int e = 0; e < num_experts; ++e) {
      char* base = weights + per_expert * e;
      float* sb = scales + scale_floats * e;
      MatView gv{reinterpret_cast<float*>(base), inter, hidden, hidden};
      MatView uv{reinterpret_cast<float*>(base + mat * eb), inter, hidden, hidden};
      MatView dv{reinterpret_cast<float*>(base + 2 * mat * eb), hidden, inter, inter};
      gv.dtype = uv.dtype = dv.dtype = dtype;
      if (fp8) {
        const int64_t gsl = hidden / 128, dsl = inter / 128;
        gv.scales = sb, gv.scale_ld = gsl;
        uv.scales = sb + (inter / 128) * gsl, uv.scale_ld = gsl;
        dv.scales = sb + 2 * (inter / 128) * gsl, dv.scale_ld = dsl;
      }
      g.push_back(gv), u.push_back(uv), d.push_back(dv);
    }
    const ExpertWeights ew{g.data(), u.data(), d.data(), num_experts};
    for (int tokens : {1, 8, 16, 32, 64, 128, 512}) {
      if (quick && (tokens < 8 || tokens > 128)) continue;
      std::vector<int32_t> ids;
      std::set<int32_t> used;
      for (int t = 0; t < tokens; ++t) {
        std::vector<int32_t> perm(num_experts);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        ids.insert(ids.end(), perm.begin(), perm.begin() + top_k);
        used.insert(perm.begin(), perm.begin() + top_k);
      }
      float* x = DeviceCopy(Random(rng, size_t(tokens) * hidden));
      float* out = DeviceCopy(std::vector<float>(size_t(tokens) * hidden, 0.f));
      float* w = DeviceCopy(Random(rng, size_t(tokens) * top_k));
      int32_t* d_ids = DeviceCopy(ids);
      const MatView xv{x, tokens, hidden, hidden}, ov{out, tokens, hidden, hidden};
      const double bytes = double(used.size()) * (per_expert + (fp8 ? scale_floats * 4 : 0));
      // auto: the default path of the shape (kernels/moe.h); the others forced through the
      // policy where they apply (decode <= 64 pairs, grouped / mma <= 4096, mma fp8 only).
      using Path = kernels::MoePolicy::Path;
      const struct {
        const char* name;
        Path path;
      } paths[] = {{"auto", Path::kAuto},       {"decode", Path::kDecode}, {"mma", Path::kMma},
                   {"grouped", Path::kGrouped}, {"tiled", Path::kTiled}};
      const int64_t pairs = int64_t{tokens} * top_k;
      for (const auto& p : paths) {
        if (p.path == Path::kDecode && pairs > kernels::kMoeDecodeMaxPairs) continue;
        if ((p.path == Path::kGrouped || p.path == Path::kMma) &&
            pairs > kernels::kMoeGroupedMaxPairs) {
          continue;
        }
        if (!fp8 && p.path == Path::kMma) continue;
        if (quick && p.path != Path::kAuto && p.path != Path::kMma && p.path != Path::kGrouped) {
          continue;
        }
        kernels::KernelPolicy policy;
        policy.moe.path = p.path;
        kernels::MoeRunInfo ran;
        const double ms = TimeMs(
            [&] {
              return MoeExperts(xv, d_ids, w, top_k, ew, ov, scratch, nullptr, policy, &ran);
            },
            iters);
        const double gbps = bytes / (ms * 1e-3) / 1e9;
        const char* ran_name = ran.path == Path::kDecode    ? "decode"
                               : ran.path == Path::kGrouped ? "grouped"
                               : ran.path == Path::kMma     ? "mma"
                                                            : "tiled";
        std::printf(
            "moe %s batch=%-2d top8/%d (%3zu used) %-16s %9.1f us %8.1f GB/s  %.2f of d2d [%s]\n",
            fp8 ? "fp8 " : "bf16", tokens, num_experts, used.size(), p.name, ms * 1e3, gbps,
            gbps / d2d, ran_name);
      }
      cudaFree(x), cudaFree(out), cudaFree(w), cudaFree(d_ids);
    }
    cudaFree(weights), cudaFree(scales);
  }
}

// MoeRoute (kernels/moe_route.h) at GLM-5's router: 256 experts, top-8, bias, renormalize,
// 1 / 8 / 64 rows; us per launch from a CUDA graph of 50 back-to-back launches
// (launch gaps included, as in a decode graph).
void BenchMoeRoute(std::mt19937& rng, int iters) {
  const int experts = 256, top_k = 8, kLaunches = 50;
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* bias = DeviceCopy(Random(rng, experts, 0.1f));
  for (int rows : {1, 8, 64}) {
    float* logits = DeviceCopy(Random(rng, size_t(rows) * experts, 3.0f));
    int32_t* ids = nullptr;
    float* w = nullptr;
    BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids), size_t(rows) * top_k * 4));
    BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&w), size_t(rows) * top_k * 4));
    {
      auto route = [&] {
        return kernels::MoeRoute(logits, experts, bias, rows, experts, 1, 1, top_k, true, 2.5f, -1,
                                 ids, w, stream);
      };
      if (!route().ok()) std::exit(1);  // pointer checks outside the capture
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kLaunches; ++i) (void)route();
      BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
      BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      cudaEvent_t a, b;
      BENCH_CHECK(cudaEventCreate(&a));
      BENCH_CHECK(cudaEventCreate(&b));
      BENCH_CHECK(cudaGraphLaunch(exec, stream));
      BENCH_CHECK(cudaEventRecord(a, stream));
      for (int i = 0; i < iters; ++i) BENCH_CHECK(cudaGraphLaunch(exec, stream));
      BENCH_CHECK(cudaEventRecord(b, stream));
      BENCH_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
      std::printf("moe_route rows=%-2d 256 experts top8 %6.2f us per launch (graph)\n", rows,
                  ms * 1e3 / (iters * kLaunches));
      cudaEventDestroy(a), cudaEventDestroy(b);
      cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    }
    cudaFree(logits), cudaFree(ids), cudaFree(w);
  }
  cudaFree(bias);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace glm::engine::cuda

int main(int argc, char** argv) {
  int experts = 256, iters = 20;
  std::string only;  // --only moe: that section alone
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--experts") == 0) experts = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::mt19937 rng(7);
  glm::engine::cuda::BenchScratch scratch;
  if (only.empty()) {
    glm::engine::cuda::BenchAttention(rng, scratch, iters * 5);
    glm::engine::cuda::BenchIndexer(rng, scratch, iters * 5);
  }
  if (only.empty() || only == "moe" || only == "route") glm::engine::cuda::BenchMoeRoute(rng, iters);
  if (only.empty() || only == "moe") glm::engine::cuda::BenchMoe(rng, scratch, experts, iters);
  return 0;
}
