// Bench of the DSA indexer's top-k paths (cuda_ops_indexer.cu) at GLM-5 decode shapes: 32 index
// heads x 128 dims, top_k 2048, rows (batch) 1 / 8 / 64 x num_keys 4K / 16K / 50K / 128K, fp32 and
// fp8 keys (random data: a pool of 256K random key rows, sequence keys contiguous in it).
//   topk   : the whole IndexerTopK (score kernel + selection) per path
//   topk dflt-ctaN: the default path with the score kernel's key chunks sized for N CTAs per SM
//            (by shape: 2, or the wide variant's resident CTAs per SM)
//   topk tc-aheadN: (fp8) the {3,2} tensor-core score kernel (score mode 2) at look-ahead N
//            (SetIndexerScoreAheadForBench; its default 2 is the "topk-score tc" row)
//   select : the selection alone on random scores (IndexerSelectForTest; pass-0 histogram
//            included where the path takes it from the score kernel), per path, and the
//            short-row select at 256 / 512 / 1024 threads; "select-tie": every score equal
// Paths (SetIndexerPathForBench, SetIndexerOutputForBench): "prev" = the choice by shape before
// the short-row select, with the multi-CTA passes' single-CTA ordered output (the baseline every
// ratio is against, measured in this process), "legacy" = single-CTA passes, "multi-1cta" =
// multi-CTA passes with the single-CTA output, "multi" = multi-CTA passes with the parallel output
// (IndexerOutputKernel), "short" = the row in shared memory, "default" = the choice now.
// Score kernels (fp8 keys; SetIndexerScorePathForBench), rows "topk-score", select path by
// shape: "fp32" = the CUDA-core fp32 kernel (the baseline of these rows' ratios, measured in this
// process), "tc" = the tensor-core kernel (score mode 2), "tc-v3" / "tc-v4" = its variants
// (modes 3 / 4: kTcVariants in cuda_ops_indexer.cu), "default" = the choice by shape (tc-v3 on
// chunks for its resident CTAs per SM, at most 4, for >= 8 rows or rows of > 16K keys); a "/c4"
// suffix: key chunks sized for 4 CTAs per SM instead of 2.
// Per case: µs per call (median of trials of `calls` calls captured in one CUDA graph, back to
// back) and the ratio prev / this (> 1: faster than before).
// Usage: cuda_indexer_bench [--rows 1,8,64] [--keys 4096,16384,50000,131072] [--trials 3]
//                           [--calls 20] [--score-only 1]
//   --score-only 1: only the fp8 "topk-score" rows.
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_bench_scratch.h"
#include "engine/backend/cuda/cuda_bench_util.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_ops_hooks.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backend/kv_fp8_layout.h"
#include "kernels/bench_util.h"

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

struct Mode {
  int mode, threads;
  const char* name;
  int output = 0;  // SetIndexerOutputForBench: 0 the parallel ordered output, 1 single-CTA
};
constexpr Mode kModes[] = {{4, 0, "prev", 1}, {1, 0, "legacy"}, {2, 0, "multi-1cta", 1},
                           {2, 0, "multi"},   {3, 0, "short"},  {0, 0, "default"}};
constexpr Mode kShortThreads[] = {{3, 256, "short256"}, {3, 512, "short512"},
                                  {3, 1024, "short1024"}};

void SetMode(const Mode& m) {
  SetIndexerPathForBench(m.mode);
  SetIndexerOutputForBench(m.output);
  SetIndexerShortThreadsForBench(m.threads);
}

