// Bench of the KV-reading decode ops with fp32 and fp8 KV caches (engine/backend/kv_fp8_layout.h)
// at GLM-5 shapes, batch 1 / 8 / 64 and 4K / 128K cached keys per sequence:
//   indexer:   IndexerTopK, 32 heads x 128 dims over every cached key, top_k 2048
//   attention: absorbed MLA (64 heads, 512 + 64 dims, dv 512) over 2048 selected keys
//   write:     WriteLatentFp8 / WriteIndexKeysFp8 of the step's new rows
// Per case: µs per call (median of trials of 20 calls captured in one CUDA graph: back to back,
// so small working sets stay in L2; the cache is memset, so every score ties: the radix select's
// worst case), the bytes the op must read (KV rows in the cache's layout,
// every sequence its own keys), GB/s and the fraction of a device-to-device copy measured here.
// Rows "index-plain": the indexer's plain paths forced (fp32 score kernel, single-CTA select;
// KernelPolicy::indexer); "index-multi": the multi-CTA radix passes forced; "attn-split" / "attn-staged" / "attn-tc": the split,
// staged and tensor-core (fp8 latent) attention kernels forced (KernelPolicy::attention), with
// the tensor core's speedup over the staged kernel; "attn-tc16" / "attn-tc32": it with 16 / 32
// heads per CTA; "attention" / "indexer": the default choice by shape; all in one process.
// Usage: cuda_kv_bench [--rows 1,8,64] [--keys 4096,131072] [--trials 5] [--calls 20]
// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_bench_scratch.h"
#include "engine/backend/cuda/cuda_bench_util.h"
#include "engine/backend/cuda/cuda_indexer.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_ops_hooks.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/kv_fp8_layout.h"
#include "kernels/bench_util.h"

