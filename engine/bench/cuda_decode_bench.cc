// glm-bench-cuda-decode: decode step of a model with GLM-5's full layer widths on one GPU, per
// layer, against the bytes a step must read at HBM bandwidth.
//
//   glm-bench-cuda-decode [--config DIR] [--dtype fp32|bf16|fp8|int4mix|nvfp4]
//       [--layers auto|N1,N2]
//       [--batches 1,8,64] [--contexts 4096,131072] [--steps 8] [--warmup 2] [--block-size 64]
//       [--reserve-gib 4] [--max-layers 3] [--device 0] [--seed 1] [--threads 0]
//       [--backend cuda|cpu] [--small] [--graphs on|off] [--kv-dtype fp32|fp8|both]
//       [--key-slots incremental|both] [--kv-fill random|zeros]
//       [--ab none|attncore|idxselect|idxwide] [--smem-cap BYTES]
//       [--fused on|off|both]
//
// Model: configs/models/glm-5/config.json's widths (hidden 6144, 64 heads, MLA q/kv ranks
// 2048/512, DSA indexer 32 x 128 with index_topk 2048, 256 experts top-8 with moe_inter 2048 + a
// shared expert, vocab 154880), every layer MoE with a full indexer, no MTP layer. Weights:
// LazyRandomWeights (engine/model/lazy_random_weights.h), generated tensor by tensor on the host
// with all cores. --small: a tiny config for a smoke test (any backend).
// --dtype int4mix / nvfp4: the Linear weights of a quantized checkpoint's layout kept narrow as
// stored (LazyRandomWeights::Options::quantized; weight_dtype "auto"): int4mix = routed experts
// INT4 g128 and attention / shared-expert INT8 g128 (kv_b_proj widened to bf16 at load, as the
// model's absorption needs), nvfp4 = routed experts NVFP4; every other Linear bf16. The routed
// experts are read narrow by kernels/moe_quant.h (the run ends with the count of such calls).
//
// KV: the model's paged cache is filled with random values once allocated (--kv-fill random, the
// default: ModelLoadOptions::random_kv, PagedKvStorage::FillRandom), or left zero (--kv-fill
// zeros: every cached indexer score then ties, which the exact
// top-k resolves in its cheapest way, and the measured step understates a real one at long
// contexts). A sequence of context S is a slice with one new token at start_pos = S and a block
// table over S + 1 positions of its own blocks (no sequence shares a block), so each step reads
// exactly what a real decode at S would read. No prefill runs. Every step is the same batch one
// position further (start_pos = S + step; each sequence has blocks for S + 64 positions,
// BlocksPerSeq), so a step writes a new KV row and the model's key-slot arena
// (engine/model/slot_arena.h) uploads one slot per sequence, as in a real decode; the first
// (warm-up) step writes all S + 1.
// --key-slots both: each case is then run again in the same process with every step uploading
// the key slots of all S + 1 positions of every sequence (SetKeySlotRebuild: the per-step host
// work before the arena), and the two step times are printed side by side.
//
// --ab KNOB: each case is also timed with one kernel-policy choice off, in alternating rounds
// off, on, off, on in the same model (Backend::SetKernelPolicy between rounds moves the
// backend's scratch_epoch, so decode graphs are recaptured), and ms/layer is printed both ways
// side by side (the "on" figures are the main table's). The choices are the rows of kAbKnobs
// below, each a mutator of kernels::KernelPolicy (kernels/kernel_policy.h):
// attncore: MLA attention by shape (the tensor-core kernel over the fp8 latent at GLM-5 widths)
// vs the staged CUDA-core kernel (AttentionPolicy::path = kStaged); it moves fp8-KV cases only.
// idxselect: the indexer's top-k select by shape (short-row / multi-CTA passes) vs the single-CTA
// radix passes (IndexerPolicy::select = kSingleCta). idxwide: the indexer's tensor-core scores by
// shape ({4,8,0} for >= 8 rows or > 16K keys) vs {2,2,2} everywhere (IndexerPolicy::score =
// kTensorCore); fp8-KV cases only.
//
// --smem-cap BYTES: plan every launch as a device with at most BYTES of opt-in shared memory per
// block (KernelPolicy::smem_cap_bytes; 101376 runs GB10's plans on a larger GPU).
//
// --fused: Linear weights that share an input stored and computed as one (ModelLoadOptions::
// fuse_linears, the default) or each on its own; "both" loads every model both ways, unfused
// first, and prints ms/layer side by side.
//
// Timing: host wall clock around Model::Forward + Backend::Synchronize (Forward ends with the
// logits' copy to the host); warm-up steps, then the median of --steps. Eager steps by default;
// --graphs on lets the model replay decode CUDA graphs (ModelLoadOptions::cuda_graphs, where the
// build has it). The model is loaded twice,
// with N1 and N2 layers (default 1 and the most that fit with the largest case's KV), and
// ms/layer = (step(N2) - step(N1)) / (N2 - N1): the embedding, final norm, lm_head, logits copy
// and the host's step planning cancel out ("fixed" = step(N1) - N1 * ms/layer).
//
// Roofline: the bytes one layer must read for the case (weights as stored; routed experts hit =
// the expectation for uniform routing of batch x top-8 picks; KV: the indexer keys of all S + 1
// positions and the MLA latent of min(S + 1, index_topk) selected positions, per sequence, as
// the cache stores them: fp32, or with --kv-dtype fp8 the 132-byte keys and 656-byte latent rows
// of engine/backend/kv_fp8_layout.h) over the device-to-device copy bandwidth measured in this
// process (cudaMemcpyAsync of 2 GiB, bytes read + written), and over the read rate of the backend's
// own fp32 GEMV on a 1 GiB weight (a second, stricter ceiling for weight streaming).
#include <cuda_runtime.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/backend/backend.h"
#include "engine/backend/create_backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/layers.h"
#include "engine/model/lazy_random_weights.h"
#include "engine/model/random_weights.h"
#include "kernels/cuda_util.h"
#include "kernels/kernel_policy.h"

