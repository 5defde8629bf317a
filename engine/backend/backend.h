// The ops the model's layers need, on memory the backend owns. The same model code runs on every
// backend (cpu now, cuda next): layers never touch raw device APIs.
//
// Contract (all backends):
// - Memory: Allocate() returns backend memory (host memory on cpu, device memory on cuda). Views
//   below (MatView, HeadsView, int pointers) point into such memory. Allocation happens at setup
//   or when a workspace grows; a forward step on a device backend only carves views out of memory
//   reserved beforehand, so a decode step can be captured as a CUDA graph (no allocation, no
//   host-side shape-dependent work beyond filling the int tables passed to the ops).
// - Ops are enqueued in order on the backend's stream and may run asynchronously; CopyToHost and
//   Synchronize() wait. The cpu backend runs each op to completion, multi-threaded inside.
// - Every op takes its shapes from the views; preconditions (matching shapes, strides) are checked
//   by the caller at setup, not per op (hot path). All arithmetic is fp32 with fp32 accumulation,
//   except Linear with a narrow weight (WeightDType; bf16 / fp8 inputs, fp32 accumulation) and
//   the weight-only narrow ops (MoeExperts, AbsorbPerHead: weights widened exactly, x fp32).
// - A Backend is used from one thread at a time (the engine's step thread).
// - Errors: ops return void (hot path). A device backend keeps the first failure (CUDA error,
//   kernel launch check, cuBLAS error, out of memory) in status() and skips every later op; the
//   model returns status() after each step and after loading, so the engine fails fast with that
//   message. The cpu backend's ops cannot fail (status() is always OK).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/kv_fp8_layout.h"
#include "kernels/kernel_policy.h"
#include "kernels/sample_rule.h"

namespace glm::engine {

class DeviceStream;  // engine/dist/device_stream.h

// Backend memory; freed when destroyed.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  float* f32() { return static_cast<float*>(data()); }
  int32_t* i32() { return static_cast<int32_t*>(data()); }
};

// How a Linear weight is stored (MatView::dtype). Activations, norms, biases and embeddings are
// always fp32; only weights passed as Linear's `w` or in ExpertWeights may be narrower.
enum class WeightDType : uint8_t {
  kF32,             // float elements
  kBF16,            // bf16 elements (data points at them; ld counts bf16 elements)
  kF8E4M3Block128,  // e4m3 bytes with fp32 block scales: W[i][j] = q[i][j] * scales[(i / 128) *
                    // scale_ld + j / 128] (DeepSeek-V3 / GLM-5 weight_scale_inv, a multiplier)
  // 4/8-bit checkpoint formats kept as stored (../shared/specs/quantized-checkpoints.md). `data`
  // points at the packed rows and `ld` is their stride in BYTES; `group_scales` has
  // [rows, scale_ld] entries; W[i][j] = q[i][j] * s[i * scale_ld + j / group_size] (* global_scale
  // for kNvfp4), computed in fp32 (exact). A per-channel weight has group_size == cols.
  kInt4,   // compressed-tensors pack-quantized INT4: int32 words, 8 codes each, low bits first,
           // q = u - 8; group_scales bf16
  kInt8,   // likewise INT8: 4 codes per word, q = u - 128; group_scales bf16
  kNvfp4,  // ModelOpt NVFP4: bytes of 2 e2m1 codes (even element in the low nibble);
           // group_scales e4m3 bytes, group_size 16; global_scale = weight_scale_2
};
inline constexpr int kNumWeightDTypes = 6;
// kInt4, kInt8 or kNvfp4.
inline bool IsQuantizedWeight(WeightDType d) {
  return d == WeightDType::kInt4 || d == WeightDType::kInt8 || d == WeightDType::kNvfp4;
}

