// The layers of GlmMoeDsaForCausalLM (spec §3), written against the Backend ops only. Each layer
// owns its weights (backend memory) and runs on the rows of one forward step (StepContext).
// Shapes: T = rows of the step (new tokens of all sequences), H = hidden_size.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/config/model_config.h"
#include "engine/model/tp.h"
#include "engine/model/weight_source.h"

namespace glm::engine {

// Scratch memory for one forward step, carved from backend buffers that persist across steps:
// after the first step of a given size no allocation happens. Reset() at the start of a step.
// Carving is deterministic, so two steps of the same shape get the same addresses for every
// view: what a CUDA graph captured for one decode step stays valid on replay.
class Workspace {
 public:
  explicit Workspace(Backend* backend) : backend_(backend) {}
  void Reset() {
    chunk_ = 0;
    offset_ = 0;
  }
  MatView Mat(int64_t rows, int64_t cols) {
    return {static_cast<float*>(Take(rows * cols * sizeof(float))), rows, cols, cols};
  }
  int32_t* Ints(int64_t n) { return static_cast<int32_t*>(Take(n * sizeof(int32_t))); }
  float* Floats(int64_t n) { return static_cast<float*>(Take(n * sizeof(float))); }

 private:
  void* Take(size_t bytes);

  Backend* backend_;
  std::vector<std::unique_ptr<Buffer>> chunks_;
  size_t chunk_ = 0;
  size_t offset_ = 0;
};

// A parameter in backend memory. view.dtype says how a Linear weight is stored (fp32 for every
// other parameter); scale_buffer holds the block scales of an fp8 weight.
struct DeviceMatrix {
  std::unique_ptr<Buffer> buffer;
  std::unique_ptr<Buffer> scale_buffer;
  MatView view;  // [rows, cols]
  const float* data() const { return view.data; }
};

// How WeightLoader::Linear stores Linear weights (ModelLoadOptions::weight_dtype).
enum class LinearWeightMode {
  kF32,   // "fp32": everything fp32 (the reference; quantized checkpoints dequantized exactly)
  kBF16,  // "bf16": every Linear weight bf16 (fp8 / INT4 / INT8 / NVFP4 checkpoints dequantized,
          // then rounded)
  kAuto,  // "auto": e4m3 + 128x128 scales kept where the checkpoint has them, INT4 / INT8 /
          // NVFP4 kept as stored where the backend takes them (SupportsWeightDType: cuda), else
          // bf16
};
// Parses "fp32" | "bf16" | "auto"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<LinearWeightMode> ParseLinearWeightMode(const std::string& s);

// Bytes of backend memory the loaded parameters take (weights only; no KV, no workspace).
struct WeightBytes {
  int64_t total = 0;          // every parameter, incl. scales and fp32 copies
  int64_t linear = 0;         // Linear weights loaded through WeightLoader::Linear, as stored
  int64_t linear_fp32 = 0;    // the same weights in fp32 (rows * cols * 4)
  int64_t fp8_scales = 0;     // block scales of fp8 weights (included in linear and total)
  int64_t fp8_payload = 0;    // e4m3 bytes of fp8 weights (included in linear and total)
  // INT4 / INT8 / NVFP4 weights kept as stored: packed rows (row stride padded to 16 bytes) and
  // their scales (rows padded to 16 bytes); included in linear and total.
  int64_t quant_payload = 0;
  int64_t quant_scales = 0;
  // Linear weights per WeightDType (f32, bf16, fp8, int4, int8, nvfp4).
  int64_t num_linear[kNumWeightDTypes] = {};
};

// One tensor of a Linear weight made of parts (WeightLoader::LinearRows, FusedLinear): the
// checkpoint tensor `name`, [rows, cols] whole, of which this rank loads its `split` share.
// keep_quantized = false widens an INT4 / INT8 / NVFP4 tensor even where the backend takes it
// as stored (weights that also feed ops other than Linear: MLA's kv_b_proj).
struct LinearPart {
  std::string name;
  int64_t rows = 0;
  TpSplit split = TpSplit::kReplicated;
  bool keep_quantized = true;
};

// Reads parameters from a WeightSource, checks their shapes, and copies them to the backend.
// Tensor parallelism: with set_tp, a Linear weight loaded with a TpSplit other than kReplicated
// is this rank's share only (tp.h), read as a slice from the source (never the whole tensor
// then cut, on checkpoint files). Shapes passed in are always the whole tensor's (config.json's);
// the DeviceMatrix has the rank's shape. Everything else (Matrix, Vector) is replicated.
class WeightLoader {
 public:
  WeightLoader(WeightSource& source, Backend* backend,
               LinearWeightMode mode = LinearWeightMode::kF32)
      : source_(source), backend_(backend), mode_(mode) {}
  // A tensor of shape [rows, cols] in fp32 (embeddings, the router, weights used per head).
  absl::StatusOr<DeviceMatrix> Matrix(const std::string& name, int64_t rows, int64_t cols);
  // A Linear weight [out, in] = [rows, cols] stored as the loader's mode says: fp32; bf16 (row
  // stride rounded up to 8 elements, 16-byte rows); or e4m3 + fp32 block scales (mode kAuto, the
  // tensor is e4m3 with 128x128 scales in the checkpoint and cols % 16 == 0; scale_ld rounded up
  // to 4), else bf16. In mode kAuto an INT4 / INT8 (bf16 scales) / NVFP4 checkpoint tensor
  // stays as stored (MatView quantized dtypes: packed rows and scales copied byte for byte, rows
  // padded to 16 bytes, scale rows to 16 bytes) when the backend SupportsWeightDType it; else it
  // is dequantized exactly and stored as the mode says (bf16 in kAuto; also where the backend
  // refuses the shape: Backend::SupportsQuantizedShape). With a split, this
  // rank's [rows / tp_size, cols] (column-parallel) or [rows, cols / tp_size] (row-parallel); an
  // fp8 share keeps e4m3 only where it is made of whole 128 x 128 scale blocks, a quantized
  // share stays as stored only where it is made of whole groups and packed words
  // (QuantizedSliceAligned); else bf16, dequantized from the slice.
  absl::StatusOr<DeviceMatrix> Linear(const std::string& name, int64_t rows, int64_t cols,
                                      TpSplit split = TpSplit::kReplicated);
  // How Linear() stores `part` of `cols` columns (whole) in this loader's mode.
  WeightDType LinearKind(const LinearPart& part, int64_t cols) const;
  // Linear weights [rows_i, cols] that multiply the same input, concatenated by rows into one
  // weight stored as Linear() stores each of them (every part must have the same LinearKind; a
  // quantized kind takes one part only: NVFP4 gate and up each keep their own global scale, and
  // one view has one, so quantized weights are never fused).
  // An fp8 weight's parts each start on a 128-row boundary (so that no two parts share a block
  // scale; the rows between are zero, with the preceding part's scales); others are packed.
  // offsets (when non-null) receives each part's first row. Each part counts as one Linear in
  // bytes(); the padding rows only in bytes().total.
  absl::StatusOr<DeviceMatrix> LinearRows(const std::vector<LinearPart>& parts, int64_t cols,
                                          std::vector<int64_t>* offsets = nullptr);
  // A 1-D tensor of `size` elements, viewed as [1, size].
  absl::StatusOr<DeviceMatrix> Vector(const std::string& name, int64_t size);
  // Host copy of a tensor (load-time transforms such as MLA absorption): [rows, cols], or this
  // rank's share of it for a split (as Linear).
  absl::StatusOr<std::vector<float>> Host(const std::string& name, int64_t rows, int64_t cols,
                                          TpSplit split = TpSplit::kReplicated);
  DeviceMatrix Upload(const std::vector<float>& data, int64_t rows, int64_t cols);
  // Upload of a Linear weight read with Host() (kept in fp32): counted in bytes() as a Linear.
  DeviceMatrix UploadLinearF32(const std::vector<float>& data, int64_t rows, int64_t cols);
  bool Has(const std::string& name) const { return source_.Has(name); }
  LinearWeightMode mode() const { return mode_; }
  // Whether FusedLinear::Load fuses parts (default) or loads each as its own Linear (A/B runs).
  void set_fuse(bool fuse) { fuse_ = fuse; }
  bool fuse() const { return fuse_; }
  // Whether MLA keeps kv_b_proj in fp32 with a W_UK^T copy on every model (the fp32 models' path;
  // kernels::AttentionPolicy::absorb_fp32, tests / benches) or only on fp32 models (default).
  void set_absorb_fp32(bool on) { absorb_fp32_ = on; }
  bool absorb_fp32() const { return absorb_fp32_; }
  // This rank's place in the TP group (default: one rank, everything whole).
  void set_tp(TpShard tp) { tp_ = tp; }
  const TpShard& tp() const { return tp_; }
  const WeightBytes& bytes() const { return bytes_; }

