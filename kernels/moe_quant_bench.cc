// Bench for moe_quant (routed experts read narrow as INT4 / INT8 / NVFP4) at GLM-5's MoE widths:
// hidden 6144, moe_inter 2048, 256 experts, top-8, batches of 1 / 8 / 64 tokens and 512 (one
// prefill piece: kMoeQuantMaxPairs pairs; the CUDA backend runs a prefill as such pieces). Prints
// per call
// (token lists + gate|up + down + combine): time, the bytes the routed experts' packed weights
// and scales take (what must come from HBM: each distinct routed expert once), GB/s, and the
// fraction of a device-to-device copy measured in the same run (read + write bytes / time), and
// the tensor-core arithmetic rate (2 * pairs * 3 * hidden * inter flops / time).
// Timing: `calls` back-to-back calls, each on its own random routing (so consecutive calls read
// other experts, not the L2's copy), captured in one CUDA graph and replayed; time = median
// replay / calls (bench_util.h). One layer of experts per format is allocated (int8: 9.7 GB).
// Usage: moe_quant_bench [--quick]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bench_util.h"
#include "kernels/cuda_util.h"
#include "kernels/moe_quant.h"

namespace glm::kernels {
namespace {

void* Alloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return p;
}

class BenchWorkspace : public MoeWorkspace {
 public:
  ~BenchWorkspace() override {
    for (void* p : p_) cudaFree(p);
  }
  absl::StatusOr<void*> Get(int slot, size_t bytes) override {
    if (bytes_[slot] < bytes) {
      if (p_[slot] != nullptr) cudaFree(p_[slot]);
      p_[slot] = Alloc(bytes);
      bytes_[slot] = bytes;
    }
    return p_[slot];
  }