// A row-major fp32 matrix view [rows, cols] with row stride `ld` (elements, >= cols).
// A Linear weight may instead be stored as `dtype` (see WeightDType; `data` then points at the
// bf16 / e4m3 elements or the packed 4/8-bit rows and must not be dereferenced as floats; for the
// quantized dtypes `ld` counts bytes). Rows()/Cols()/Row() are for fp32 views only.
struct MatView {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  WeightDType dtype = WeightDType::kF32;
  const float* scales = nullptr;  // kF8E4M3Block128: [ceil(rows / 128), scale_ld] fp32
  int64_t scale_ld = 0;           // >= ceil(cols / 128); quantized dtypes: group_scales' row
                                  // stride in scale entries, >= ceil(cols / group_size)
  // Quantized dtypes (IsQuantizedWeight) only: their scales as stored (bf16 or e4m3 bytes), the
  // inputs per scale and the per-tensor scale. Backend memory like data.
  const void* group_scales = nullptr;
  int64_t group_size = 0;
  float global_scale = 1.0f;

  MatView Rows(int64_t first, int64_t n) const { return {data + first * ld, n, cols, ld}; }
  MatView Cols(int64_t first, int64_t n) const { return {data + first, rows, n, ld}; }
  float* Row(int64_t r) const { return data + r * ld; }
};

// A per-head view [rows, heads, dim]: element (r, h, d) at data[r * row_stride + h * head_stride
// + d]. head_stride == 0 broadcasts one head to all (MLA's shared k_pe / latent key).
struct HeadsView {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;

  float* At(int64_t r, int64_t h) const { return data + r * row_stride + h * head_stride; }
  // Dims [first, first + n) of every head.
  HeadsView Dims(int64_t first, int64_t n) const {
    return {data + first, rows, heads, n, row_stride, head_stride};
  }
  MatView Head(int64_t h) const { return {data + h * head_stride, rows, dim, row_stride}; }
  HeadsView Rows(int64_t first, int64_t n) const {
    return {data + first * row_stride, n, heads, dim, row_stride, head_stride};
  }
};

// Which keys each query row may see. Key rows live in a key tensor (the paged cache, or a
// per-sequence gathered buffer); logical position p of the query's sequence is key row
// slots[row_offset[t] + p]. Query row t sees logical positions [0, row_num_keys[t]) (causal).
// All arrays are backend memory.
struct KeyTable {
  const int32_t* slots = nullptr;         // [sum over sequences of their key counts]
  const int32_t* row_offset = nullptr;    // [num_rows]
  const int32_t* row_num_keys = nullptr;  // [num_rows]
  int32_t max_num_keys = 0;               // max over rows (sizes scratch)
};

// One layer's fp8 paged KV caches (KvDType::kFp8); byte layouts and the quantization rule in
// engine/backend/kv_fp8_layout.h. Backend memory; data == nullptr means "not used".
struct Fp8LatentCache {
  uint8_t* data = nullptr;  // [num_slots, kv_fp8::LatentRowBytes(kv_lora_rank, rope_dim)]
  int64_t num_slots = 0;
  int32_t kv_lora_rank = 0;
  int32_t rope_dim = 0;
};
struct Fp8IndexCache {
  uint8_t* data = nullptr;  // num_slots / block_size blocks of block_size * (dim + 4) bytes
  int64_t num_slots = 0;    // a multiple of block_size
  int32_t dim = 0;
  int32_t block_size = 0;
};

// DSA lightning indexer scoring + causal top-k (spec §3.3 steps 5-7):
//   I[t, s] = sum_h w[t, h] * weight_scale * relu(q[t, h] . k[s] * score_scale),  s < num_keys(t)
//   out[t, :] = logical positions of the min(top_k, num_keys(t)) largest I[t, .], then -1.
// Ties go to the lower position. When num_keys(t) <= top_k every position is selected and no
// score is computed.
struct IndexerTopKArgs {
  HeadsView q;        // [num_rows, index_n_heads, index_head_dim] (roped)
  MatView weights;    // [num_rows, index_n_heads] (weights_proj output)
  MatView keys;       // [num_key_rows, index_head_dim] (the indexer key cache)
  // fp8 key cache: when keys_fp8.data is set the keys come from it (keys.cols still gives the
  // dim, keys.data is ignored): k[s][d] = float(e4m3 value) * the token's scale, exact in fp32;
  // q and weights stay fp32 and the score is the formula above on those keys.
  Fp8IndexCache keys_fp8;
  KeyTable table;
  float weight_scale = 1.0f;  // index_n_heads^-0.5
  float score_scale = 1.0f;   // index_head_dim^-0.5
  int32_t top_k = 0;
  int32_t* out = nullptr;     // [num_rows, top_k] logical positions, -1 padded
};

