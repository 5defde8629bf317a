// Absorbed-MLA per-head products at GLM-5 widths (64 heads, qk_nope 192, v 256, kv_lora_rank
// 512; kv_b_proj [64 * 448, 512]) for 1 / 8 / 64 tokens:
//   W_UK: q_lat[t,h,:] = q_nope[t,h,:] . W_UK[h]  (contract 192 weight rows -> 512 columns)
//   W_UV: o[t,h,:]     = o_lat[t,h,:] . W_UV[h]^T (contract 512 columns -> 256 weight rows)
// PerHeadNarrow on the stored kv_b_proj (bf16, fp8 + 128x128 scales, fp32) against the fp32
// cuBLASLt strided-batched GEMMs the CUDA backend ran before (LinearPerHead: W_UK^T copied per
// head, [64, 512, 192]; W_UV read from the fp32 kv_b), in the same process: µs per call (median
// of trials of a CUDA graph of `calls` launches, each on the next of enough weight copies that
// the set is 4x the L2, so weights come from HBM), weight GB/s, and the fraction of an eager D2D
// copy's GB/s measured first.
// Usage: per_head_narrow_bench [--trials N] [--calls N]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/bench_util.h"
#include "kernels/per_head_narrow.h"

namespace glm::kernels {
namespace {

#define LT_CHECK(expr)                                                                  \
  do {                                                                                  \
    const cublasStatus_t s_ = (expr);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr,                \
                   cublasLtGetStatusString(s_));                                        \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// y[b][m, n] = x[b][m, k] . w[b][n, k]^T, fp32, CUBLAS_COMPUTE_32F, batch b: the layout of the
// CUDA backend's LtMatmul (engine/backend/cuda/cublaslt_matmul.cc) for LinearPerHead.
struct LtBatched {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = size_t{32} << 20;

  LtBatched(cublasLtHandle_t h, int64_t m, int64_t n, int64_t k, int64_t x_ld, int64_t w_ld,
            int64_t y_ld, int32_t batch, int64_t x_bs, int64_t w_bs, int64_t y_bs)
      : handle(h) {
    BENCH_CHECK(cudaMalloc(&ws, ws_bytes));
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    LT_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, k, n, w_ld));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, k, m, x_ld));
    LT_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, n, m, y_ld));
    const std::pair<cublasLtMatrixLayout_t, int64_t> ls[] = {{a, w_bs}, {b, x_bs}, {c, y_bs}};
    for (const auto& [l, s] : ls) {
      LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                sizeof(batch)));
      LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &s, sizeof(s)));
    }
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = ws_bytes;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 1, &r, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt: no algorithm\n");
      std::exit(1);
    }
    algo = r.algo;
  }
  ~LtBatched() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
    cudaFree(ws);
  }
  absl::Status Run(const float* x, const float* w, float* y, cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s = cublasLtMatmul(handle, op, &alpha, w, a, x, b, &beta, y, c, y, c,
                                            &algo, ws, ws_bytes, stream);
    return s == CUBLAS_STATUS_SUCCESS ? absl::OkStatus()
                                      : absl::InternalError(cublasLtGetStatusString(s));
  }
};

constexpr int64_t kHeads = 64, kNope = 192, kRope = 64, kV = 256, kRank = 512;
constexpr int64_t kHeadRows = kNope + kV;