 private:
  void* p_[8] = {};
  size_t bytes_[8] = {};
};

constexpr int64_t kHidden = 6144, kInter = 2048;
constexpr int kExperts = 256, kTopK = 8;

int Main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "moe_quant_bench: unknown flag '%s' (flags: --quick)\n", argv[i]);
      return 2;
    }
  }
  cudaStream_t stream = PrintDeviceAndCreateStream();
  const double d2d = MeasureD2DGBps(size_t{2} << 30, stream);
  std::printf("limit: D2D copy %.0f GB/s (read+write bytes / time, eager memcpy)\n", d2d);
  std::printf("\n%-6s %6s %5s %9s %9s %7s %7s %7s  %s\n", "w", "tokens", "pairs", "us",
              "MB_read", "GB/s", "of_d2d", "TFLOP/s", "tiling");
  std::vector<int64_t> batches = {1, 8, 64, kMoeQuantMaxPairs / kTopK};
  if (quick) batches = {1, 64, kMoeQuantMaxPairs / kTopK};
  constexpr int kCalls = 16;
  const int64_t max_tokens = *std::max_element(batches.begin(), batches.end());
  float* x = static_cast<float*>(Alloc(static_cast<size_t>(max_tokens * kHidden) * 4));
  float* out = static_cast<float*>(Alloc(static_cast<size_t>(max_tokens * kHidden) * 4));
  FillConst(x, static_cast<size_t>(max_tokens * kHidden), 0.37f);
  BENCH_CHECK(cudaMemset(out, 0, static_cast<size_t>(max_tokens * kHidden) * 4));
  float* weights = static_cast<float*>(Alloc(static_cast<size_t>(max_tokens * kTopK) * 4));
  FillConst(weights, static_cast<size_t>(max_tokens * kTopK), 0.125f);
  // kCalls routings of max_tokens tokens: top-8 distinct experts per token.
  std::vector<std::vector<int32_t>> host_ids(kCalls);
  std::vector<int32_t*> ids(kCalls);
  uint32_t s = 12345;
  for (int c = 0; c < kCalls; ++c) {
    for (int64_t t = 0; t < max_tokens; ++t) {
      std::set<int32_t> picked;
      while (static_cast<int>(picked.size()) < kTopK) {
        s = s * 1664525u + 1013904223u;
        picked.insert(static_cast<int32_t>((s >> 8) % kExperts));
      }
      host_ids[c].insert(host_ids[c].end(), picked.begin(), picked.end());
    }
    ids[c] = static_cast<int32_t*>(Alloc(host_ids[c].size() * 4));
    BENCH_CHECK(cudaMemcpy(ids[c], host_ids[c].data(), host_ids[c].size() * 4,
                           cudaMemcpyHostToDevice));
  }
  BenchWorkspace ws;
  for (QuantFormat f : {QuantFormat::kInt4, QuantFormat::kInt8, QuantFormat::kNvfp4}) {
    const int64_t group = f == QuantFormat::kNvfp4 ? 16 : 128;  // the checkpoints' groups
    const int bits = f == QuantFormat::kInt8 ? 8 : 4;
    const int sb = f == QuantFormat::kNvfp4 ? 1 : 2;
    // One projection of one expert: [rows, cols] packed, then its scales (16-byte rows).
    auto bytes_of = [&](int64_t rows, int64_t cols, size_t* scale_bytes, int64_t* scale_ld) {
      *scale_ld = (cols / group * sb + 15) / 16 * 16 / sb;
      *scale_bytes = static_cast<size_t>(rows * *scale_ld * sb);
      return static_cast<size_t>(rows * cols * bits / 8);
    };
    size_t gsb = 0, dsb = 0;
    int64_t gsl = 0, dsl = 0;
    const size_t gdb = bytes_of(kInter, kHidden, &gsb, &gsl);
    const size_t ddb = bytes_of(kHidden, kInter, &dsb, &dsl);
    const size_t per_expert = 2 * (gdb + gsb) + ddb + dsb;
    char* layer = static_cast<char*>(Alloc(per_expert * kExperts));
    FillRandom(layer, per_expert * kExperts, /*fp8=*/true, 7);
    std::vector<MoeQuantExpert> ex(kExperts);
    for (int e = 0; e < kExperts; ++e) {
      char* p = layer + per_expert * e;
      auto matrix = [&](size_t db, size_t sbytes, int64_t cols, int64_t sl) {
        MoeQuantMatrix m;
        m.data = p;
        m.ld_bytes = cols * bits / 8;
        m.scales = p + db;
        m.scale_ld = sl;
        m.global_scale = 0.01f;
        p += db + sbytes;
        return m;
      };
      ex[e].gate = matrix(gdb, gsb, kHidden, gsl);
      ex[e].up = matrix(gdb, gsb, kHidden, gsl);
      ex[e].down = matrix(ddb, dsb, kInter, dsl);
    }
    // int scales as bf16 near 1 / 64 (FillRandom's fp8 bytes would make any bf16 pattern).
    if (f != QuantFormat::kNvfp4) {
      std::vector<uint16_t> sc(std::max(gsb, dsb) / 2, 0x3c80);
      for (const MoeQuantExpert& e : ex) {
        for (const MoeQuantMatrix* m : {&e.gate, &e.up, &e.down}) {
          const size_t n = m == &e.down ? dsb : gsb;
          BENCH_CHECK(cudaMemcpy(const_cast<void*>(m->scales), sc.data(), n,
                                 cudaMemcpyHostToDevice));
        }
      }
    }
    auto table = MoeQuantTableFor(layer, ex.data(), kExperts, kHidden, kInter, f, group, stream);
    CheckOk(table.status(), "moe_quant table");
    for (int64_t tokens : batches) {
      MoeQuantArgs a;
      a.x = x, a.x_ld = kHidden, a.tokens = tokens;
      a.weights = weights, a.top_k = kTopK;
      a.experts = &*table;
      a.out = out, a.out_ld = kHidden;
      auto enqueue = [&](int i) {
        MoeQuantArgs b = a;
        b.ids = ids[i % kCalls];
        return MoeQuantExperts(b, KernelPolicy{}, ws, stream);
      };
      CheckOk(enqueue(0), "warm-up (workspace)");
      BENCH_CHECK(cudaStreamSynchronize(stream));
      const double us = TimeEnqueues(enqueue, kCalls, 7, stream).us_per_call;
      double bytes = 0;
      for (int c = 0; c < kCalls; ++c) {
        const std::set<int32_t> distinct(host_ids[c].begin(),
                                         host_ids[c].begin() + tokens * kTopK);
        bytes += static_cast<double>(distinct.size() * per_expert);
      }
      bytes /= kCalls;
      const double gbs = bytes / (us * 1e-6) / 1e9;
      DeviceLimits limits;
      auto ql = QueryDeviceLimits(0, 0);
      if (ql.ok()) limits = *ql;
      auto plan = PlanMoeQuant(tokens * kTopK, kExperts, kHidden, kInter, f, group, limits);
      const double tflops = 2.0 * static_cast<double>(tokens * kTopK) * 3.0 * kHidden * kInter /
                            (us * 1e-6) / 1e12;
      std::printf("%-6s %6lld %5lld %9.1f %9.1f %7.0f %7.3f %7.1f  %s\n", QuantFormatName(f),
                  static_cast<long long>(tokens), static_cast<long long>(tokens * kTopK), us,
                  bytes / 1e6, gbs, gbs / d2d, tflops,
                  plan.ok() ? plan->DebugString().c_str() : plan.status().ToString().c_str());
    }
    BENCH_CHECK(cudaStreamSynchronize(stream));
    cudaFree(layer);
  }
  std::printf("\nus: one MoeQuantExperts call (token lists, gate|up, down, combine; graph replay "
              "over %d routings); MB_read = packed weights + scales of the distinct routed "
              "experts; GB/s = MB_read / us; of_d2d = GB/s / D2D copy GB/s; TFLOP/s = the "
              "experts' multiply-adds x 2 / us. int4 / int8: group 128 (bf16 scales); nvfp4: "
              "16-input e4m3 scales.\n",
              kCalls);
  for (int32_t* p : ids) cudaFree(p);
  cudaFree(x);
  cudaFree(out);
  cudaFree(weights);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace glm::kernels

int main(int argc, char** argv) { return glm::kernels::Main(argc, argv); }