// Sparse multi-head attention with split query/key parts (MLA, spec §3.2), per query row t and
// head h over the selected logical positions p (indices[t, i] != -1, or all p < num_keys(t) when
// indices is null), key row r = slot(t, p):
//   s_p = (q_a[t,h] . k_a[r,h] + q_b[t,h] . k_b[r,h]) * scale;  P = softmax_p(s);
//   out[t,h] = sum_p P_p v[r,h].
// Expanded form: q_a = q_nope, k_a = k_nope (per head), q_b = q_pe, k_b = k_pe (broadcast),
// v = per-head v. Absorbed form: q_a = q_nope W_UK, k_a = v = c_kv (broadcast), k_b = k_pe.
struct AttentionArgs {
  HeadsView q_a;   // [num_rows, num_heads, da]
  HeadsView q_b;   // [num_rows, num_heads, db]
  HeadsView k_a;   // [num_key_rows, num_heads or broadcast, da]
  HeadsView k_b;   // [num_key_rows, num_heads or broadcast, db]
  HeadsView v;     // [num_key_rows, num_heads or broadcast, dv]
  KeyTable table;
  const int32_t* indices = nullptr;  // [num_rows, index_width] logical positions, -1 padded
  int32_t index_width = 0;
  float scale = 1.0f;
  HeadsView out;   // [num_rows, num_heads, dv]
  // Absorbed form over an fp8 latent cache: when latent_fp8.data is set, k_a = v = the
  // dequantized c_kv and k_b = the dequantized k_pe of key row r (broadcast over heads); the
  // k_a / k_b / v views then only give dims (data ignored): da = dv = kv_lora_rank,
  // db = rope_dim.
  Fp8LatentCache latent_fp8;
};

// Routed experts of one MoE layer. Expert e's weights: gate[e], up[e] [moe_inter, hidden],
// down[e] [hidden, moe_inter]; arrays of num_experts views (backend memory behind the views).
// The views carry their WeightDType (all experts of a layer share one).
struct ExpertWeights {
  const MatView* gate = nullptr;
  const MatView* up = nullptr;
  const MatView* down = nullptr;
  int32_t num_experts = 0;
};

// Device memory as the backend sees it (cudaMemGetInfo on cuda), for memory planning.
struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
  int64_t workspace_bytes = 0;  // fixed workspaces the backend allocated at creation (cuBLASLt)
};

// MoeRoute's arguments (Backend::MoeRoute documents each) and outputs, for MoeRouteExperts.
struct MoeRouteArgs {
  const float* bias = nullptr;  // [num_experts] or null
  int n_group = 1, topk_group = 1, top_k = 0;
  bool renormalize = false;
  float scale = 1.0f;
  int appended = -1;
  int32_t* ids = nullptr;    // [rows, top_k (+ 1 when appended >= 0)], written
  float* weights = nullptr;  // likewise
};

// A recorded sequence of ops (a CUDA graph); see Backend::BeginCapture.
class BackendGraph {
 public:
  virtual ~BackendGraph() = default;
};

// Token selection on the backend (Backend::Sample). Every array is backend memory, [rows] each.
struct SampleArgs {
  MatView logits;                      // [rows, vocab] fp32
  const float* temperature = nullptr;  // <= 1e-5: greedy
  const int32_t* top_k = nullptr;      // 0 = off
  const float* top_p = nullptr;        // (0, 1]; 1 = off
  const uint64_t* seed = nullptr;      // the request's random stream
  const int64_t* index = nullptr;      // draw number (tokens the request generated before)
  int32_t* out_ids = nullptr;          // [rows]
  float* out_logprobs = nullptr;       // [rows] or null: log softmax(logits)[id]
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int num_threads() const = 0;
  // The first error any op or copy hit (sticky), OK if none. Ops after an error do nothing.
  virtual absl::Status status() const = 0;