 private:
  // The block of a whole [rows, cols] tensor this rank loads for `split` ([rows, cols] of the
  // block in *local_rows / *local_cols); InvalidArgument when the split dimension does not
  // divide by tp_size.
  absl::StatusOr<TensorSlice> Share(const std::string& name, int64_t rows, int64_t cols,
                                    TpSplit split, int64_t* local_rows, int64_t* local_cols) const;
  // The quantized dtype `part` keeps in mode kAuto (see Linear), or nullopt.
  std::optional<WeightDType> QuantizedKind(const LinearPart& part, int64_t cols) const;

  WeightSource& source_;
  Backend* backend_;
  LinearWeightMode mode_;
  bool fuse_ = true;
  bool absorb_fp32_ = false;
  TpShard tp_;
  WeightBytes bytes_;
};

// Per-step row bookkeeping shared by all layers (device arrays unless said otherwise).
struct SeqRows {  // host
  int64_t row_begin = 0;   // first row of this sequence in the step
  int64_t num_rows = 0;    // new tokens
  int64_t start_pos = 0;   // positions < start_pos are cached
  int64_t key_offset = 0;  // offset of its key slots in KeyTable::slots
  bool expanded = false;   // expanded (kv_b_proj) attention form for this sequence
};

struct StepContext {
  Backend* backend = nullptr;
  Workspace* ws = nullptr;
  const ModelConfig* config = nullptr;
  int64_t num_rows = 0;                 // T
  const int32_t* positions = nullptr;   // [T]
  const int32_t* new_slots = nullptr;   // [T] cache rows the new tokens are written to
  KeyTable table;                       // cache rows of every visible position, per row
  const int32_t* identity = nullptr;    // [max keys] 0, 1, 2, ... (expanded-form key table)
  const int32_t* zeros = nullptr;       // [T]
  const float* inv_freq = nullptr;      // [qk_rope_head_dim / 2]
  std::vector<SeqRows> seqs;            // host
  TpGroup* tp = nullptr;                // the TP group; null: one rank
  bool all_absorbed = true;             // no sequence uses the expanded form
  int32_t* topk = nullptr;              // [T, index_topk] current top-k (IndexShare carries it)
  bool topk_valid = false;              // a full indexer ran earlier in this step
};

// One layer's paged KV: latent rows [num_slots, kv_lora_rank + qk_rope_head_dim] (c_kv normed,
// k_pe roped, interleaved pair order) and, on full-indexer layers, indexer keys
// [num_slots, index_head_dim]. num_slots = num_blocks * block_size; slot = block * bs + offset.
// With KvDType::kFp8 the same rows live in latent_fp8 / index_fp8 instead (layouts in
// engine/backend/kv_fp8_layout.h) and latent / index_keys are empty.
struct LayerKv {
  KvDType dtype = KvDType::kF32;
  MatView latent;
  MatView index_keys;  // rows == 0 when the layer has no indexer
  Fp8LatentCache latent_fp8;
  Fp8IndexCache index_fp8;  // num_slots == 0 when the layer has no indexer
};

struct RmsNormLayer {
  DeviceMatrix weight;
  float eps = 1e-5f;
  void Forward(StepContext& ctx, const MatView& x, const MatView& y) const {
    ctx.backend->RmsNorm(x, weight.data(), eps, y);
  }
};

// Linear weights that multiply the same input (q_a | kv_a | indexer wk | indexer weights_proj;
// q_b | indexer wq_b; an MLP's gate | up), stored together so that one Linear computes them all:
// one launch and one weight stream instead of one per weight (at batch 1 a decode step is a chain
// of short dependent kernels, and each costs microseconds of launch and ramp-up besides its
// bytes). Consecutive parts stored the same way (WeightLoader::LinearKind; an fp8 checkpoint may
// keep some tensors in bf16) form one group, one Linear each; an INT4 / INT8 / NVFP4 part is a
// group of its own (WeightLoader::LinearRows). The output is one [T, out_cols()]
// matrix whose columns Part(out, i) are part i's outputs; columns between parts (fp8 row padding)
// are zeros nobody reads. Each output element is the same dot product as with separate weights
// (bit for bit on the CPU; a device kernel may split the sum differently for the fused shape).
class FusedLinear {
 public:
  static absl::StatusOr<FusedLinear> Load(WeightLoader& w, const std::vector<LinearPart>& parts,
                                          int64_t cols);
  // x: [T, cols]; out: [T, out_cols()].
  void Forward(StepContext& ctx, const MatView& x, const MatView& out) const;
  // Forward(RmsNorm(x, norm_w, eps)), with the norm inside the first group's Linear where the
  // backend can (Backend::RmsNormLinear); normed ([T, cols], apart from x and out) holds the
  // normed x afterwards.
  void ForwardNormed(StepContext& ctx, const MatView& x, const float* norm_w, float eps,
                     const MatView& normed, const MatView& out) const;
  int64_t out_cols() const { return out_cols_; }
  size_t num_groups() const { return groups_.size(); }
  // Part i's columns of `out`: [T, rows of part i].
  MatView Part(const MatView& out, size_t i) const { return out.Cols(offsets_[i], rows_[i]); }
  // Part i's weight: [rows of part i, cols], a view into its group's storage (any WeightDType;
  // fp8 parts start on a 128-row scale block, so their block scales are a view too).
  MatView WeightPart(size_t i) const;