namespace glm::engine::cuda {

namespace {

using kernels::CheckOk;
using kernels::MeasureD2DGBps;
using kernels::TimeEnqueues;

using DevBuf = BenchBuffer<0x11>;  // 0x11 bytes: small finite values

void Report(const char* op, const char* kv, int rows, int keys, double us, double bytes,
            double d2d) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("%-10s %-5s %5d %7d %10.2f %10.3f %9.0f %7.3f\n", op, kv, rows, keys, us,
              bytes / 1e6, gbs, gbs / d2d);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  SweepFlags flags;
  flags.rows = {1, 8, 64};
  flags.keys = {4096, 131072};
  flags.trials = 5;
  flags.calls = 20;
  for (int i = 1; i + 1 < argc; i += 2) flags.Parse(argv[i], argv[i + 1]);
  const std::vector<int>& rows_list = flags.rows;
  const std::vector<int>& keys_list = flags.keys;
  const int trials = flags.trials, kCalls = flags.calls;
  constexpr int kHeads = 64, kKvr = 512, kRope = 64, kIHeads = 32, kIDim = 128, kTopK = 2048;
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double d2d = MeasureD2DGBps(size_t{1} << 30, stream);  // eager (bench_util.h)
  std::printf("cuda_kv_bench: %s, %d SMs; D2D copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, d2d);
  std::printf("%-10s %-5s %5s %7s %10s %10s %9s %7s\n", "op", "kv", "rows", "keys", "us",
              "MB read", "GB/s", "of D2D");
  BenchScratch scratch;
  std::mt19937 rng(5);
  for (const int keys : keys_list) {
    for (const int rows : rows_list) {
      const int64_t slots = int64_t{rows} * keys;  // every sequence its own keys
      std::vector<int32_t> table(slots), offset(rows), nkeys(rows, keys);
      for (int64_t i = 0; i < slots; ++i) table[i] = static_cast<int32_t>(i);
      for (int t = 0; t < rows; ++t) offset[t] = t * keys;
      DevBuf d_table(slots * 4), d_offset(rows * 4), d_nkeys(rows * 4);
      Upload(d_table, table);
      Upload(d_offset, offset);
      Upload(d_nkeys, nkeys);
      const KeyTable kt{d_table.as<int32_t>(), d_offset.as<int32_t>(), d_nkeys.as<int32_t>(),
                        keys};
      // ---- indexer
      {
        std::vector<float> q(int64_t{rows} * kIHeads * kIDim), w(int64_t{rows} * kIHeads);
        std::normal_distribution<float> nd;
        for (float& v : q) v = nd(rng);
        for (float& v : w) v = nd(rng);
        DevBuf d_q(q.size() * 4), d_w(w.size() * 4), d_out(int64_t{rows} * kTopK * 4);
        Upload(d_q, q);
        Upload(d_w, w);
        for (const bool fp8 : {false, true}) {
          const int64_t key_bytes = fp8 ? kv_fp8::IndexBytesPerToken(kIDim) : kIDim * 4;
          DevBuf d_keys(slots * key_bytes);
          IndexerTopKArgs a;
          a.q = HeadsView{d_q.as<float>(), rows, kIHeads, kIDim, kIHeads * kIDim, kIDim};
          a.weights = MatView{d_w.as<float>(), rows, kIHeads, kIHeads};
          a.keys = MatView{fp8 ? nullptr : d_keys.as<float>(), slots, kIDim, kIDim};
          if (fp8) a.keys_fp8 = {d_keys.as<uint8_t>(), slots, kIDim, 64};
          a.table = kt;
          a.weight_scale = 0.17f;
          a.score_scale = 0.088f;
          a.top_k = kTopK;
          a.out = d_out.as<int32_t>();
          using Select = kernels::IndexerPolicy::Select;
          using Score = kernels::IndexerPolicy::Score;
          struct Row {
            const char* name;
            Select select;
            Score score;
          };
          for (const Row& row : {Row{"index-plain", Select::kSingleCta, Score::kFp32},
                                 Row{"index-multi", Select::kMultiCta, Score::kByShape},
                                 Row{"indexer", Select::kByShape, Score::kByShape}}) {
            kernels::KernelPolicy policy;
            policy.indexer.select = row.select;
            policy.indexer.score = row.score;
            CheckOk(IndexerTopK(a, policy, scratch, stream), "IndexerTopK");  // grow scratch
            BENCH_CHECK(cudaStreamSynchronize(stream));
            const auto t = TimeEnqueues(
                [&](int) { return IndexerTopK(a, policy, scratch, stream); }, kCalls, trials,
                stream);
            Report(row.name, fp8 ? "fp8" : "fp32", rows, keys, t.us_per_call,
                   static_cast<double>(slots) * key_bytes, d2d);
          }
        }
      }
      // ---- attention (absorbed, 2048 selected of `keys`)
      {
        const int sel = std::min(kTopK, keys);
        std::vector<int32_t> idx(int64_t{rows} * kTopK, -1);
        for (int t = 0; t < rows; ++t) {
          std::vector<int32_t> pos(keys);
          for (int i = 0; i < keys; ++i) pos[i] = i;
          std::shuffle(pos.begin(), pos.end(), rng);
          std::sort(pos.begin(), pos.begin() + sel);
          std::copy_n(pos.begin(), sel, idx.begin() + int64_t{t} * kTopK);
        }
        DevBuf d_idx(idx.size() * 4), d_qa(int64_t{rows} * kHeads * kKvr * 4),
            d_qb(int64_t{rows} * kHeads * kRope * 4), d_o(int64_t{rows} * kHeads * kKvr * 4);
        Upload(d_idx, idx);
        for (const bool fp8 : {false, true}) {
          const int64_t row_bytes =
              fp8 ? kv_fp8::LatentRowBytes(kKvr, kRope) : int64_t{kKvr + kRope} * 4;
          DevBuf d_kv(slots * row_bytes);
          AttentionArgs a;
          a.q_a = HeadsView{d_qa.as<float>(), rows, kHeads, kKvr, kHeads * kKvr, kKvr};
          a.q_b = HeadsView{d_qb.as<float>(), rows, kHeads, kRope, kHeads * kRope, kRope};
          const int64_t ld = kKvr + kRope;
          a.k_a = HeadsView{fp8 ? nullptr : d_kv.as<float>(), slots, kHeads, kKvr, fp8 ? 0 : ld, 0};
          a.k_b = HeadsView{fp8 ? nullptr : d_kv.as<float>() + kKvr, slots, kHeads, kRope,
                            fp8 ? 0 : ld, 0};
          a.v = a.k_a;
          if (fp8) a.latent_fp8 = {d_kv.as<uint8_t>(), slots, kKvr, kRope};
          a.table = kt;
          a.indices = d_idx.as<int32_t>();
          a.index_width = kTopK;
          a.scale = 0.072f;
          a.out = HeadsView{d_o.as<float>(), rows, kHeads, kKvr, kHeads * kKvr, kKvr};
          double us_staged = 0, us_tc = 0;
          using kernels::MlaAttentionPath;
          struct Run {
            const char* name;
            MlaAttentionPath path;
            int tc_heads;
          };
          for (const Run& run : {Run{"attn-split", MlaAttentionPath::kSplit, 0},
                                 Run{"attn-staged", MlaAttentionPath::kStaged, 0},
                                 Run{"attn-tc", MlaAttentionPath::kTensorCore, 0},
                                 Run{"attn-tc16", MlaAttentionPath::kTensorCore, 16},
                                 Run{"attn-tc32", MlaAttentionPath::kTensorCore, 32},
                                 Run{"attention", MlaAttentionPath::kByShape, 0}}) {
            const bool tc = run.path == MlaAttentionPath::kTensorCore;
            if (tc && !fp8) continue;  // the tensor-core kernel reads the fp8 latent only
            kernels::KernelPolicy policy;
            policy.attention.path = run.path;
            policy.attention.tc_heads_per_cta = run.tc_heads;
            CheckOk(Attention(a, policy, scratch, stream), "Attention");
            BENCH_CHECK(cudaStreamSynchronize(stream));
            if (tc && LastAttentionPathForTest() != MlaAttentionPath::kTensorCore) {
              std::printf("%-10s fp8   %5d %7d  (tensor-core kernel not available here)\n",
                          run.name, rows, keys);
              continue;
            }
            const auto t =
                TimeEnqueues([&](int) { return Attention(a, policy, scratch, stream); }, kCalls,
                             trials, stream);
            Report(run.name, fp8 ? "fp8" : "fp32", rows, keys, t.us_per_call,
                   static_cast<double>(rows) * sel * row_bytes, d2d);
            if (run.path == MlaAttentionPath::kStaged) us_staged = t.us_per_call;
            if (tc && run.tc_heads == 0) us_tc = t.us_per_call;
          }
          if (us_tc > 0) {
            std::printf("attn-tc speedup over attn-staged, rows %d keys %d: %.2fx\n", rows, keys,
                        us_staged / us_tc);
          }
        }
      }
    }
  }
  // ---- quantizing writes (one new token per sequence)
  for (const int rows : rows_list) {
    const int64_t slots = 4096;
    std::vector<int32_t> s(rows);
    for (int i = 0; i < rows; ++i) s[i] = (i * 61) % slots;
    DevBuf d_s(rows * 4), d_src(int64_t{rows} * (kKvr + kRope) * 4),
        d_lat(slots * kv_fp8::LatentRowBytes(kKvr, kRope)), d_idx(slots * 132);
    Upload(d_s, s);
    const MatView lat{d_src.as<float>(), rows, kKvr + kRope, kKvr + kRope};
    const Fp8LatentCache lc{d_lat.as<uint8_t>(), slots, kKvr, kRope};
    auto t = TimeEnqueues([&](int) { return WriteLatentFp8(lat, d_s.as<int32_t>(), lc, stream); },
                          kCalls, trials, stream);
    Report("write-lat", "fp8", rows, 0, t.us_per_call, rows * (kKvr + kRope) * 4.0, d2d);
    const MatView ik{d_src.as<float>(), rows, kIDim, kIDim};
    const Fp8IndexCache ic{d_idx.as<uint8_t>(), slots, kIDim, 64};
    t = TimeEnqueues([&](int) { return WriteIndexKeysFp8(ik, d_s.as<int32_t>(), ic, stream); },
                     kCalls, trials, stream);
    Report("write-idx", "fp8", rows, 0, t.us_per_call, rows * kIDim * 4.0, d2d);
  }
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace glm::engine::cuda

int main(int argc, char** argv) { return glm::engine::cuda::Main(argc, argv); }