  // Memory. Allocate zero-fills.
  virtual std::unique_ptr<Buffer> Allocate(size_t bytes) = 0;
  // Allocate for a table that may grow while serving and whose owner fails the step cleanly
  // when it cannot (the key-slot arena): out of memory returns nullptr (or an empty buffer)
  // and, unlike Allocate, leaves status() OK, so later steps still run. Default: Allocate.
  virtual std::unique_ptr<Buffer> TryAllocate(size_t bytes) { return Allocate(bytes); }
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void Synchronize() = 0;
  // Whether Allocate() returns host memory the caller may read and write directly once the ops
  // before have run (cpu: they run synchronously); false means device memory, reached through
  // CopyToHost / CopyToDevice only.
  virtual bool HostMemory() const { return false; }
  // The stream the ops are enqueued on, for a communicator that enqueues its collectives behind
  // them (NcclCommunicator: a TP all-reduce on device memory without a host round trip). Owned
  // by the backend and valid while it lives; nullptr on backends without one (cpu).
  virtual DeviceStream* device_stream() { return nullptr; }

  // Whether Linear's `w` and MoeExperts' weights may be stored as `dtype` (the model's loader
  // asks before keeping weights narrower than fp32). Default: fp32 only; the cpu backend takes
  // fp32 / bf16 / fp8 (the loader widens INT4 / INT8 / NVFP4 checkpoint weights for it), the
  // cuda backend every WeightDType (quantized ones: cuda_quant_linear.h).
  virtual bool SupportsWeightDType(WeightDType dtype) const { return dtype == WeightDType::kF32; }
  // Whether a quantized weight (IsQuantizedWeight(dtype)) of [rows, cols] with group_size inputs
  // per scale (cols for one scale per row) may be stored as `dtype`: the shape limits of the
  // backend's kernels (cuda: kernels/gemv_quant.h CheckQuantWeight, e.g. cols a multiple of 32
  // for INT4 / NVFP4). The loader widens weights it refuses. Default: SupportsWeightDType(dtype).
  virtual bool SupportsQuantizedShape(WeightDType dtype, int64_t rows, int64_t cols,
                                      int64_t group_size) const {
    (void)rows, (void)cols, (void)group_size;
    return SupportsWeightDType(dtype);
  }