 private:
  struct Group {
    DeviceMatrix weight;     // [its parts' rows with padding, cols]
    int64_t out_offset = 0;  // first output column
  };
  std::vector<Group> groups_;
  std::vector<int64_t> offsets_, rows_;  // per part: first output column, columns
  int64_t out_cols_ = 0;
};

// SwiGLU: down(silu(gate x) * up x); gate and up as one FusedLinear. Tensor-parallel as the
// standard TP MLP: gate / up column-parallel, down row-parallel (inter_local = inter / tp_size).
struct DenseMlp {
  FusedLinear gate_up;  // parts: gate [inter_local, H], up [inter_local, H]
  DeviceMatrix down;    // [H, inter_local]
  static absl::StatusOr<DenseMlp> Load(WeightLoader& w, const std::string& prefix, int64_t hidden,
                                       int64_t inter);
  // out += mlp(x), summed over the TP group; x: [T, H], out: [T, H] (the residual stream).
  void Forward(StepContext& ctx, const MatView& x, const MatView& out) const;
  // This rank's partial sum of mlp(x) onto out: out += it when `accumulate`, else out = it. No
  // communication (the caller reduces: TpGroup).
  void Partial(StepContext& ctx, const MatView& x, const MatView& out, bool accumulate) const;
};

// Sigmoid-routed MoE with a shared expert (spec §3.4).
//
// Small steps (T <= shared_fold_max_tokens) compute the shared expert inside MoeExperts, as
// one more expert of every token with weight 1 (MoeRoute appends it), where its shape and storage
// match the routed experts' (GLM-5: one shared expert of moe_intermediate_size): at batch 1 that
// replaces three dependent launches (gate | up, SiluMul, down) by 37.7 MB more of the routed
// experts' weight stream. Same products; the sum is taken in the experts' combine instead of as
// its own accumulate (fp32 rounding order), and narrow weights multiply the fp32 x as MoeExperts
// does (Linear rounds x to bf16 / quantizes it to e4m3 first).
//
// Tensor parallelism: every rank holds all experts, each with its intermediate width split
// (gate / up [inter / tp_size, H], down [H, inter / tp_size]), the shared expert likewise; the
// routed and shared experts' partial sums meet in one all-reduce (TpGroup).
struct Moe {
  DeviceMatrix router;  // [n_routed_experts, H], fp32 (routing is computed in fp32)
  DeviceMatrix bias;    // [1, n_routed_experts] e_score_correction_bias
  std::vector<DeviceMatrix> expert_weights;  // gate, up, down of each routed expert (MoeExperts)
  // Routed experts' views, then (when shared_folds) the shared expert's at index num_routed.
  std::vector<MatView> gate_views, up_views, down_views;
  int32_t num_routed = 0;
  bool shared_folds = false;  // the shared expert can run as expert num_routed of MoeExperts
  // Steps of at most this many rows fold the shared expert into MoeExperts; 0 never. 64: H200,
  // fp8, glm-bench-cuda-decode folded vs not, ms/layer x0.99 / 0.92 / 0.86 at batch 1 / 8 / 64,
  // x1.28 / 1.37 at 128 / 256 rows (commit d24f288). Tests set it to compare both forms.
  int64_t shared_fold_max_tokens = 64;
  DenseMlp shared;
  int top_k = 1;
  int n_group = 1, topk_group = 1;
  bool renormalize = true;
  float scale = 1.0f;
  static absl::StatusOr<Moe> Load(WeightLoader& w, const ModelConfig& c, const std::string& prefix);
  // out += shared(x) + the routed experts' sum, summed over the TP group; x, out: [T, H].
  void Forward(StepContext& ctx, const MatView& x, const MatView& out) const;
  // Forward(norm(h)) into out (may be h), x ([T, H], apart from h) receiving norm(h): the norm
  // runs inside the router's Linear where the backend can (Backend::RmsNormLinear; at batch 1 one
  // launch fewer on the step's critical path).
  void ForwardNormed(StepContext& ctx, const MatView& h, const RmsNormLayer& norm, const MatView& x,
                     const MatView& out) const;