void Report(const char* op, const char* kv, int rows, int keys, const char* path, double us,
            double prev_us) {
  std::printf("%-10s %-5s %5d %7d %-10s %10.2f %7.2f\n", op, kv, rows, keys, path, us,
              prev_us / us);
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
              "prev/x");
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
        double prev = 0;
        if (fp8) {
          // Score kernels, select path by shape.
          struct ScoreMode {
            int mode;
            const char* name;
          };
          constexpr ScoreMode kScoreModes[] = {{1, "fp32"}, {2, "tc"}, {3, "tc-v3"},
                                               {4, "tc-v4"}, {-1, "default"}};
          double base = 0;
          SetIndexerPathForBench(0);
          for (const int ctas : {0, 4}) {  // chunks by shape (2 or the wide variant's) / for 4
            SetIndexerScoreCtasPerSmForBench(ctas);
            for (const ScoreMode& m : kScoreModes) {
              if (ctas != 0 && m.mode == 1) continue;
              SetIndexerScorePathForBench(m.mode);
              CheckOk(IndexerTopK(a, scratch, stream), "IndexerTopK");
              BENCH_CHECK(cudaStreamSynchronize(stream));
              const auto t = TimeEnqueues([&](int) { return IndexerTopK(a, scratch, stream); },
                                          calls, trials, stream);
              if (m.mode == 1) base = t.us_per_call;
              const std::string name = ctas == 0 ? m.name : std::string(m.name) + "/c4";
              Report("topk-score", "fp8", rows, keys, name.c_str(), t.us_per_call, base);
            }
          }
          SetIndexerScoreCtasPerSmForBench(0);
          SetIndexerScorePathForBench(-1);
          SetIndexerPathForBench(-1);
          if (score_only) continue;
        }
        for (const Mode& m : kModes) {
          SetMode(m);
          CheckOk(IndexerTopK(a, scratch, stream), "IndexerTopK");  // grow scratch
          BENCH_CHECK(cudaStreamSynchronize(stream));
          const auto t = TimeEnqueues([&](int) { return IndexerTopK(a, scratch, stream); },
                                      calls, trials, stream);
          if (m.mode == 4) prev = t.us_per_call;
          Report("topk", fp8 ? "fp8" : "fp32", rows, keys, m.name, t.us_per_call, prev);
        }
        // Score-kernel chunk sizing (default path): 1 / 4 / 8 CTAs per SM (by shape: 2, or the
        // wide variant's resident CTAs).
        SetMode({0, 0, ""});
        for (const int ctas : {1, 4, 8}) {
          SetIndexerScoreCtasPerSmForBench(ctas);
          CheckOk(IndexerTopK(a, scratch, stream), "IndexerTopK");
          BENCH_CHECK(cudaStreamSynchronize(stream));
          const auto t = TimeEnqueues([&](int) { return IndexerTopK(a, scratch, stream); },
                                      calls, trials, stream);
          const std::string name = "dflt-cta" + std::to_string(ctas);
          Report("topk", fp8 ? "fp8" : "fp32", rows, keys, name.c_str(), t.us_per_call, prev);
        }
        SetIndexerScoreCtasPerSmForBench(0);
        // The {3,2} tensor-core score kernel (score mode 2) at look-ahead 0 and 1 (its default,
        // 2, is the "topk-score tc" row).
        for (const int ahead : fp8 ? std::vector<int>{0, 1} : std::vector<int>{}) {
          SetIndexerScorePathForBench(2);
          SetIndexerScoreAheadForBench(ahead);
          CheckOk(IndexerTopK(a, scratch, stream), "IndexerTopK");
          BENCH_CHECK(cudaStreamSynchronize(stream));
          const auto t = TimeEnqueues([&](int) { return IndexerTopK(a, scratch, stream); }, calls,
                                      trials, stream);
          const std::string name = "tc-ahead" + std::to_string(ahead);
          Report("topk", "fp8", rows, keys, name.c_str(), t.us_per_call, prev);
        }
        SetIndexerScoreAheadForBench(-1);
        SetIndexerScorePathForBench(-1);
        SetMode({-1, 0, ""});
      }
      if (score_only) continue;
      // ---- the selection alone, random and all-equal scores
      const int64_t ld = (keys + 3) / 4 * 4;
      DevBuf d_s(int64_t{rows} * ld * 4);
      for (const bool tie : {false, true}) {
        Upload(d_s, tie ? std::vector<float>(size_t(rows) * ld, 0.25f)
                        : RandomFloats(17 + keys, size_t(rows) * ld));
        double prev = 0;
        std::vector<Mode> modes(std::begin(kModes), std::end(kModes));
        if (!tie) modes.insert(modes.end(), std::begin(kShortThreads), std::end(kShortThreads));
        for (const Mode& m : modes) {
          SetMode(m);
          auto run = [&](int) {
            return IndexerSelectForTest(d_s.as<float>(), ld, rows, d_nkeys.as<int32_t>(), keys,
                                        kTopK, d_out.as<int32_t>(), scratch, stream);
          };
          CheckOk(run(0), "IndexerSelectForTest");
          BENCH_CHECK(cudaStreamSynchronize(stream));
          const auto t = TimeEnqueues(run, calls, trials, stream);
          if (m.mode == 4) prev = t.us_per_call;
          Report(tie ? "select-tie" : "select", "-", rows, keys, m.name, t.us_per_call, prev);
        }
        SetMode({-1, 0, ""});
      }
    }
  }
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace glm::engine::cuda

int main(int argc, char** argv) { return glm::engine::cuda::Main(argc, argv); }
