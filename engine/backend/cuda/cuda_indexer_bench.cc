// Bench of the DSA indexer (kernels/dsa_indexer.h, through the backend's IndexerTopK) at GLM-5
// decode shapes: 32 index heads x 128 dims, top_k 2048, rows (batch) 1 / 8 / 64 x num_keys 4K /
// 16K / 50K / 128K, fp32 and fp8 keys (random data: a pool of 256K random key rows, sequence keys
// contiguous in it). Paths forced through KernelPolicy::indexer.
//   topk-score: (fp8) the whole IndexerTopK per score kernel, select path by shape: "fp32" (the
//               CUDA-core kernel: the baseline of these rows' ratios), "tc" ({2,2,2}), "tc-wide"
//               ({4,8,0} on chunks for its resident CTAs per SM), "default" (the choice by shape:
//               tc-wide for >= 8 rows or rows of > 16K keys, else tc)
//   topk      : the whole IndexerTopK per select path, score kernel by shape: "single" (one CTA
//               per row: the baseline), "multi" (multi-CTA passes), "short" (row in shared memory
//               where it fits), "default" (the choice by shape)
//   select    : the selection alone on random scores (kernels::DsaIndexerSelect; pass-0
//               histogram included where the path takes it from the score kernel), per path;
//               "select-tie": every score equal
// Per case: µs per call (median of trials of `calls` calls captured in one CUDA graph, back to
// back) and the ratio baseline / this (> 1: faster than the baseline, measured in this process).
// Usage: cuda_indexer_bench [--rows 1,8,64] [--keys 4096,16384,50000,131072] [--trials 3]
//                           [--calls 20] [--score-only 1]
//   --score-only 1: only the fp8 "topk-score" rows.
#include "engine/backend/cuda/cuda_bench_scratch.h"
#include "engine/backend/cuda/cuda_bench_util.h"
#include "engine/backend/cuda/cuda_indexer.h"
#include "engine/backend/cuda/cuda_ops.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backend/kv_fp8_layout.h"
#include "kernels/bench_util.h"
#include "kernels/dsa_indexer.h"
#include "kernels/kernel_policy.h"