 private:
  // out += the shared and routed experts of x, routed by the router's logits [T, n_routed_experts].
  void Experts(StepContext& ctx, const MatView& x, const MatView& logits, const MatView& out) const;
};


// DSA lightning indexer (spec §3.3). Writes its keys to the layer's cache and ctx.topk. Its
// projections live in MlaAttention's fused Linears: wq_b [n_heads * head_dim, q_lora_rank] with
// q_b, wk [head_dim, H] and weights_proj [n_heads, H] with q_a.
struct Indexer {
  DeviceMatrix k_norm_w, k_norm_b;
  static absl::StatusOr<Indexer> Load(WeightLoader& w, const ModelConfig& c,
                                      const std::string& prefix);
  // The step's keys: k [T, head_dim] (= a . wk^T, normed and roped in place) into the cache.
  // Scratch-free ops only (MlaAttention runs it on a side branch, Backend::BeginSide).
  void WriteKeys(StepContext& ctx, const MatView& k, const LayerKv& kv) const;
  // q [T, n_heads * head_dim] (= cq . wq_b^T) as heads: dims [0, qk_rope_head_dim) of each are
  // the ones RoPE rotates (the caller does, with the query's: Backend::RopeInterleavedBoth).
  HeadsView QueryHeads(const StepContext& ctx, const MatView& q) const;
  // Top-k into ctx.topk, after WriteKeys: qh = QueryHeads(q), already roped; w [T, n_heads]
  // (= a . weights_proj^T).
  void Select(StepContext& ctx, const HeadsView& qh, const MatView& w, const LayerKv& kv) const;
};

// Multi-head latent attention with DSA sparsity (spec §3.2).
struct MlaAttention {
  // Parts of a_proj (input: the normed hidden state): q_a_proj [q_lora_rank, H],
  // kv_a_proj_with_mqa [kv_lora_rank + rope, H], and with an indexer its wk, weights_proj.
  // Parts of b_proj (input: the normed query latent): q_b_proj [num_heads * (nope + rope),
  // q_lora_rank], and with an indexer its wq_b.
  enum APart { kQa = 0, kKvA = 1, kIndexK = 2, kIndexW = 3 };
  enum BPart { kQb = 0, kIndexQ = 1 };
  //
  // Tensor parallelism: a_proj, the norms and the indexer replicated; q_b (b_proj's kQb part,
  // the indexer's wq_b stays whole) and kv_b_proj column-parallel by head, so this rank attends
  // with num_heads = num_attention_heads / tp_size heads; o_proj row-parallel
  // [H, num_heads * v_head_dim], its output summed over the group.
  FusedLinear a_proj, b_proj;
  DeviceMatrix q_a_norm, kv_a_norm, o_proj;
  int64_t num_heads = 0;  // this rank's attention heads
  // kv_b_proj [num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank], stored as
  // WeightLoader::Linear stores every Linear (fp32, bf16, or e4m3 + block scales), except that an
  // INT4 / INT8 / NVFP4 kv_b_proj is widened to bf16 at load (AbsorbPerHead reads fp32 / bf16 /
  // fp8 only; kv_b is small: 28672 x 512 at GLM-5 widths, 29 MB in bf16). The absorbed
  // form reads W_UK (rows h * (nope + v) + d, d < nope) and W_UV (rows h * (nope + v) + nope + j)
  // straight from it with Backend::AbsorbPerHead, and the expanded form multiplies by all of it
  // the same way (one "head"): weight-only numerics in both forms (x fp32, weights widened
  // exactly), so they differ only by summation order, as in the fp32 model. Not through the
  // narrow Linear (it rounds x to bf16 / e4m3): the scheduler's chunking picks the form per
  // sequence, and the golden fixtures' greedy tokens then varied from run to run.
  // Except on the fp32 path below.
  DeviceMatrix kv_b;
  // The fp32 path (fp32 models; or any model loaded with kernels::AttentionPolicy::absorb_fp32,
  // which then also loads kv_b in fp32): W_UK^T copied per head,
  // [num_heads, kv_lora_rank, qk_nope_head_dim] fp32, and both products through the fp32
  // LinearPerHead. Empty (no buffer) on the narrow path.
  DeviceMatrix w_uk_t;
  std::unique_ptr<Indexer> indexer;  // null on IndexShare "shared" layers
  static absl::StatusOr<MlaAttention> Load(WeightLoader& w, const ModelConfig& c,
                                           const std::string& prefix, bool has_indexer);
  // out += attention(norm(h)), summed over the TP group; h: [T, H] the layer's input, norm its input_norm, out: [T, H] (the
  // residual stream; may be h). The norm runs inside a_proj's Linear where the backend can.
  void Forward(StepContext& ctx, const MatView& h, const RmsNormLayer& norm, const LayerKv& kv,
               const MatView& out) const;

 private:
  // after_select: the indexer's Select was the op just before (its selection is all this reads
  // of what Select wrote), so W_UK may run beside it (Backend::AbsorbPerHeadBesidePrevious).
  void Absorbed(StepContext& ctx, const HeadsView& q, int64_t row_begin, int64_t num_rows,
                const LayerKv& kv, const MatView& o, bool after_select = false) const;
  // The expanded form of the sequences `seqs` (their caches widened through kv_b_proj together).
  void Expanded(StepContext& ctx, const HeadsView& q, const std::vector<const SeqRows*>& seqs,
                const LayerKv& kv, const MatView& o) const;
};

struct DecoderLayer {
  int layer_idx = 0;
  RmsNormLayer input_norm, post_norm;
  MlaAttention attn;
  std::unique_ptr<DenseMlp> mlp;  // dense layers
  std::unique_ptr<Moe> moe;       // sparse layers
  static absl::StatusOr<DecoderLayer> Load(WeightLoader& w, const ModelConfig& c, int layer_idx);
  // h: [T, H] residual stream, updated in place.
  void Forward(StepContext& ctx, const MatView& h, const LayerKv& kv) const;
};

}  // namespace glm::engine