  // y[M, N] = x[M, K] . w[N, K]^T (+ y when accumulate). w is a Linear weight [out, in], of any
  // dtype SupportsWeightDType accepts. With a bf16 weight x is rounded to bf16; with an fp8
  // block-scaled weight x is rounded to bf16 and quantized per row per 128 columns to e4m3
  // (kernels/quant_fp8_group.h); with an INT4 / INT8 / NVFP4 weight x is rounded to bf16 and
  // multiplies the exactly dequantized fp32 weight (a device backend may round the weight to
  // bf16 as well for many rows: cuda_quant_linear.h); products accumulate in fp32 and y is fp32
  // either way.
  virtual void Linear(const MatView& x, const MatView& w, const MatView& y, bool accumulate) = 0;
  // Per head h: y[:, h, :] = x[:, h, :] . w[h]^T, w[h] = weights + h * weight_head_stride
  // viewed as [out_dim, in_dim] with row stride w_ld (MLA absorption: W_UK^T, W_UV). fp32 weights
  // on every backend.
  virtual void LinearPerHead(const HeadsView& x, const float* weights, int64_t weight_head_stride,
                             int64_t w_ld, const HeadsView& y) = 0;
  // MLA absorption straight from kv_b_proj kept as a Linear weight w ([num_heads * head_rows,
  // cols], fp32 / bf16 / fp8 (the loader widens a quantized kv_b_proj to bf16); no transposed or
  // widened copy). Head h's block starts at weight row base(h) = h * head_rows + row_begin; for
  // every row t of x and head h:
  //   kRows (W_UK, absorbed query):  y[t,h,c] = sum_{d < x.dim} x[t,h,d] * W[base(h) + d, c],
  //                                   c < y.dim (<= w.cols)
  //   kCols (W_UV, absorbed output): y[t,h,j] = sum_{c < x.dim} x[t,h,c] * W[base(h) + j, c],
  //                                   j < y.dim, x.dim == w.cols
  // Weight-only numerics (unlike Linear, x is NOT rounded or quantized): each weight element is
  // widened exactly (bf16 -> fp32; fp8 -> float(q) * its block scale, one fp32 multiply), x stays
  // fp32, fp32 accumulation: fp32 math on the widened weight up to the order of summation.
  // y is overwritten; x.heads == y.heads, base(h) + the block's rows <= the weight's rows.
  enum class PerHeadContract : uint8_t { kRows, kCols };
  virtual void AbsorbPerHead(const HeadsView& x, const MatView& w, int64_t head_rows,
                             int64_t row_begin, PerHeadContract contract,
                             const HeadsView& y) = 0;
  // AbsorbPerHead, where the caller knows that the op just before this one on the backend
  // neither reads nor writes x or y and that x was complete before it began: a device backend
  // may then run the two concurrently (cuda: beside the indexer's last kernel, when that was the
  // previous op; otherwise in order). The same y either way.
  virtual void AbsorbPerHeadBesidePrevious(const HeadsView& x, const MatView& w, int64_t head_rows,
                                           int64_t row_begin, PerHeadContract contract,
                                           const HeadsView& y) {
    AbsorbPerHead(x, w, head_rows, row_begin, contract, y);
  }
  // y = w * x * rsqrt(mean(x^2) + eps), per row. y may alias x.
  virtual void RmsNorm(const MatView& x, const float* w, float eps, const MatView& y) = 0;
  // RmsNorm(x, norm_w, eps, normed), then Linear(normed, w, y, accumulate): one op so that a
  // device backend may normalize inside the Linear's kernel (cuda: the decode GEMV of few tokens,
  // one launch fewer on a batch-1 step's critical path). normed ([x.rows, x.cols]) must not
  // overlap x or y; it holds RmsNorm(x) afterwards, and y is the same, either way.
  virtual void RmsNormLinear(const MatView& x, const float* norm_w, float eps,
                             const MatView& normed, const MatView& w, const MatView& y,
                             bool accumulate) {
    RmsNorm(x, norm_w, eps, normed);
    Linear(normed, w, y, accumulate);
  }
  // y = (x - mean) * rsqrt(var + eps) * w + b, per row (biased variance). y may alias x.
  virtual void LayerNorm(const MatView& x, const float* w, const float* b, float eps,
                         const MatView& y) = 0;
  // Interleaved (GPT-J) RoPE in place on dims [0, 2 * num_freqs) of every head: pair (2i, 2i+1)
  // rotates by positions[row] * inv_freq[i]. inv_freq: [num_freqs].
  virtual void RopeInterleaved(const HeadsView& x, const int32_t* positions,
                               const float* inv_freq, int num_freqs) = 0;
  // RopeInterleaved on a, then on b (the same rows and positions; a and b must not overlap):
  // one op so that a device backend may rotate both in one launch (cuda: when they share a row
  // stride, e.g. the query and the indexer query, both in q_b's output).
  virtual void RopeInterleavedBoth(const HeadsView& a, const HeadsView& b, const int32_t* positions,
                                   const float* inv_freq, int num_freqs) {
    RopeInterleaved(a, positions, inv_freq, num_freqs);
    RopeInterleaved(b, positions, inv_freq, num_freqs);
  }
  // out = silu(gate) * up, elementwise. out may alias gate.
  virtual void SiluMul(const MatView& gate, const MatView& up, const MatView& out) = 0;
  // y = value.
  virtual void Fill(const MatView& y, float value) = 0;
  // y += x.
  virtual void Add(const MatView& x, const MatView& y) = 0;
  // y = x.
  virtual void Copy(const MatView& x, const MatView& y) = 0;
  // out[i] = src[rows[i]] for i < out.rows (embedding lookup, KV gather, row selection).
  virtual void GatherRows(const MatView& src, const int32_t* rows, const MatView& out) = 0;
  // dst[rows[i]] = src[i] for i < src.rows (paged KV write).
  virtual void ScatterRows(const MatView& src, const int32_t* rows, const MatView& dst) = 0;