namespace glm::engine::cuda {

namespace {

using kernels::CheckOk;
using kernels::TimeEnqueues;

using DevBuf = BenchBuffer<0>;

// Uniform in [-1, 1): an LCG (fast for the 32M-float key pool).
std::vector<float> RandomFloats(uint32_t seed, size_t n) {
  std::vector<float> v(n);
  uint32_t x = seed;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = -1.f + 2.f * static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
  }
  return v;
}

using Select = kernels::IndexerPolicy::Select;
using Score = kernels::IndexerPolicy::Score;

struct SelectPath {
  Select select;
  const char* name;
};
// The first is the baseline of the ratios.
constexpr SelectPath kSelects[] = {{Select::kSingleCta, "single"},
                                   {Select::kMultiCta, "multi"},
                                   {Select::kShortRow, "short"},
                                   {Select::kByShape, "default"}};

struct ScorePath {
  Score score;
  const char* name;
};
// The first is the baseline of the ratios.
constexpr ScorePath kScores[] = {{Score::kFp32, "fp32"},
                                 {Score::kTensorCore, "tc"},
                                 {Score::kTensorCoreWide, "tc-wide"},
                                 {Score::kByShape, "default"}};

void Report(const char* op, const char* kv, int rows, int keys, const char* path, double us,
            double base_us) {
  std::printf("%-10s %-5s %5d %7d %-10s %10.2f %7.2f\n", op, kv, rows, keys, path, us,
              base_us / us);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  SweepFlags flags;
  flags.rows = {1, 8, 64};
  flags.keys = {4096, 16384, 50000, 131072};
  flags.trials = 3;
  flags.calls = 20;
  bool score_only = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (!flags.Parse(k, v) && k == "--score-only") score_only = v == "1";
  }
  const std::vector<int>& rows_list = flags.rows;
  const std::vector<int>& keys_list = flags.keys;
  const int trials = flags.trials, calls = flags.calls;
  constexpr int kHeads = 32, kDim = 128, kTopK = 2048, kBs = 64;
  constexpr int64_t kPool = 262144;  // key rows
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("cuda_indexer_bench: %s, %d SMs, %zu KiB opt-in smem per block\n", prop.name,
              prop.multiProcessorCount, prop.sharedMemPerBlockOptin / 1024);
  std::printf("%-10s %-5s %5s %7s %-10s %10s %7s\n", "op", "kv", "rows", "keys", "path", "us",
              "base/x");
  BenchScratch scratch;
  // Key pool, fp32 and fp8 (quantized on the device).
  DevBuf d_pool(kPool * kDim * 4), d_pool8(kPool * kv_fp8::IndexBytesPerToken(kDim)),
      d_all(kPool * 4);
  {
    Upload(d_pool, RandomFloats(7, kPool * kDim));
    std::vector<int32_t> all(kPool);
    for (int64_t i = 0; i < kPool; ++i) all[i] = static_cast<int32_t>(i);
    Upload(d_all, all);
    CheckOk(WriteIndexKeysFp8(MatView{d_pool.as<float>(), kPool, kDim, kDim}, d_all.as<int32_t>(),
                              Fp8IndexCache{d_pool8.as<uint8_t>(), kPool, kDim, kBs}, stream),
            "WriteIndexKeysFp8");
    BENCH_CHECK(cudaStreamSynchronize(stream));
  }
  for (const int keys : keys_list) {
    for (const int rows : rows_list) {
      const int64_t slots = int64_t{rows} * keys;
      std::vector<int32_t> table(slots), offset(rows), nkeys(rows, keys);
      for (int64_t i = 0; i < slots; ++i) table[i] = static_cast<int32_t>(i % kPool);
      for (int t = 0; t < rows; ++t) offset[t] = t * keys;
      DevBuf d_table(slots * 4), d_offset(rows * 4), d_nkeys(rows * 4),
          d_out(int64_t{rows} * kTopK * 4);
      Upload(d_table, table);
      Upload(d_offset, offset);
      Upload(d_nkeys, nkeys);
      // ---- the whole IndexerTopK
      DevBuf d_q(int64_t{rows} * kHeads * kDim * 4), d_w(int64_t{rows} * kHeads * 4);
      Upload(d_q, RandomFloats(11 + rows, size_t(rows) * kHeads * kDim));
      Upload(d_w, RandomFloats(13 + rows, size_t(rows) * kHeads));
      for (const bool fp8 : {false, true}) {
        if (score_only && !fp8) continue;
        IndexerTopKArgs a;
        a.q = HeadsView{d_q.as<float>(), rows, kHeads, kDim, kHeads * kDim, kDim};
        a.weights = MatView{d_w.as<float>(), rows, kHeads, kHeads};
        a.keys = MatView{fp8 ? nullptr : d_pool.as<float>(), kPool, kDim, kDim};
        if (fp8) a.keys_fp8 = {d_pool8.as<uint8_t>(), kPool, kDim, kBs};
        a.table = KeyTable{d_table.as<int32_t>(), d_offset.as<int32_t>(), d_nkeys.as<int32_t>(),
                           keys};
        a.weight_scale = 0.17f;
        a.score_scale = 0.088f;
        a.top_k = kTopK;
        a.out = d_out.as<int32_t>();
        auto time_policy = [&](const kernels::KernelPolicy& policy) {
          CheckOk(IndexerTopK(a, policy, scratch, stream), "IndexerTopK");  // grow scratch
          BENCH_CHECK(cudaStreamSynchronize(stream));
          return TimeEnqueues([&](int) { return IndexerTopK(a, policy, scratch, stream); }, calls,
                              trials, stream)
              .us_per_call;
        };
        if (fp8) {
          double base = 0;
          for (const ScorePath& m : kScores) {
            kernels::KernelPolicy policy;
            policy.indexer.score = m.score;
            const double us = time_policy(policy);
            if (m.score == kScores[0].score) base = us;
            Report("topk-score", "fp8", rows, keys, m.name, us, base);
          }
          if (score_only) continue;
        }
        double base = 0;
        for (const SelectPath& m : kSelects) {
          kernels::KernelPolicy policy;
          policy.indexer.select = m.select;
          const double us = time_policy(policy);
          if (m.select == kSelects[0].select) base = us;
          Report("topk", fp8 ? "fp8" : "fp32", rows, keys, m.name, us, base);
        }
      }
      if (score_only) continue;
      // ---- the selection alone, random and all-equal scores
      const int64_t ld = (keys + 3) / 4 * 4;
      DevBuf d_s(int64_t{rows} * ld * 4);
      for (const bool tie : {false, true}) {
        Upload(d_s, tie ? std::vector<float>(size_t(rows) * ld, 0.25f)
                        : RandomFloats(17 + keys, size_t(rows) * ld));
        double base = 0;
        for (const SelectPath& m : kSelects) {
          kernels::IndexerPolicy policy;
          policy.select = m.select;
          auto run = [&](int) {
            return kernels::DsaIndexerSelect(
                d_s.as<float>(), ld, rows, d_nkeys.as<int32_t>(), keys, kTopK,
                d_out.as<int32_t>(), policy, /*smem_cap_bytes=*/0,
                [&](int slot, size_t bytes) { return scratch.Get(slot, bytes); }, stream);
          };
          CheckOk(run(0), "DsaIndexerSelect");
          BENCH_CHECK(cudaStreamSynchronize(stream));
          const auto t = TimeEnqueues(run, calls, trials, stream);
          if (m.select == kSelects[0].select) base = t.us_per_call;
          Report(tie ? "select-tie" : "select", "-", rows, keys, m.name, t.us_per_call, base);
        }
      }
    }
  }
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace glm::engine::cuda

int main(int argc, char** argv) { return glm::engine::cuda::Main(argc, argv); }