namespace glm::engine {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// An --ab choice: a name, what "on" is, and the mutator that turns it on or off in a policy.
struct AbKnob {
  const char* name;
  const char* what;
  void (*apply)(kernels::KernelPolicy& policy, bool on);
};

struct Args {
  std::string config_dir = "configs/models/glm-5";
  std::string dtype = "fp32";
  std::string layers = "auto";
  std::vector<int> batches = {1, 8, 64};
  std::vector<int> contexts = {4096, 131072};
  int steps = 8;
  int warmup = 2;
  int block_size = 64;
  double reserve_gib = 4.0;
  int max_layers = 3;
  int device = 0;
  uint64_t seed = 1;
  int threads = 0;
  std::string backend = "cuda";
  bool small = false;
  bool graphs = false;
  bool key_slots_both = false;  // also time steps that rebuild the whole key-slot table
  bool random_kv = true;        // --kv-fill random (default) | zeros: ModelLoadOptions::random_kv
  // KV cache storage (ModelLoadOptions::kv.dtype); "both" runs every case with fp32 and with fp8
  // KV in this process and prints ms/layer side by side.
  std::string kv_dtype = "fp32";
  KvDType kv = KvDType::kF32;  // the one RunModel uses
  std::string ab = "none";     // none | a kAbKnobs name: the choice also timed off
  // The --ab choice (nullptr for none) and the policy every backend starts with (--smem-cap).
  const AbKnob* ab_knob = nullptr;
  kernels::KernelPolicy policy;
  std::string fused = "on";  // on | off | both (ModelLoadOptions::fuse_linears)
  bool fuse = true;          // the one RunModel uses
};

constexpr AbKnob kAbKnobs[] = {
    {"attncore", "MLA attention by shape (tensor core) vs the staged CUDA-core kernel",
     [](kernels::KernelPolicy& p, bool on) {
       p.attention.path = on ? kernels::MlaAttentionPath::kByShape
                             : kernels::MlaAttentionPath::kStaged;
     }},
    {"idxselect", "indexer top-k select by shape vs the single-CTA radix passes",
     [](kernels::KernelPolicy& p, bool on) {
       p.indexer.select = on ? kernels::IndexerPolicy::Select::kByShape
                             : kernels::IndexerPolicy::Select::kSingleCta;
     }},
    {"idxwide", "indexer tensor-core scores by shape vs the {2,2,2} kernel everywhere",
     [](kernels::KernelPolicy& p, bool on) {
       p.indexer.score = on ? kernels::IndexerPolicy::Score::kByShape
                            : kernels::IndexerPolicy::Score::kTensorCore;
     }},
};

const AbKnob* FindAbKnob(const std::string& name) {
  for (const AbKnob& k : kAbKnobs) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

bool CudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

// Free device memory in bytes (the host's RAM for the cpu backend smoke test).
int64_t FreeBytes(const Args& a) {
  if (a.backend != "cuda") return int64_t{64} << 30;
  size_t free_b = 0, total_b = 0;
  if (!CudaOk(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo")) return 0;
  return static_cast<int64_t>(free_b);
}

// ---- ceilings -------------------------------------------------------------------------------

// Device-to-device copy, GB/s of bytes read + written (docs/benchmarks.md convention).
double MeasureD2D() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  if (!CudaOk(cudaMalloc(&a, bytes), "cudaMalloc(d2d)") ||
      !CudaOk(cudaMalloc(&b, bytes), "cudaMalloc(d2d)")) {
    cudaFree(a);
    return 0;
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemsetAsync(a, 1, bytes, s);
  for (int i = 0; i < 2; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
  std::vector<double> gbs;
  for (int t = 0; t < 5; ++t) {
    cudaEventRecord(e0, s);
    for (int i = 0; i < 4; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    gbs.push_back(2.0 * bytes * 4 / (ms * 1e-3) / 1e9);
  }
  CudaOk(cudaGetLastError(), "d2d copy");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
  return Median(gbs);
}

// The backend's own Linear at M = 1 over an fp32 weight [32768, 8192] (1 GiB, far beyond L2):
// GB/s of weight bytes read. The rate the model's fp32 weight streaming can reach at best.
double MeasureGemvRead(Backend* b) {
  const int64_t n = 32768, k = 8192;
  auto w = b->Allocate(n * k * sizeof(float));
  auto x = b->Allocate(k * sizeof(float));
  auto y = b->Allocate(n * sizeof(float));
  const MatView xv{x->f32(), 1, k, k}, wv{w->f32(), n, k, k}, yv{y->f32(), 1, n, n};
  b->Fill(xv, 0.5f);
  for (int i = 0; i < 3; ++i) b->Linear(xv, wv, yv, false);
  b->Synchronize();
  std::vector<double> gbs;
  for (int t = 0; t < 5; ++t) {
    const double t0 = Now();
    for (int i = 0; i < 10; ++i) b->Linear(xv, wv, yv, false);
    b->Synchronize();
    gbs.push_back(10.0 * n * k * 4 / (Now() - t0) / 1e9);
  }
  if (!b->status().ok()) {
    std::fprintf(stderr, "GEMV ceiling: %s\n", b->status().ToString().c_str());
    return 0;
  }
  return Median(gbs);
}

// ---- model config and sizes -----------------------------------------------------------------

ModelConfig BenchConfig(const ModelConfig& base, int num_layers) {
  ModelConfig c = base;
  c.num_hidden_layers = num_layers;
  c.first_k_dense_replace = 0;
  c.indexer_types.assign(num_layers, IndexerType::kFull);
  c.mlp_layer_types.assign(num_layers, MlpType::kSparse);
  c.num_nextn_predict_layers = 0;
  c.quantization.reset();
  return c;
}

bool QuantizedLayout(const std::string& dtype) { return dtype == "int4mix" || dtype == "nvfp4"; }

LazyRandomWeights::Options::Quantized QuantizedOption(const std::string& dtype) {
  using Q = LazyRandomWeights::Options::Quantized;
  return dtype == "int4mix" ? Q::kInt4Int8Mix : dtype == "nvfp4" ? Q::kNvfp4 : Q::kNone;
}

// Bytes per element of a Linear weight as the model stores it (fp8: e4m3 + one fp32 scale per
// 128 x 128 block; the quantized layouts' plain Linears: bf16).
double LinearElemBytes(const std::string& dtype) {
  if (dtype == "bf16" || QuantizedLayout(dtype)) return 2.0;
  if (dtype == "fp8") return 1.0 + 4.0 / (128.0 * 128.0);
  return 4.0;
}
// Bytes per element of a quantized-layout weight (packed codes + one bf16 / e4m3 scale per group).
double QuantElemBytes(WeightDType d) {
  if (d == WeightDType::kInt4) return 0.5 + 2.0 / 128;
  if (d == WeightDType::kInt8) return 1.0 + 2.0 / 128;
  return 0.5 + 1.0 / 16;  // NVFP4
}
// The stored bytes per element of tensor `name` (kv_b_proj, which the loader widens, as bf16).
double ElemBytes(const LazyRandomWeights& w, const std::string& dtype, const std::string& name) {
  if (!LazyRandomWeights::IsLinearWeight(name)) return 4.0;
  const bool kv_b = name.find("kv_b_proj") != std::string::npos;
  if (const auto q = w.QuantizedInfoOf(name); q.has_value() && !kv_b) {
    return QuantElemBytes(q->dtype);
  }
  return LinearElemBytes(dtype);
}

// Estimated device bytes of the weights of `c` (fp32 models also keep an absorbed W_UK^T copy
// per layer; narrow models absorb from kv_b_proj as stored).
int64_t DeviceWeightBytes(const ModelConfig& c, const std::string& dtype) {
  LazyRandomWeights w(c, {.quantized = QuantizedOption(dtype)});
  double bytes = 0;
  for (const auto& s : w.specs()) {
    bytes += static_cast<double>(s.numel()) * ElemBytes(w, dtype, s.name);
  }
  if (dtype == "fp32") {
    bytes += 4.0 * c.num_hidden_layers * c.num_attention_heads * c.kv_lora_rank *
             c.qk_nope_head_dim;
  }
  return static_cast<int64_t>(bytes);
}

// Blocks per sequence: the context plus kDecodeRoom positions, so that every timed step writes a
// new position whatever the context's alignment to the block size.
constexpr int64_t kDecodeRoom = 64;
int64_t BlocksPerSeq(int context, int block_size) {
  return (static_cast<int64_t>(context) + kDecodeRoom + block_size - 1) / block_size;
}

// Expected distinct experts hit by `batch` tokens each picking top_k of n uniformly.
double ExpectedExperts(const ModelConfig& c, int batch) {
  const double n = c.n_routed_experts, k = c.num_experts_per_tok;
  return n * (1.0 - std::pow(1.0 - k / n, batch));
}

struct LayerBytes {
  double attn_weights = 0, indexer_weights = 0, router = 0, experts = 0, shared = 0, kv = 0;
  double experts_hit = 0;
  double total() const { return attn_weights + indexer_weights + router + experts + shared + kv; }
};

// Minimum bytes one decode layer reads (see the file comment).
LayerBytes MinLayerBytes(const ModelConfig& c, const std::string& dtype, int batch, int context,
                         KvDType kv_dtype = KvDType::kF32) {
  const double lb = LinearElemBytes(dtype);
  // The quantized layouts: attention (but kv_b) and shared experts INT8 in int4mix; experts
  // INT4 / NVFP4.
  const double attn_b = dtype == "int4mix" ? QuantElemBytes(WeightDType::kInt8) : lb;
  const double expert_b = dtype == "int4mix" ? QuantElemBytes(WeightDType::kInt4)
                          : dtype == "nvfp4" ? QuantElemBytes(WeightDType::kNvfp4)
                                             : lb;
  const double H = c.hidden_size, nh = c.num_attention_heads, qlr = c.q_lora_rank,
               kvr = c.kv_lora_rank, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
               vd = c.v_head_dim, inh = c.index_n_heads, ihd = c.index_head_dim,
               mi = c.moe_intermediate_size, ne = c.n_routed_experts;
  LayerBytes b;
  b.attn_weights =
      attn_b * (qlr * H + nh * (nope + rope) * qlr + (kvr + rope) * H + H * nh * vd) +
      lb * (nh * kvr * nope + nh * vd * kvr) +  // W_UK, W_UV (kv_b as stored)
      4.0 * (2 * H + qlr + kvr);                // norms
  b.indexer_weights = lb * (inh * ihd * qlr + ihd * H + inh * H) + 4.0 * 2 * ihd;
  b.router = 4.0 * (ne * H + ne);
  b.experts_hit = ExpectedExperts(c, batch);
  b.experts = b.experts_hit * expert_b * 3 * mi * H;
  b.shared = attn_b * 3 * mi * std::max(1, c.n_shared_experts) * H;
  const double keys = static_cast<double>(context) + 1;
  if (kv_dtype == KvDType::kFp8) {  // kv_fp8_layout.h: 656 + 132 bytes per token at GLM-5 widths
    b.kv = batch * (keys * static_cast<double>(kv_fp8::IndexBytesPerToken(c.index_head_dim)) +
                    std::min<double>(keys, c.index_topk) *
                        static_cast<double>(kv_fp8::LatentRowBytes(c.kv_lora_rank, rope)));
  } else {
    b.kv = batch * (keys * ihd * 4.0 + std::min<double>(keys, c.index_topk) * (kvr + rope) * 4.0);
  }
  return b;
}

// ---- one model: load, run every case ----------------------------------------------------------

struct CaseResult {
  bool ran = false;
  std::string why;         // when not run
  double step_ms = 0, min_ms = 0;
  double step_ms_off = 0;  // --ab: the median with the setting off
  bool finite = true;
};

using Results = std::map<std::pair<int, int>, CaseResult>;  // (batch, context)

ForwardBatch MakeBatch(int batch, int context, int block_size, int64_t vocab, uint64_t seed) {
  ForwardBatch fb;
  const int64_t bps = BlocksPerSeq(context, block_size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int s = 0; s < batch; ++s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    SequenceSlice slice;
    slice.seq_id = s;
    slice.token_ids = {static_cast<int32_t>(x % static_cast<uint64_t>(vocab))};
    slice.start_pos = context;
    slice.block_table.resize(bps);
    for (int64_t i = 0; i < bps; ++i) slice.block_table[i] = static_cast<int32_t>(s * bps + i);
    fb.seqs.push_back(std::move(slice));
  }
  return fb;
}

// Turns the model's decode CUDA graphs on or off where this build has them.
template <typename Options>
void SetGraphs(Options& o, bool on) {
  if constexpr (requires { o.cuda_graphs = on; }) o.cuda_graphs = on;
}

// Prints the model's decode CUDA-graph counters where this build has them.
template <typename M>
void PrintGraphStats(const M& model) {
  if constexpr (requires { model.decode_graph_stats().replays; }) {
    const auto g = model.decode_graph_stats();
    std::printf("decode graphs: %lld steps, %lld eager, %lld captures, %lld replays\n",
                static_cast<long long>(g.decode_steps), static_cast<long long>(g.eager_steps),
                static_cast<long long>(g.captures), static_cast<long long>(g.replays));
  }
}

bool RunModel(const Args& a, const ModelConfig& base, int num_layers, Results* results) {
  const ModelConfig c = BenchConfig(base, num_layers);
  std::printf("\n== %d layer(s), %s weights, %s KV\n", num_layers, a.dtype.c_str(),
              KvDTypeName(a.kv));
  auto created = CreateBackend(a.backend, a.threads, a.device, a.policy);
  if (!created.ok()) {
    std::fprintf(stderr, "backend: %s\n", created.status().ToString().c_str());
    return false;
  }
  std::unique_ptr<Backend> backend = std::move(created).value();
  ModelLoadOptions o;
  o.backend = a.backend;
  o.device = a.device;
  o.load_mtp = false;
  o.expanded_prefill = false;
  o.random_kv = a.random_kv;
  // fp8: "auto" keeps the e4m3 tensors the weight source serves (fp8_linear below) as they are.
  // int4mix / nvfp4: "auto" keeps the quantized tensors as served (quantized below).
  o.weight_dtype = a.dtype == "fp8" || QuantizedLayout(a.dtype) ? "auto" : a.dtype;
  SetGraphs(o, a.graphs);
  o.fuse_linears = a.fuse;
  o.kv.dtype = a.kv;
  o.kernel_policy = a.policy;
  // KV: enough blocks for the largest case that fits next to the weights and the reserve.
  const int64_t weights_est = DeviceWeightBytes(c, a.dtype);
  const int64_t block_bytes = KvCacheBytesPerToken(c, o) * a.block_size;
  const int64_t free_now = FreeBytes(a);
  const int64_t room =
      free_now - weights_est - static_cast<int64_t>(a.reserve_gib * kGiB);
  int64_t want = 1;
  for (int b : a.batches) {
    for (int s : a.contexts) {
      const int64_t need = b * BlocksPerSeq(s, a.block_size);
      if (need * block_bytes <= room) want = std::max(want, need);
    }
  }
  o.kv = {a.block_size, static_cast<int>(want), a.kv};
  std::printf("free %.1f GiB, weights (est.) %.1f GiB, KV %lld blocks x %d = %.1f GiB\n",
              free_now / kGiB, weights_est / kGiB, static_cast<long long>(want), a.block_size,
              want * block_bytes / kGiB);
  std::fflush(stdout);

  LazyRandomWeights weights(c, {.seed = a.seed,
                                .num_threads = a.threads,
                                .prefetch = true,
                                .fp8_linear = a.dtype == "fp8",
                                .quantized = QuantizedOption(a.dtype)});
  const int64_t total = weights.TotalBytes();
  std::atomic<bool> loading{true};
  const double t0 = Now();
  std::thread progress([&] {
    double last = Now();
    while (loading.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (loading.load() && Now() - last >= 5.0) {
        last = Now();
        std::printf("  loading: %.1f GB generated (the fp32 model is %.1f GB), %.1f s\n",
                    weights.bytes_served() / 1e9, total / 1e9, last - t0);
        std::fflush(stdout);
      }
    }
  });
  auto model = CreateGlmMoeDsa(c, weights, backend.get(), o);
  loading = false;
  progress.join();
  const double load_s = Now() - t0;
  if (!model.ok()) {
    std::fprintf(stderr, "load: %s\n", model.status().ToString().c_str());
    return false;
  }
  const int64_t used = free_now - FreeBytes(a);
  std::printf("loaded in %.1f s (%.1f GB generated; %.1f s in generation/waiting, the rest "
              "upload): device use %.1f GiB incl. KV\n",
              load_s, weights.bytes_served() / 1e9, weights.seconds_generating(), used / kGiB);
  std::printf("%6s %8s %10s %10s %8s %12s\n", "batch", "context", "step ms", "min ms", "finite",
              "slots/step");  // key slots the last step uploaded (slot_arena.h)
  std::fflush(stdout);
  for (int b : a.batches) {
    for (int s : a.contexts) {
      CaseResult& r = (*results)[{b, s}];
      const int64_t need = b * BlocksPerSeq(s, a.block_size);
      if (need > o.kv.num_blocks) {
        r.why = "KV does not fit";
        std::printf("%6d %8d   skipped: KV needs %.1f GiB, %.1f GiB left next to the weights\n", b,
                    s, need * block_bytes / kGiB, std::max<int64_t>(0, room) / kGiB);
        continue;
      }
      ForwardBatch fb = MakeBatch(b, s, a.block_size, c.vocab_size, a.seed + b);
      const int64_t last_pos = BlocksPerSeq(s, a.block_size) * a.block_size - 1;
      ForwardResult out;
      std::vector<double> ms, rebuild_ms;
      absl::Status st;
      auto run_steps = [&](std::vector<double>* times) {
        for (int i = 0; i < a.warmup + a.steps && st.ok(); ++i) {
          for (SequenceSlice& slice : fb.seqs) {
            slice.start_pos = static_cast<int32_t>(std::min<int64_t>(s + i, last_pos));
          }
          const double t = Now();
          st = (*model)->Forward(fb, &out);
          backend->Synchronize();  // Forward ends with a synchronizing copy; be sure
          if (i >= a.warmup) times->push_back((Now() - t) * 1e3);
        }
      };
      std::vector<double> off_ms;
      if (a.ab_knob != nullptr) {
        // Alternating rounds (off, on, off, on) so that drifts hit both settings alike.
        kernels::KernelPolicy off = a.policy, on = a.policy;
        a.ab_knob->apply(off, false);
        a.ab_knob->apply(on, true);
        for (int round = 0; round < 2 && st.ok(); ++round) {
          backend->SetKernelPolicy(off);
          run_steps(&off_ms);
          backend->SetKernelPolicy(on);
          if (st.ok()) run_steps(&ms);
        }
        backend->SetKernelPolicy(a.policy);
      } else {
        run_steps(&ms);
      }
      const auto arena = SlotArenaStatsOf(**model);  // of the last incremental step
      if (a.key_slots_both && st.ok() && SetKeySlotRebuild(**model, true)) {
        run_steps(&rebuild_ms);  // the same positions again: same KV rows, same values
        SetKeySlotRebuild(**model, false);
      }
      if (!st.ok()) {
        r.why = st.ToString();
        std::printf("%6d %8d   failed: %s\n", b, s, r.why.c_str());
        std::fflush(stdout);
        if (!backend->status().ok()) return false;  // sticky device error: this model is done
        continue;
      }
      r.ran = true;
      r.step_ms = Median(ms);
      r.min_ms = *std::min_element(ms.begin(), ms.end());
      for (const auto& seq : out.seqs) {
        for (float v : seq.logits) r.finite = r.finite && std::isfinite(v);
      }
      std::printf("%6d %8d %10.3f %10.3f %8s %12lld", b, s, r.step_ms, r.min_ms,
                  r.finite ? "yes" : "NO",
                  arena.has_value() ? static_cast<long long>(arena->slots_uploaded_last_step)
                                    : -1LL);
      if (!off_ms.empty()) {
        r.step_ms_off = Median(off_ms);
        std::printf("   %s off %.3f ms (on/off x%.3f)", a.ab.c_str(), r.step_ms_off,
                    r.step_ms / r.step_ms_off);
      }
      if (!rebuild_ms.empty()) {
        const double rebuild = Median(rebuild_ms);
        std::printf("   rebuild-all-slots step %.3f ms (x%.2f of incremental)", rebuild,
                    rebuild / r.step_ms);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (a.graphs) PrintGraphStats(**model);
  // Quantized layouts: the routed experts are read narrow (kernels/moe_quant.h) at every decode
  // batch (in pieces beyond 4096 / top_k tokens); a widened call would show here.
  const CudaQuantExpertCalls calls = CudaQuantExpertCallCounts();
  if (calls.narrow + calls.widened > 0) {
    std::printf("quantized expert calls so far: %lld read narrow, %lld widened to bf16\n",
                static_cast<long long>(calls.narrow), static_cast<long long>(calls.widened));
  }
  return true;
}

// (batch, context, fp8 KV) -> ms/layer (setting off, on)
using OnOffRows = std::map<std::tuple<int, int, bool>, std::pair<double, double>>;

// An A/B table: ms/layer with a setting off and on, and their ratio.
void PrintOnOff(const std::string& title, const char* off, const char* on, const OnOffRows& rows) {
  std::printf("\n== %s: ms/layer\n", title.c_str());
  std::printf("%5s %7s %5s %10s %10s %8s\n", "batch", "context", "KV", off, on, "on/off");
  for (const auto& [key, v] : rows) {
    std::printf("%5d %7d %5s %10.3f %10.3f %8.3f\n", std::get<0>(key), std::get<1>(key),
                std::get<2>(key) ? "fp8" : "fp32", v.first, v.second, v.second / v.first);
  }
}

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int x = 0;
    if (!absl::SimpleAtoi(p, &x)) return {};
    v.push_back(x);
  }
  return v;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--config") a.config_dir = next();
    else if (k == "--dtype") a.dtype = next();
    else if (k == "--layers") a.layers = next();
    else if (k == "--batches") a.batches = ParseInts(next());
    else if (k == "--contexts") a.contexts = ParseInts(next());
    else if (k == "--steps") a.steps = std::atoi(next().c_str());
    else if (k == "--warmup") a.warmup = std::atoi(next().c_str());
    else if (k == "--block-size") a.block_size = std::atoi(next().c_str());
    else if (k == "--reserve-gib") a.reserve_gib = std::atof(next().c_str());
    else if (k == "--max-layers") a.max_layers = std::atoi(next().c_str());
    else if (k == "--device") a.device = std::atoi(next().c_str());
    else if (k == "--seed") a.seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (k == "--threads") a.threads = std::atoi(next().c_str());
    else if (k == "--backend") a.backend = next();
    else if (k == "--small") a.small = true;
    else if (k == "--graphs") a.graphs = next() == "on";
    else if (k == "--key-slots") a.key_slots_both = next() == "both";
    else if (k == "--kv-fill") {
      const std::string v = next();
      if (v != "random" && v != "zeros") {
        std::fprintf(stderr, "--kv-fill: `%s` is not one of random, zeros\n", v.c_str());
        return 2;
      }
      a.random_kv = v == "random";
    } else if (k == "--kv-dtype")
      a.kv_dtype = next();
    else if (k == "--fused") a.fused = next();
    else if (k == "--ab") a.ab = next();
    else if (k == "--smem-cap") a.policy.smem_cap_bytes = std::atoll(next().c_str());
    else {
      std::fprintf(stderr,
                   "unknown flag %s; see the usage at the top of engine/bench/cuda_decode_bench.cc\n",
                   k.c_str());
      return 2;
    }
  }
  if (a.batches.empty() || a.contexts.empty() || a.steps < 1 || a.block_size < 1 ||
      (a.dtype != "fp32" && a.dtype != "bf16" && a.dtype != "fp8" &&
       !QuantizedLayout(a.dtype)) ||
      (a.kv_dtype != "fp32" && a.kv_dtype != "fp8" && a.kv_dtype != "both") ||
      (a.ab != "none" && FindAbKnob(a.ab) == nullptr) || a.policy.smem_cap_bytes < 0 ||
      (a.fused != "on" && a.fused != "off" && a.fused != "both")) {
    std::fprintf(stderr,
                 "bad flags: --batches/--contexts are comma lists of integers, --steps and "
                 "--block-size >= 1, --dtype fp32|bf16|fp8|int4mix|nvfp4, --kv-dtype "
                 "fp32|fp8|both, --ab none|attncore|idxselect|idxwide, --smem-cap >= 0, --fused "
                 "on|off|both\n");
    return 2;
  }
  a.ab_knob = FindAbKnob(a.ab);
  // Weight tensors are allocated and freed one after another (up to 3.8 GB each): keep the freed
  // memory in the heap instead of fresh mmaps that fault every page in again.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 2);

  ModelConfig base;
  if (a.small) {
    base = SmallTestConfig(1, 0, false);
  } else {
    auto loaded = LoadModelConfig(a.config_dir);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n(run from the repository root or pass --config DIR)\n",
                   loaded.status().ToString().c_str());
      return 2;
    }
    base = *loaded;
  }
  std::printf("glm-bench-cuda-decode: hidden %lld, %d heads, q/kv lora %lld/%lld, indexer %d x %lld "
              "top-%lld, %d experts top-%d (moe_inter %lld) + %d shared, vocab %lld; %s weights\n",
              static_cast<long long>(base.hidden_size), base.num_attention_heads,
              static_cast<long long>(base.q_lora_rank), static_cast<long long>(base.kv_lora_rank),
              base.index_n_heads, static_cast<long long>(base.index_head_dim),
              static_cast<long long>(base.index_topk), base.n_routed_experts,
              base.num_experts_per_tok, static_cast<long long>(base.moe_intermediate_size),
              base.n_shared_experts, static_cast<long long>(base.vocab_size), a.dtype.c_str());

  double d2d = 0, gemv = 0;
  if (a.backend == "cuda") {
    cudaDeviceProp prop{};
    if (!CudaOk(cudaSetDevice(a.device), "cudaSetDevice") ||
        !CudaOk(cudaGetDeviceProperties(&prop, a.device), "cudaGetDeviceProperties")) {
      return 1;
    }
    std::printf("device %d: %s, %d SMs, %.1f GiB, free %.1f GiB\n", a.device, prop.name,
                prop.multiProcessorCount, prop.totalGlobalMem / kGiB, FreeBytes(a) / kGiB);
    d2d = MeasureD2D();
    auto b = CreateBackend("cuda", 0, a.device);
    if (b.ok()) gemv = MeasureGemvRead(b->get());
    std::printf("ceilings: D2D copy %.0f GB/s (read + write); fp32 GEMV (backend Linear, M = 1, "
                "1 GiB weight) reads %.0f GB/s\n", d2d, gemv);
  }

  // Layer counts: N1 = 1, N2 = the most (<= --max-layers) whose weights fit with the largest
  // case's KV; failing that, with the smallest case's.
  std::vector<int> layer_counts;
  if (a.layers == "auto") {
    const int64_t free_b = FreeBytes(a), reserve = static_cast<int64_t>(a.reserve_gib * kGiB);
    auto kv_bytes = [&](int n, int batch, int context) {
      ModelLoadOptions o;
      o.load_mtp = false;  // sized for fp32 KV, the larger of the two layouts
      return KvCacheBytesPerToken(BenchConfig(base, n), o) * a.block_size * batch *
             BlocksPerSeq(context, a.block_size);
    };
    const int bmax = *std::max_element(a.batches.begin(), a.batches.end());
    const int smax = *std::max_element(a.contexts.begin(), a.contexts.end());
    const int bmin = *std::min_element(a.batches.begin(), a.batches.end());
    const int smin = *std::min_element(a.contexts.begin(), a.contexts.end());
    int n2 = 0;
    for (int n = 1; n <= a.max_layers; ++n) {
      const int64_t w = DeviceWeightBytes(BenchConfig(base, n), a.dtype);
      if (w + kv_bytes(n, bmax, smax) + reserve <= free_b) n2 = n;
    }
    if (n2 < 2) {
      for (int n = 1; n <= a.max_layers; ++n) {
        const int64_t w = DeviceWeightBytes(BenchConfig(base, n), a.dtype);
        if (w + kv_bytes(n, bmin, smin) + reserve <= free_b) n2 = n;
      }
    }
    if (n2 == 0) {
      std::fprintf(stderr, "not even one layer fits in %.1f GiB free (reserve %.1f GiB)\n",
                   free_b / kGiB, a.reserve_gib);
      return 1;
    }
    layer_counts = {1};
    if (n2 > 1) layer_counts.push_back(n2);
  } else {
    layer_counts = ParseInts(a.layers);
    std::sort(layer_counts.begin(), layer_counts.end());
    if (layer_counts.empty() || layer_counts.size() > 2 || layer_counts[0] < 1) {
      std::fprintf(stderr, "--layers: auto, N, or N1,N2 with 1 <= N1 < N2\n");
      return 2;
    }
  }

  std::vector<KvDType> kv_list;
  if (a.kv_dtype != "fp8") kv_list.push_back(KvDType::kF32);
  if (a.kv_dtype != "fp32") kv_list.push_back(KvDType::kFp8);
  const ModelConfig c1 = BenchConfig(base, 1);
  const int n1 = layer_counts.front(), n2 = layer_counts.back();
  bool ok = true;
  std::map<std::pair<int, int>, double> per_layer_by_kv[2];  // [kv dtype] (batch, context)
  OnOffRows ab_rows;                                         // --ab: (setting off, on)
  std::vector<std::pair<bool, KvDType>> variants;  // (fused Linears, KV dtype)
  for (const bool fuse :
       a.fused == "both" ? std::vector<bool>{false, true} : std::vector<bool>{a.fused == "on"}) {
    for (const KvDType kv : kv_list) variants.push_back({fuse, kv});
  }
  OnOffRows fused_rows;  // --fused both: (unfused, fused)
  for (const auto& [fuse, kv] : variants) {
    a.kv = kv;
    a.fuse = fuse;
    if (a.fused == "both") std::printf("\n#### fused Linears %s\n", fuse ? "on" : "off");
    std::vector<Results> results(layer_counts.size());
    for (size_t i = 0; i < layer_counts.size(); ++i) {
      ok = RunModel(a, base, layer_counts[i], &results[i]) && ok;
    }

    // Summary.
    std::printf("\n== decode step per layer (%s weights, %s KV; ms/layer from %d vs %d layers)\n",
                a.dtype.c_str(), KvDTypeName(kv), n1, n2);
    std::printf("%5s %7s %9s %9s %9s %8s %8s %8s %8s %9s %7s %7s\n", "batch", "context",
                (std::to_string(n1) + "L ms").c_str(), (std::to_string(n2) + "L ms").c_str(),
                "ms/layer", "fixed ms", "experts", "GB/layer", "GB/s", "roof ms", "of D2D",
                "of GEMV");
    for (int b : a.batches) {
      for (int s : a.contexts) {
        const CaseResult& r1 = results.front()[{b, s}];
        const CaseResult& r2 = results.back()[{b, s}];
        const LayerBytes lb = MinLayerBytes(c1, a.dtype, b, s, kv);
        double per_layer = 0, fixed = NAN;
        std::string note;
        if (r1.ran && r2.ran && n2 > n1) {
          per_layer = (r2.step_ms - r1.step_ms) / (n2 - n1);
          fixed = r1.step_ms - n1 * per_layer;
        } else if (r2.ran) {
          per_layer = r2.step_ms / n2;
          note = " (step / layers: includes embedding, lm_head, host)";
        } else if (r1.ran) {
          per_layer = r1.step_ms / n1;
          note = " (step / layers: includes embedding, lm_head, host)";
        } else {
          std::printf("%5d %7d   not run: %s\n", b, s, r2.why.empty() ? r1.why.c_str() : r2.why.c_str());
          continue;
        }
        per_layer_by_kv[kv == KvDType::kFp8 ? 1 : 0][{b, s}] = per_layer;
        if (a.fused == "both") {
          auto& row = fused_rows[{b, s, kv == KvDType::kFp8}];
          (fuse ? row.second : row.first) = per_layer;
        }
        if (a.ab_knob != nullptr && r1.ran && r2.ran && n2 > n1) {
          ab_rows[{b, s, kv == KvDType::kFp8}] = {(r2.step_ms_off - r1.step_ms_off) / (n2 - n1),
                                                  per_layer};
        }
        const double gbs = lb.total() / (per_layer * 1e-3) / 1e9;
        const double roof_ms = d2d > 0 ? lb.total() / (d2d * 1e9) * 1e3 : 0;
        char t1[32] = "-", t2[32] = "-";
        if (r1.ran) std::snprintf(t1, sizeof(t1), "%.3f", r1.step_ms);
        if (r2.ran) std::snprintf(t2, sizeof(t2), "%.3f", r2.step_ms);
        std::printf("%5d %7d %9s %9s %9.3f %8.3f %8.1f %8.3f %8.0f %9.3f %7.3f %7.3f%s%s\n", b, s,
                    t1, t2, per_layer, fixed,
                    lb.experts_hit, lb.total() / 1e9, gbs, roof_ms, d2d > 0 ? gbs / d2d : 0.0,
                    gemv > 0 ? gbs / gemv : 0.0, note.c_str(),
                    (r1.ran && !r1.finite) || (r2.ran && !r2.finite) ? " NON-FINITE LOGITS" : "");
      }
    }
  }
  if (a.fused == "both") {
    PrintOnOff(absl::StrCat("fused Linears on vs off, models loaded in this process (", a.dtype,
                            " weights)"),
               "unfused", "fused", fused_rows);
  }
  if (a.ab_knob != nullptr) {
    PrintOnOff(absl::StrCat(a.ab_knob->what, ": on vs off, same models, alternating rounds (",
                            a.dtype, " weights)"),
        "off", "on", ab_rows);
  }
  if (kv_list.size() == 2) {
    std::printf("\n== fp8 KV vs fp32 KV in this process (%s weights): ms/layer\n",
                a.dtype.c_str());
    std::printf("%5s %7s %10s %10s %8s %12s %12s\n", "batch", "context", "fp32 KV", "fp8 KV",
                "fp8/fp32", "KV GB fp32", "KV GB fp8");
    for (int b : a.batches) {
      for (int s : a.contexts) {
        const auto f = per_layer_by_kv[0].find({b, s}), e = per_layer_by_kv[1].find({b, s});
        if (f == per_layer_by_kv[0].end() || e == per_layer_by_kv[1].end()) continue;
        std::printf("%5d %7d %10.3f %10.3f %8.3f %12.4f %12.4f\n", b, s, f->second, e->second,
                    e->second / f->second,
                    MinLayerBytes(c1, a.dtype, b, s, KvDType::kF32).kv / 1e9,
                    MinLayerBytes(c1, a.dtype, b, s, KvDType::kFp8).kv / 1e9);
      }
    }
  }
  const LayerBytes one = MinLayerBytes(c1, a.dtype, 1, a.contexts.front());
  std::printf("bytes per layer at batch 1, context %d: attention %.3f GB, indexer %.3f GB, router "
              "%.3f GB, %.1f routed experts %.3f GB, shared expert %.3f GB, KV %.4f GB\n",
              a.contexts.front(), one.attn_weights / 1e9, one.indexer_weights / 1e9,
              one.router / 1e9, one.experts_hit, one.experts / 1e9, one.shared / 1e9,
              one.kv / 1e9);
  std::printf("experts = expected distinct routed experts for uniform routing, n * (1 - (1 - k/n)^"
              "batch) with n = %d, k = %d (the random router is not forced to be uniform).\n",
              c1.n_routed_experts, c1.num_experts_per_tok);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace glm::engine

int main(int argc, char** argv) { return glm::engine::Main(argc, argv); }