  virtual void IndexerTopK(const IndexerTopKArgs& args) = 0;
  virtual void Attention(const AttentionArgs& args) = 0;

  // fp8 KV cache writes and reads (KvDType::kFp8, layouts in kv_fp8_layout.h). The model's
  // ScatterRows into the cache becomes these. Quantizing paged writes: src row i goes to slot
  // slots[i] (src [n, kv_lora_rank + rope_dim] fp32 c_kv | roped k_pe; src [n, dim] fp32
  // indexer keys). GatherLatentFp8: out[i] = dequantized latent of slot slots[i], out
  // [n, kv_lora_rank + rope_dim] fp32 (the expanded/prefill form's key gather).
  virtual void WriteLatentFp8(const MatView& src, const int32_t* slots,
                              const Fp8LatentCache& dst) = 0;
  virtual void WriteIndexKeysFp8(const MatView& src, const int32_t* slots,
                                 const Fp8IndexCache& dst) = 0;
  virtual void GatherLatentFp8(const Fp8LatentCache& src, const int32_t* slots,
                               const MatView& out) = 0;

  // MoE router (spec §3.4): s = sigmoid(logits); c = s + bias; with n_group > 1 only experts of
  // the topk_group groups with the largest sum of their top-2 c compete; choose top_k of c
  // (ties: lower expert); weight = s[chosen] (no bias), divided by (sum + 1e-20) when
  // renormalize, times scale. logits [num_rows, num_experts]; ids/weights [num_rows, top_k].
  // appended >= 0: ids/weights rows hold top_k + 1 entries, the last (appended, 1.0f): a shared
  // expert that MoeExperts then computes with the routed ones (no part in choice or renormalize).
  virtual void MoeRoute(const MatView& logits, const float* bias, int n_group, int topk_group,
                        int top_k, bool renormalize, float scale, int appended, int32_t* ids,
                        float* weights) = 0;
  // out[t] += sum_j weights[t, j] * down[e](silu(gate[e] x[t]) * up[e] x[t]), e = ids[t, j].
  // Narrow expert weights (SupportsWeightDType) are widened to fp32 inside the op; x stays fp32.
  // (cuda with INT4 / INT8 / NVFP4 experts: widened to bf16 first, cuda_quant_linear.h.)
  virtual void MoeExperts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                          const ExpertWeights& experts, const MatView& out) = 0;
  // MoeRoute(logits, r...) into r.ids / r.weights, then MoeExperts(x, r.ids, r.weights, k,
  // experts, out) with k = r.top_k (+ 1 when r.appended >= 0): one op so that a device backend
  // may route inside the experts' first kernel (cuda: decode steps of few tokens, one launch
  // fewer). The same ids, weights and out either way; ids and weights are always written.
  virtual void MoeRouteExperts(const MatView& logits, const MoeRouteArgs& r, const MatView& x,
                               const ExpertWeights& experts, const MatView& out) {
    MoeRoute(logits, r.bias, r.n_group, r.topk_group, r.top_k, r.renormalize, r.scale, r.appended,
             r.ids, r.weights);
    MoeExperts(x, r.ids, r.weights, r.top_k + (r.appended >= 0 ? 1 : 0), experts, out);
  }

  // One token per logits row by the rule of kernels/sample_rule.h (engine/sample SampleToken
  // without banned tokens), so every backend returns the same ids from the same logits, seeds and
  // indices. The default runs the host rule on host copies (right for any backend; the cpu
  // backend uses it as is); device backends override it with a kernel (cuda: kernels/sample.h).
  virtual void Sample(const SampleArgs& args);

  // ---- Setup-time facilities of device backends; the defaults fit the cpu backend.
  // Device memory (free / total / fixed workspaces). Unimplemented on host backends.
  virtual absl::Status MemoryInfo(DeviceMemoryInfo* info) {
    (void)info;
    return absl::UnimplementedError(name() + " backend reports no device memory");
  }
  // Per-launch validation of the pointers ops receive (driver queries on cuda). On by default; a
  // caller whose pointers all come from Allocate() turns it off once a first step succeeded
  // (the hot path then does no per-launch driver query; graph capture needs that too).
  virtual void SetPointerChecks(bool on) { (void)on; }
  // The kernel paths a device backend takes (kernels/kernel_policy.h); CreateBackend sets the
  // first one. A change moves scratch_epoch(), so graphs captured under the old policy are
  // recaptured. Call between steps. Backends with one path per op ignore it.
  virtual void SetKernelPolicy(const kernels::KernelPolicy& policy) { (void)policy; }
  // Graph capture: ops enqueued between BeginCapture and EndCapture are recorded, not run;
  // ReplayGraph runs the recording again on the same memory with whatever those buffers hold
  // then. Nothing may allocate or grow while capturing (run the same step eagerly first).
  // EndCapture returns null after a failure (status() says why). A graph stays valid while
  // scratch_epoch() is unchanged: the epoch moves whenever backend-internal scratch memory is
  // reallocated (a step larger than any before) or the backend's launch settings change, and a
  // graph of an older epoch must be recaptured. Backends without graphs return false from
  // SupportsGraphs.
  virtual bool SupportsGraphs() const { return false; }
  virtual void BeginCapture() {}
  virtual std::unique_ptr<BackendGraph> EndCapture() { return nullptr; }
  virtual void ReplayGraph(BackendGraph& graph) { (void)graph; }
  virtual int64_t scratch_epoch() const { return 0; }

  // Concurrency inside a step. Ops enqueued between BeginSide() and EndSide() form a side branch:
  // it starts after every op enqueued before BeginSide() and may run concurrently with the ops
  // enqueued after EndSide(), until JoinSide(), after which every op also waits for the branch
  // (Synchronize, CopyToHost and EndCapture join first). Only ops that use no backend scratch may
  // be on a branch: the norms, RoPE, the KV writes and gathers, Fill, Add, SiluMul, MoeRoute (a
  // device backend records an error for Linear, the per-head products, IndexerTopK, Attention,
  // MoeExperts, Sample and the synchronizing calls). The branch and the ops concurrent with it
  // must not touch the same bytes. Results do not depend on the overlap. Branches do not nest.
  // Defaults (cpu): everything runs in order.
  virtual void BeginSide() {}
  virtual void EndSide() {}
  virtual void JoinSide() {}
};