int Run(int argc, char** argv) {
  int trials = 7, calls = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--trials")) trials = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--calls")) calls = std::atoi(argv[i + 1]);
  }
  cudaStream_t stream = PrintDeviceAndCreateStream();
  int dev = 0;
  BENCH_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, dev));
  const double d2d = MeasureD2DGBps(size_t{1} << 30, stream);
  std::printf("D2D copy: %.0f GB/s (eager 1 GiB cudaMemcpyAsync, read + write)\n", d2d);
  const size_t l2 = static_cast<size_t>(prop.l2CacheSize);

  cublasLtHandle_t lt;
  LT_CHECK(cublasLtCreate(&lt));
  // Activations as the model lays them out: q [T, 64, 256] (nope | rope), q_lat / o_lat
  // [T, 64, 512], o [T, 64, 256].
  constexpr int64_t kMaxT = 64;
  float *q, *lat, *o;
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&q), kMaxT * kHeads * (kNope + kRope) * 4));
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&lat), kMaxT * kHeads * kRank * 4));
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), kMaxT * kHeads * kV * 4));
  FillConst(q, kMaxT * kHeads * (kNope + kRope), 0.01f);
  FillConst(lat, kMaxT * kHeads * kRank, 0.01f);

  struct Copies {
    std::vector<void*> w;
    float* scales = nullptr;
  };
  auto make_copies = [&](size_t bytes, bool fp8, bool bf16) {
    Copies c;
    const size_t n = std::max<size_t>(2, (4 * l2 + bytes - 1) / bytes);
    for (size_t i = 0; i < n; ++i) {
      void* p;
      BENCH_CHECK(cudaMalloc(&p, bytes));
      if (fp8 || bf16) {
        FillRandom(p, bytes, fp8, static_cast<uint32_t>(i + 1));
      } else {
        FillConst(static_cast<float*>(p), bytes / 4, 0.001f);
      }
      c.w.push_back(p);
    }
    return c;
  };
  // The fp32 path's weights: W_UK^T [64, 512, 192] and kv_b fp32 [64 * 448, 512].
  const size_t uk_t_bytes = kHeads * kRank * kNope * 4;
  const size_t kv_b32_bytes = kHeads * kHeadRows * kRank * 4;
  Copies uk_t = make_copies(uk_t_bytes, false, false);
  Copies kv_b32 = make_copies(kv_b32_bytes, false, false);
  Copies kv_b16 = make_copies(kHeads * kHeadRows * kRank * 2, false, true);
  Copies kv_b8 = make_copies(kHeads * kHeadRows * kRank, true, false);
  const int64_t scale_ld = 4;  // ceil(512 / 128) rounded up to 4
  const int64_t srows = (kHeads * kHeadRows + 127) / 128;
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&kv_b8.scales), srows * scale_ld * 4));
  FillConst(kv_b8.scales, srows * scale_ld, 1.0f / 448.0f);

  std::printf("\n%-5s %-4s %-30s %10s %10s %8s %10s\n", "op", "T", "path", "us", "GB/s",
              "of D2D", "vs fp32");
  for (bool uk : {true, false}) {
    for (int64_t t : {1, 8, 64}) {
      const char* op = uk ? "W_UK" : "W_UV";
      const int64_t wbytes_per_elem_count = kHeads * (uk ? kNope : kV) * kRank;
      // fp32 cuBLASLt strided batched (today's LinearPerHead).
      LtBatched lt_op =
          uk ? LtBatched(lt, t, kRank, kNope, kHeads * (kNope + kRope), kNope, kHeads * kRank,
                         kHeads, kNope + kRope, kRank * kNope, kRank)
             : LtBatched(lt, t, kV, kRank, kHeads * kRank, kRank, kHeads * kV, kHeads, kRank,
                         kHeadRows * kRank, kV);
      const Copies& base = uk ? uk_t : kv_b32;
      const BenchTiming lt_time = TimeEnqueues(
          [&](int i) {
            const float* w = static_cast<const float*>(base.w[i % base.w.size()]);
            if (!uk) w += kNope * kRank;
            return lt_op.Run(uk ? q : lat, w, uk ? lat : o, stream);
          },
          calls, trials, stream);
      const double lt_gbps = wbytes_per_elem_count * 4.0 / (lt_time.us_per_call * 1e3);
      std::printf("%-5s %-4lld %-30s %10.2f %10.0f %8.2f %10s\n", op, (long long)t,
                  "fp32 cuBLASLt (before)", lt_time.us_per_call, lt_gbps, lt_gbps / d2d, "1.00");
      struct Variant {
        const char* name;
        PerHeadWeight type;
        const Copies* c;
        int eb;
      };
      const Variant variants[] = {{"PerHeadNarrow bf16", PerHeadWeight::kBF16, &kv_b16, 2},
                                  {"PerHeadNarrow fp8", PerHeadWeight::kF8E4M3Block128, &kv_b8, 1},
                                  {"PerHeadNarrow fp32", PerHeadWeight::kF32, &kv_b32, 4}};
      for (const Variant& v : variants) {
        PerHeadNarrowArgs a;
        a.contract = uk ? PerHeadContract::kRows : PerHeadContract::kCols;
        a.weight = v.type;
        a.x = uk ? q : lat;
        a.x_row_stride = uk ? kHeads * (kNope + kRope) : kHeads * kRank;
        a.x_head_stride = uk ? kNope + kRope : kRank;
        a.ldw = kRank;
        a.w_scales = v.c->scales;
        a.w_scale_ld = scale_ld;
        a.head_rows = kHeadRows;
        a.row_begin = uk ? 0 : kNope;
        a.y = uk ? lat : o;
        a.y_row_stride = uk ? kHeads * kRank : kHeads * kV;
        a.y_head_stride = uk ? kRank : kV;
        a.num_tokens = t;
        a.num_heads = kHeads;
        a.in_dim = uk ? kNope : kRank;
        a.out_dim = uk ? kRank : kV;
        const BenchTiming time = TimeEnqueues(
            [&](int i) {
              PerHeadNarrowArgs b = a;
              b.w = v.c->w[i % v.c->w.size()];
              return PerHeadNarrow(b, stream);
            },
            calls, trials, stream);
        const double gbps = wbytes_per_elem_count * double(v.eb) / (time.us_per_call * 1e3);
        std::printf("%-5s %-4lld %-30s %10.2f %10.0f %8.2f %9.2fx\n", op, (long long)t, v.name,
                    time.us_per_call, gbps, gbps / d2d, lt_time.us_per_call / time.us_per_call);
      }
    }
  }
  std::printf("\n(\"vs fp32\": the fp32 cuBLASLt time / this time; weight bytes only in GB/s)\n");
  cublasLtDestroy(lt);
  return 0;
}

}  // namespace
}  // namespace glm::kernels

int main(int argc, char** argv) { return glm::kernels::Run(argc, argv); }
