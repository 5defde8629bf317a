// Bench of the heavy CUDA ops (cuda_ops.h) at GLM-5 decode shapes: per-op time (CUDA events,
// mean over iterations after warm-up) and achieved bandwidth over the bytes the op must read.
//   attention: absorbed MLA, 64 heads, da 512 + db 64, dv 512, 2048 selected of 128K cached keys
//   indexer:   32 heads x 128 dims over 128K keys, top_k 2048
//   moe:       hidden 6144, moe_inter 2048, top-8 of --experts (default 256) experts, batch 1/8/64
// Usage: cuda_ops_bench [--experts N] [--iters N]. fp32 weights: 256 experts need ~38.7 GB.
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

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

#define BENCH_CHECK(expr)                                                              \
  do {                                                                                 \
    const cudaError_t e_ = (expr);                                                     \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                 \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

class BenchScratch final : public Scratch {
 public:
  ~BenchScratch() override {
    for (void* p : ptr_) cudaFree(p);
  }
  absl::StatusOr<void*> Get(int slot, size_t bytes) override {
    if (bytes > size_[slot]) {
      cudaFree(ptr_[slot]);
      if (cudaMalloc(&ptr_[slot], bytes) != cudaSuccess) {
        return absl::ResourceExhaustedError("bench scratch: cudaMalloc failed");
      }
      size_[slot] = bytes;
    }
    return ptr_[slot];
  }

 private:
  void* ptr_[kScratchSlots] = {};
  size_t size_[kScratchSlots] = {};
};

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
    const double ms = TimeMs([&] { return Attention(a, scratch, nullptr); }, iters);
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
    const double ms = TimeMs([&] { return IndexerTopK(a, scratch, nullptr); }, iters);
    const double bytes = 4.0 * rows * double(num_keys) * (dim + 1 + 1);  // keys, slot, score
    char name[96];
    std::snprintf(name, sizeof(name), "indexer rows=%d 32x128 keys=128K top_k=2048", rows);
    Report(name, ms, bytes);
    cudaFree(q), cudaFree(w), cudaFree(out), cudaFree(d_offs), cudaFree(d_nk);
  }
  cudaFree(keys), cudaFree(d_slots);
}

void BenchMoe(std::mt19937& rng, BenchScratch& scratch, int num_experts, int iters) {
  const int hidden = 6144, inter = 2048, top_k = 8;
  const size_t mat = size_t(hidden) * inter;
  float* weights = nullptr;  // gate | up | down per expert
  const size_t bytes_all = 3 * mat * num_experts * sizeof(float);
  if (cudaMalloc(reinterpret_cast<void**>(&weights), bytes_all) != cudaSuccess) {
    std::printf("moe: cannot allocate %.1f GB of expert weights; rerun with fewer --experts\n",
                bytes_all / 1e9);
    (void)cudaGetLastError();
    return;
  }
  BENCH_CHECK(cudaMemset(weights, 0x3c, bytes_all));  // 0.0115 per element
  std::vector<MatView> g, u, d;
  for (int e = 0; e < num_experts; ++e) {
    float* base = weights + 3 * mat * e;
    g.push_back({base, inter, hidden, hidden});
    u.push_back({base + mat, inter, hidden, hidden});
    d.push_back({base + 2 * mat, hidden, inter, inter});
  }
  const ExpertWeights ew{g.data(), u.data(), d.data(), num_experts};
  for (int tokens : {1, 8, 64}) {
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
    const double ms = TimeMs(
        [&] { return MoeExperts(xv, d_ids, w, top_k, ew, ov, scratch, nullptr); }, iters);
    const double bytes = double(used.size()) * 3 * mat * 4;
    char name[96];
    std::snprintf(name, sizeof(name), "moe batch=%d top8/%d experts (%zu used)", tokens,
                  num_experts, used.size());
    Report(name, ms, bytes);
    cudaFree(x), cudaFree(out), cudaFree(w), cudaFree(d_ids);
  }
  cudaFree(weights);
}

}  // namespace
}  // namespace glm::engine::cuda

int main(int argc, char** argv) {
  int experts = 256, iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--experts") == 0) experts = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
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
  glm::engine::cuda::BenchAttention(rng, scratch, iters * 5);
  glm::engine::cuda::BenchIndexer(rng, scratch, iters * 5);
  glm::engine::cuda::BenchMoe(rng, scratch, experts, iters);
  return 0;
}