inline void Backend::Sample(const SampleArgs& a) {
  const int64_t rows = a.logits.rows, vocab = a.logits.cols, ld = a.logits.ld;
  if (rows <= 0) return;
  std::vector<float> logits(static_cast<size_t>((rows - 1) * ld + vocab)), t(rows), p(rows);
  std::vector<int32_t> k(rows), ids(rows);
  std::vector<uint64_t> seed(rows);
  std::vector<int64_t> index(rows);
  std::vector<float> lp(rows);
  CopyToHost(logits.data(), a.logits.data, logits.size() * sizeof(float));
  CopyToHost(t.data(), a.temperature, rows * sizeof(float));
  CopyToHost(k.data(), a.top_k, rows * sizeof(int32_t));
  CopyToHost(p.data(), a.top_p, rows * sizeof(float));
  CopyToHost(seed.data(), a.seed, rows * sizeof(uint64_t));
  CopyToHost(index.data(), a.index, rows * sizeof(int64_t));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * ld;
    ids[r] = sample_rule::SampleRowHost(row, vocab, t[r], k[r], p[r], seed[r], index[r]);
    if (a.out_logprobs != nullptr) lp[r] = sample_rule::LogProbHost(row, vocab, ids[r]);
  }
  CopyToDevice(a.out_ids, ids.data(), rows * sizeof(int32_t));
  if (a.out_logprobs != nullptr) CopyToDevice(a.out_logprobs, lp.data(), rows * sizeof(float));
}

// The reference CPU backend (engine/backend/cpu). num_threads 0 = hardware concurrency.
std::unique_ptr<Backend> CreateCpuBackend(int num_threads);

}  // namespace glm::engine
