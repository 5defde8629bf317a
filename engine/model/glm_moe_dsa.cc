#include "engine/model/glm_moe_dsa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/backend/backend.h"
#include "engine/backend/create_backend.h"
#include "engine/dist/communicator.h"
#include "engine/model/decode_graphs.h"
#include "engine/model/kv_storage.h"
#include "engine/model/layers.h"
#include "engine/model/logits_output.h"
#include "engine/model/slot_arena.h"
#include "engine/model/tp.h"
#include "engine/model/weight_source.h"
#ifdef GLM_HAVE_WEIGHTS
#include "engine/weights/tensor_filter.h"
#include "engine/weights/weight_store.h"
#endif

namespace glm::engine {
namespace {

// "1, 2, 4" for messages: the divisors of n up to 64.
std::string Divisors(int64_t n) {
  std::string s;
  for (int64_t d = 1; d <= std::min<int64_t>(n, 64); ++d) {
    if (n % d == 0) absl::StrAppend(&s, s.empty() ? "" : ", ", d);
  }
  return s;
}

// The tensor-parallel options against the config: the group is usable and every split weight
// divides evenly (layers [first, last] and the MTP layer when `with_mtp`).
absl::Status ValidateTp(const ModelConfig& c, const ModelLoadOptions& o, int first, int last,
                        bool with_mtp) {
  if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelLoadOptions tp_rank=", o.tp_rank, " tp_size=", o.tp_size,
        ": tp_size must be >= 1 and tp_rank in [0, tp_size)"));
  }
  if (o.tp_size == 1) return absl::OkStatus();
  if (o.tp_comm == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelLoadOptions.tp_comm is null with tp_size=", o.tp_size,
        ": pass the TP group's Communicator (engine/dist; GlooCommunicator on host memory), or "
        "tp_size=1"));
  }
  if (o.tp_comm->size() != o.tp_size || o.tp_comm->rank() != o.tp_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelLoadOptions.tp_comm is rank ", o.tp_comm->rank(), " of ", o.tp_comm->size(),
        " but tp_rank=", o.tp_rank, " tp_size=", o.tp_size,
        "; pass the communicator of this rank's TP group"));
  }
  auto check = [&](const char* field, int64_t value) -> absl::Status {
    if (value % o.tp_size == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json ", field, "=", value, " does not split across tp_size=", o.tp_size,
        " ranks (ModelLoadOptions.tp_size); use a tp_size that divides it: ", Divisors(value)));
  };
  GLM_RETURN_IF_ERROR(check("num_attention_heads", c.num_attention_heads));
  bool any_moe = with_mtp, any_dense = false;  // the MTP layer is an MoE layer
  for (int l = first; l <= last; ++l) (c.IsMoeLayer(l) ? any_moe : any_dense) = true;
  if (any_moe) GLM_RETURN_IF_ERROR(check("moe_intermediate_size", c.moe_intermediate_size));
  if (any_dense) GLM_RETURN_IF_ERROR(check("intermediate_size", c.intermediate_size));
  return absl::OkStatus();
}

// The MTP layer (spec §3.5): x = eh_proj(cat(enorm(embed(t+1)), hnorm(h_t))); decoder layer;
// logits = lm_head(shared_head.norm(x)).
struct MtpLayer {
  RmsNormLayer enorm, hnorm, head_norm;
  DeviceMatrix eh_proj;  // [H, 2H]
  std::unique_ptr<DecoderLayer> layer;
};

// Host-side plan of one step: the small int tables the ops read, before upload ([T] each, T =
// new tokens). The key slots of the cached positions live in the model's SlotArena; row_offset
// points into it.
struct StepPlan {
  std::vector<int32_t> tokens, positions, new_slots, row_offset, row_num_keys;
  std::vector<int32_t> out_rows;      // rows whose logits are returned
  std::vector<int64_t> out_begin;     // per sequence: first index into out_rows
  std::vector<SeqRows> seqs;
  int32_t max_num_keys = 0;
};

class GlmMoeDsaModel : public Model {
 public:
  GlmMoeDsaModel(const ModelConfig& config, const ModelLoadOptions& options, Backend* backend)
      : config_(config), options_(options), backend_(backend), ws_(backend) {}

  const ModelConfig& config() const override { return config_; }
  const KvCacheGeometry& kv_geometry() const override { return kv_->geometry(); }

  absl::Status Load(WeightSource& source);
  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) override;
  absl::Status ForwardMtp(const ForwardBatch& batch, const std::vector<std::vector<float>>& hidden,
                          ForwardResult* result) override;
  MemoryPlan memory_plan() const override { return plan_; }
  DecodeGraphStats decode_graph_stats() const override { return graphs_.stats(); }
  void ReleaseSequence(int64_t seq_id) override {
    if (arena_ != nullptr) arena_->Release(seq_id);
  }
  // Forward fails before its first op (input checks, Plan's key-slot arena: TryAllocate) or
  // with the backend's sticky error: a healthy backend means nothing ran.
  absl::Status AfterFailedStep(const absl::Status&) const override { return StepStatus(); }
  SlotArenaStats slot_arena_stats() const {
    return arena_ != nullptr ? arena_->stats() : SlotArenaStats{};
  }
  bool rebuild_key_slots = false;  // SetKeySlotRebuild

  std::unique_ptr<Backend> owned_backend;
  ModelWeightMemory weight_memory;

 private:
  // Validates the batch (O(tokens + blocks)), builds the step's small tables and brings the key
  // slots of every slice up to date in arena_ (uploads only what changed).
  absl::StatusOr<StepPlan> Plan(const ForwardBatch& batch);
  // The key-slot arena for a KV cache of num_blocks blocks (slot_arena.h).
  // The key-slot table's int32 slots for a cache of num_blocks blocks: every cached position
  // plus a quarter (shared prefix blocks count once per sequence), at least 4096.
  static int64_t SlotArenaCapacity(int block_size, int64_t num_blocks) {
    const int64_t positions = static_cast<int64_t>(block_size) * std::max<int64_t>(num_blocks, 0);
    return std::clamp<int64_t>(positions + positions / 4, 4096, int64_t{1} << 30);
  }
  std::unique_ptr<SlotArena> MakeSlotArena(int block_size, int num_blocks) const {
    SlotArena::Options o;
    o.block_size = block_size;
    o.initial_capacity = SlotArenaCapacity(block_size, num_blocks);
    return std::make_unique<SlotArena>(backend_, o);
  }
  // ctx.identity for the expanded form: a persistent [>= n] 0, 1, 2, ... table.
  const int32_t* Identity(int32_t n);
  // Uploads the plan's tables into the workspace and fills ctx.
  void Begin(const StepPlan& plan, StepContext* ctx, int32_t** tokens);
  // Final norm + lm_head on the selected rows of x; copies logits (and hidden) to result.
  void Finish(StepContext& ctx, const StepPlan& plan, const ForwardBatch& batch, const MatView& x,
              const RmsNormLayer& norm, const MatView* hidden_rows, ForwardResult* result);
  // Device decode steps (decode_graphs.h): every slice one token, whole model, B <= kMaxBatch.
  bool DecodePathApplies(const ForwardBatch& batch) const;
  absl::Status ForwardDecode(const ForwardBatch& batch, const StepPlan& plan,
                             ForwardResult* result);
  // Sizes (memory planning) and allocates the paged KV storage of `kv_layers`.
  // weight_bytes: what the loader allocated for parameters (the free-memory delta is coarse).
  absl::Status AllocateKv(const std::vector<int>& kv_layers, int64_t weight_bytes);
  // One prefill of `tokens` tokens and one decode of `num_seqs` sequences on the current kv_
  // (block ids from 0), so workspace and scratch grow to their peak.
  absl::Status WarmUp(int tokens, int num_seqs);
  // The backend's sticky error, or the TP group's (a failed all-reduce): either is fatal.
  absl::Status StepStatus() const { return tp_.status().ok() ? backend_->status() : tp_.status(); }
  // Decode steps as CUDA graphs: not with TP (tp.h AllReduce: a staged all-reduce cannot be
  // captured; NCCL's runs eagerly too).
  bool graphs_enabled() const { return options_.cuda_graphs && options_.tp_size == 1; }
  bool first_stage() const { return first_layer_ == 0; }
  bool last_stage() const { return last_layer_ == config_.num_hidden_layers - 1; }

  ModelConfig config_;
  ModelLoadOptions options_;
  Backend* backend_;
  Workspace ws_;
  int first_layer_ = 0, last_layer_ = -1;
  DeviceMatrix embed_, lm_head_, inv_freq_;
  LogitsOutput logits_out_;  // lm_head rows -> host logits or backend-sampled tokens
  TpGroup tp_;               // this rank's TP group (one rank without TP)
  RmsNormLayer final_norm_;
  std::vector<DecoderLayer> layers_;
  std::unique_ptr<MtpLayer> mtp_;
  std::unique_ptr<PagedKvStorage> kv_;
  std::unique_ptr<SlotArena> arena_;  // key slots of the cached positions, per sequence
  std::unique_ptr<Buffer> identity_;  // [identity_len_] 0, 1, 2, ...
  int32_t identity_len_ = 0;
  DecodeGraphs graphs_{backend_};
  bool graphs_allowed_ = true;      // false during the warm-up steps
  DeviceMemoryInfo load_memory_;    // device memory when Load started (total 0: none reported)
  MemoryPlan plan_;
};

absl::Status GlmMoeDsaModel::Load(WeightSource& source) {
  const ModelConfig& c = config_;
  const int L = c.num_hidden_layers;
  first_layer_ = options_.first_layer;
  last_layer_ = options_.last_layer < 0 ? L - 1 : options_.last_layer;
  if (first_layer_ < 0 || last_layer_ >= L || first_layer_ > last_layer_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer range [", first_layer_, ", ", last_layer_, "] is outside the model's ", L,
        " decoder layers; set first_layer/last_layer within [0, ", L - 1, "]"));
  }
  if (c.qk_rope_head_dim % 2 != 0 || c.index_head_dim < c.qk_rope_head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "qk_rope_head_dim=", c.qk_rope_head_dim, " must be even and <= index_head_dim=",
        c.index_head_dim));
  }
  if (!c.HasIndexer(0)) {
    return absl::InvalidArgumentError(
        "layer 0 is an IndexShare \"shared\" layer; it has no earlier full layer to reuse the "
        "top-k of. Fix indexer_types in config.json");
  }
  if (c.rope_type != "default") {
    return absl::UnimplementedError(absl::StrCat("rope_type `", c.rope_type,
                                                 "` is not supported; only `default` RoPE"));
  }
  GLM_ASSIGN_OR_RETURN(const LinearWeightMode mode, ParseLinearWeightMode(options_.weight_dtype));
  const bool mtp_wanted = options_.load_mtp && c.num_nextn_predict_layers > 0 && last_stage();
  GLM_RETURN_IF_ERROR(ValidateTp(c, options_, first_layer_, last_layer_, mtp_wanted));
  if (options_.tp_size > 1 && options_.tp_comm->DeviceMemory() && backend_->HostMemory()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelLoadOptions.tp_comm takes device memory (NCCL) but the ", backend_->name(),
        " backend's memory is host memory; TP over NCCL needs the cuda backend on every rank "
        "(engine/pipeline/tp_transport.h picks Gloo otherwise)"));
  }
  tp_ = TpGroup(options_.tp_rank, options_.tp_size, options_.tp_comm);
  if (mode != LinearWeightMode::kF32 && !backend_->SupportsWeightDType(WeightDType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight dtype ", options_.weight_dtype, " is not supported by the ", backend_->name(),
        " backend, which has no bf16/fp8 Linear; use --dtype fp32 (weight_dtype \"fp32\") or a "
        "backend that has one (cpu, cuda)"));
  }
  // Device memory before any parameter is uploaded (memory plan: weights = the difference).
  backend_->Synchronize();
  if (!backend_->MemoryInfo(&load_memory_).ok()) load_memory_ = {};
  WeightLoader w(source, backend_, mode);
  w.set_fuse(options_.fuse_linears);
  w.set_absorb_fp32(options_.kernel_policy.attention.absorb_fp32);
  w.set_tp({options_.tp_rank, options_.tp_size});
  const std::string mtp_prefix = absl::StrCat("model.layers.", L);
  const bool with_mtp = options_.load_mtp && c.num_nextn_predict_layers > 0 && last_stage() &&
                        w.Has(mtp_prefix + ".eh_proj.weight");
  // The embedding serves the first stage and the MTP layer; the head the last stage. Both are
  // replicated on every TP rank (vocab-parallel embedding and lm_head, with the logits gathered
  // before sampling, would divide their memory by tp_size: not done yet).
  if (first_stage() || with_mtp) {
    GLM_ASSIGN_OR_RETURN(embed_,
                         w.Matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size));
  }
  for (int l = first_layer_; l <= last_layer_; ++l) {
    GLM_ASSIGN_OR_RETURN(DecoderLayer layer, DecoderLayer::Load(w, c, l));
    layers_.push_back(std::move(layer));
    // Stop reading weights once the backend failed (device out of memory).
    GLM_RETURN_IF_ERROR(Annotate(backend_->status(), absl::StrCat("loading layer ", l)));
  }
  if (last_stage()) {
    GLM_ASSIGN_OR_RETURN(final_norm_.weight, w.Vector("model.norm.weight", c.hidden_size));
    final_norm_.eps = static_cast<float>(c.rms_norm_eps);
    const std::string head_name = c.tie_word_embeddings && !w.Has("lm_head.weight")
                                      ? "model.embed_tokens.weight"
                                      : "lm_head.weight";
    GLM_ASSIGN_OR_RETURN(lm_head_, w.Linear(head_name, c.vocab_size, c.hidden_size));
  }
  std::vector<int> kv_layers;
  for (int l = first_layer_; l <= last_layer_; ++l) kv_layers.push_back(l);
  if (with_mtp) {
    auto mtp = std::make_unique<MtpLayer>();
    GLM_ASSIGN_OR_RETURN(mtp->enorm.weight, w.Vector(mtp_prefix + ".enorm.weight", c.hidden_size));
    GLM_ASSIGN_OR_RETURN(mtp->hnorm.weight, w.Vector(mtp_prefix + ".hnorm.weight", c.hidden_size));
    GLM_ASSIGN_OR_RETURN(mtp->head_norm.weight,
                         w.Vector(mtp_prefix + ".shared_head.norm.weight", c.hidden_size));
    mtp->enorm.eps = mtp->hnorm.eps = mtp->head_norm.eps = static_cast<float>(c.rms_norm_eps);
    GLM_ASSIGN_OR_RETURN(mtp->eh_proj, w.Linear(mtp_prefix + ".eh_proj.weight", c.hidden_size,
                                                2 * c.hidden_size));
    GLM_ASSIGN_OR_RETURN(DecoderLayer layer, DecoderLayer::Load(w, c, L));
    mtp->layer = std::make_unique<DecoderLayer>(std::move(layer));
    mtp_ = std::move(mtp);
    kv_layers.push_back(L);
  }
  // inv_freq[i] = theta^(-2i / rope_dim), computed in fp32 as the reference does.
  const int num_freqs = static_cast<int>(c.qk_rope_head_dim / 2);
  std::vector<float> inv_freq(num_freqs);
  for (int i = 0; i < num_freqs; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.qk_rope_head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), exponent);
  }
  inv_freq_ = w.Upload(inv_freq, 1, num_freqs);
  GLM_RETURN_IF_ERROR(AllocateKv(kv_layers, w.bytes().total));
  const WeightBytes& wb = w.bytes();
  weight_memory = {wb.total,         wb.linear,        wb.linear_fp32,   wb.fp8_scales,
                   wb.fp8_payload,   wb.num_linear[0], wb.num_linear[1], wb.num_linear[2]};
  weight_memory.num_linear_quantized = wb.num_linear[3] + wb.num_linear[4] + wb.num_linear[5];
  weight_memory.quantized_bytes = wb.quant_payload + wb.quant_scales;
  GLM_LOG_INFO("model weights on {}: {} bytes; Linear weights ({}) {} bytes, {} in fp32; "
               "{} fp32 / {} bf16 / {} fp8 tensors",
               backend_->name(), wb.total, options_.weight_dtype, wb.linear, wb.linear_fp32,
               wb.num_linear[0], wb.num_linear[1], wb.num_linear[2]);
  backend_->Synchronize();
  return Annotate(backend_->status(), absl::StrCat("loading the model onto the ",
                                                   backend_->name(), " backend"));
}

absl::StatusOr<StepPlan> GlmMoeDsaModel::Plan(const ForwardBatch& batch) {
  StepPlan p;
  const int bs = kv_->geometry().block_size, num_blocks = kv_->geometry().num_blocks;
  int64_t row = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SequenceSlice& s = batch.seqs[i];
    const int64_t n = static_cast<int64_t>(s.token_ids.size());
    const int64_t total = s.start_pos + n;
    if (n == 0 || s.start_pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s.seq_id, ": slice has ", n, " tokens at start_pos ", s.start_pos,
          "; a slice needs at least one token and start_pos >= 0"));
    }
    if (static_cast<int64_t>(s.block_table.size()) * bs < total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s.seq_id, ": block_table has ", s.block_table.size(), " blocks of ", bs,
          " tokens but positions [0, ", total, ") are needed; allocate blocks before the step"));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s.seq_id, ": block id ", b,
                                                       " is outside [0, ", num_blocks, ")"));
      }
    }
    SeqRows sr;
    sr.row_begin = row;
    sr.num_rows = n;
    sr.start_pos = s.start_pos;
    sr.expanded = options_.expanded_prefill && n > 1;
    p.out_begin.push_back(static_cast<int64_t>(p.out_rows.size()));
    for (int64_t j = 0; j < n; ++j) {
      const int32_t tok = s.token_ids[j];
      if (tok < 0 || tok >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s.seq_id, ": token id ", tok,
                                                       " is outside the vocabulary [0, ",
                                                       config_.vocab_size, ")"));
      }
      const int64_t pos = s.start_pos + j;
      p.tokens.push_back(tok);
      p.positions.push_back(static_cast<int32_t>(pos));
      p.new_slots.push_back(s.block_table[pos / bs] * bs + static_cast<int32_t>(pos % bs));
      p.row_num_keys.push_back(static_cast<int32_t>(pos + 1));
      if (s.all_logits || j == n - 1) p.out_rows.push_back(static_cast<int32_t>(row + j));
    }
    p.max_num_keys = std::max<int32_t>(p.max_num_keys, static_cast<int32_t>(total));
    p.seqs.push_back(sr);
    row += n;
  }
  if (row == 0) return absl::InvalidArgumentError("empty batch: no sequence slices");
  // The batch is valid: bring the key slots up to date (O(blocks) per slice + what changed).
  arena_->BeginStep();
  p.row_offset.reserve(p.tokens.size());
  absl::Status mapped;
  for (size_t i = 0; i < batch.seqs.size() && mapped.ok(); ++i) {
    const SequenceSlice& s = batch.seqs[i];
    SeqRows& sr = p.seqs[i];
    absl::StatusOr<int32_t> offset =
        arena_->Map(s.seq_id, s.block_table, sr.start_pos + sr.num_rows, rebuild_key_slots);
    if (!offset.ok()) {
      mapped = Annotate(offset.status(), absl::StrCat("sequence ", s.seq_id));
      break;
    }
    sr.key_offset = *offset;
    p.row_offset.insert(p.row_offset.end(), sr.num_rows, *offset);
  }
  arena_->Flush();  // also on error: the arena's bookkeeping assumes its queued writes happen
  GLM_RETURN_IF_ERROR(mapped);
  return p;
}

const int32_t* GlmMoeDsaModel::Identity(int32_t n) {
  if (n > identity_len_) {
    int32_t len = 4096;
    while (len < n) len = len > (1 << 29) ? n : len * 2;
    std::vector<int32_t> iota(len);
    for (int32_t i = 0; i < len; ++i) iota[i] = i;
    identity_ = backend_->Allocate(static_cast<size_t>(len) * sizeof(int32_t));
    backend_->CopyToDevice(identity_->data(), iota.data(), iota.size() * sizeof(int32_t));
    identity_len_ = len;
  }
  return identity_ != nullptr ? identity_->i32() : nullptr;
}

void GlmMoeDsaModel::Begin(const StepPlan& p, StepContext* ctx, int32_t** tokens) {
  ws_.Reset();
  auto upload = [&](const std::vector<int32_t>& v) {
    int32_t* d = ws_.Ints(std::max<int64_t>(1, static_cast<int64_t>(v.size())));
    backend_->CopyToDevice(d, v.data(), v.size() * sizeof(int32_t));
    return d;
  };
  const int64_t T = static_cast<int64_t>(p.tokens.size());
  ctx->backend = backend_;
  ctx->ws = &ws_;
  ctx->config = &config_;
  ctx->num_rows = T;
  *tokens = upload(p.tokens);
  ctx->positions = upload(p.positions);
  ctx->new_slots = upload(p.new_slots);
  ctx->table.slots = arena_->slots();  // per-sequence regions, up to date (Plan)
  ctx->table.row_offset = upload(p.row_offset);
  ctx->table.row_num_keys = upload(p.row_num_keys);
  ctx->table.max_num_keys = p.max_num_keys;
  ctx->zeros = upload(std::vector<int32_t>(T, 0));
  ctx->inv_freq = inv_freq_.data();
  ctx->seqs = p.seqs;
  ctx->all_absorbed = std::none_of(p.seqs.begin(), p.seqs.end(),
                                   [](const SeqRows& s) { return s.expanded; });
  // Only the expanded form reads the identity table (its keys are gathered per sequence).
  ctx->identity = ctx->all_absorbed ? nullptr : Identity(p.max_num_keys);
  ctx->topk = ws_.Ints(T * config_.index_topk);  // [T, index_topk]
  ctx->topk_valid = false;
  ctx->tp = &tp_;
}

void GlmMoeDsaModel::Finish(StepContext& ctx, const StepPlan& p, const ForwardBatch& batch,
                            const MatView& x, const RmsNormLayer& norm, const MatView* hidden_rows,
                            ForwardResult* result) {
  const int64_t R = static_cast<int64_t>(p.out_rows.size()), H = config_.hidden_size,
                V = config_.vocab_size;
  int32_t* rows = ws_.Ints(R);
  backend_->CopyToDevice(rows, p.out_rows.data(), R * sizeof(int32_t));
  MatView sel = ctx.ws->Mat(R, H);  // [R, H]
  backend_->GatherRows(x, rows, sel);
  MatView hidden_sel = sel;
  if (hidden_rows != nullptr) {  // hidden to return differs from the normed rows (MTP)
    hidden_sel = ctx.ws->Mat(R, H);
    backend_->GatherRows(*hidden_rows, rows, hidden_sel);
  }
  norm.Forward(ctx, sel, sel);
  if (hidden_rows == nullptr) hidden_sel = sel;
  MatView logits = ctx.ws->Mat(R, V);  // [R, vocab_size]
  backend_->Linear(sel, lm_head_.view, logits, false);
  // The step's all-reduces complete (or fail within the TP op_timeout) before Emit's copy waits
  // on the stream.
  if (!tp_.Finish().ok()) return;
  logits_out_.Emit(backend_, batch, p.out_begin, logits, result);
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const int64_t begin = p.out_begin[i];
    const int64_t end = i + 1 < batch.seqs.size() ? p.out_begin[i + 1] : R;
    SequenceOutput& out = result->seqs[i];
    out.hidden.clear();
    out.residual.clear();
    out.topk.clear();
    if (batch.seqs[i].want_hidden) {
      out.hidden.resize((end - begin) * H);
      backend_->CopyToHost(out.hidden.data(), hidden_sel.Row(begin),
                           (end - begin) * H * sizeof(float));
    }
  }
  backend_->Synchronize();
  // A step that succeeded validated the pointers the model passes (all from Allocate()); later
  // steps skip the kernels' per-launch pointer queries.
  if (backend_->status().ok()) backend_->SetPointerChecks(options_.debug_pointer_checks);
}

absl::Status GlmMoeDsaModel::Forward(const ForwardBatch& batch, ForwardResult* result) {
  GLM_RETURN_IF_ERROR(StepStatus());
  // The inputs are checked before Plan, which updates the key-slot arena: a rejected call changes
  // nothing.
  const int64_t H = config_.hidden_size, K = config_.index_topk;
  const bool needs_topk = !first_stage() && !config_.HasIndexer(first_layer_);
  for (const SequenceSlice& s : batch.seqs) {
    const size_t n = s.token_ids.size();
    if (!first_stage() && s.input_residual.size() != n * H) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s.seq_id, ": this pipeline stage starts at layer ", first_layer_,
          " and needs input_residual of num_tokens * hidden_size = ", n * H, " values, got ",
          s.input_residual.size(), "; pass the previous stage's SequenceOutput::residual"));
    }
    if (needs_topk && s.input_topk.size() != n * K) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s.seq_id, ": layer ", first_layer_, " is an IndexShare \"shared\" layer and",
          " needs input_topk of num_tokens * index_topk = ", n * K, " values, got ",
          s.input_topk.size(), "; pass the previous stage's SequenceOutput::topk"));
    }
  }
  GLM_ASSIGN_OR_RETURN(StepPlan plan, Plan(batch));
  if (DecodePathApplies(batch)) return ForwardDecode(batch, plan, result);
  StepContext ctx;
  int32_t* tokens = nullptr;
  Begin(plan, &ctx, &tokens);
  MatView h = ws_.Mat(ctx.num_rows, H);  // [T, H] residual stream
  if (first_stage()) {
    backend_->GatherRows(embed_.view, tokens, h);
  } else {
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const auto& in = batch.seqs[i].input_residual;
      backend_->CopyToDevice(h.Row(plan.seqs[i].row_begin), in.data(), in.size() * sizeof(float));
      if (needs_topk) {
        const auto& tk = batch.seqs[i].input_topk;
        backend_->CopyToDevice(ctx.topk + plan.seqs[i].row_begin * K, tk.data(),
                               tk.size() * sizeof(int32_t));
      }
    }
    ctx.topk_valid = needs_topk;
  }
  for (const DecoderLayer& layer : layers_) layer.Forward(ctx, h, kv_->layer(layer.layer_idx));
  if (last_stage()) {
    Finish(ctx, plan, batch, h, final_norm_, nullptr, result);
    return StepStatus();
  }
  // A middle stage: hand the residual stream (and the top-k for a shared next layer) on, once
  // the step's all-reduces completed (tp.h Finish).
  GLM_RETURN_IF_ERROR(tp_.Finish());
  const bool pass_topk = !config_.HasIndexer(last_layer_ + 1);
  result->seqs.resize(batch.seqs.size());
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqRows& sr = plan.seqs[i];
    SequenceOutput& out = result->seqs[i];
    out.logits.clear();
    out.hidden.clear();
    out.residual.resize(sr.num_rows * H);
    backend_->CopyToHost(out.residual.data(), h.Row(sr.row_begin), out.residual.size() * sizeof(float));
    out.topk.clear();
    if (pass_topk) {
      out.topk.resize(sr.num_rows * K);
      backend_->CopyToHost(out.topk.data(), ctx.topk + sr.row_begin * K,
                           out.topk.size() * sizeof(int32_t));
    }
  }
  backend_->Synchronize();
  return StepStatus();
}

bool GlmMoeDsaModel::DecodePathApplies(const ForwardBatch& batch) const {
  if (!backend_->SupportsGraphs() || !first_stage() || !last_stage() || batch.seqs.empty() ||
      batch.seqs.size() > static_cast<size_t>(DecodeGraphs::kMaxBatch)) {
    return false;
  }
  return std::all_of(batch.seqs.begin(), batch.seqs.end(),
                     [](const SequenceSlice& s) { return s.token_ids.size() == 1; });
}

absl::Status GlmMoeDsaModel::ForwardDecode(const ForwardBatch& batch, const StepPlan& p,
                                           ForwardResult* result) {
  const int64_t B = static_cast<int64_t>(batch.seqs.size()), H = config_.hidden_size,
                V = config_.vocab_size, K = config_.index_topk;
  // Tables first, outside any captured region: the graph reads them from fixed addresses.
  // The key slots stay in the arena (Plan updated them); a moved arena drops the graphs.
  const DecodeGraphs::Tables t = graphs_.Upload(p.tokens, p.positions, p.new_slots, p.row_offset,
                                                p.row_num_keys, arena_->slots());
  const int32_t key_bucket = DecodeGraphs::KeyBucket(p.max_num_keys);
  StepContext ctx;
  ctx.backend = backend_;
  ctx.ws = &ws_;
  ctx.config = &config_;
  ctx.num_rows = B;
  ctx.positions = t.positions;
  ctx.new_slots = t.new_slots;
  ctx.table.slots = t.key_slots;
  ctx.table.row_offset = t.row_offset;
  ctx.table.row_num_keys = t.row_num_keys;
  ctx.table.max_num_keys = key_bucket;  // a capacity: the ops read true counts from the table
  ctx.inv_freq = inv_freq_.data();
  ctx.seqs = p.seqs;
  ctx.all_absorbed = true;  // one token per sequence: the absorbed form
  ctx.tp = &tp_;
  // The outputs are carved first, so their addresses are known without running the body (a
  // replay does not run it) and are those the body writes to.
  MatView normed, logits;
  auto carve_outputs = [&] {
    ws_.Reset();
    normed = ws_.Mat(B, H);  // [B, H] final norm
    logits = ws_.Mat(B, V);  // [B, vocab_size]
  };
  carve_outputs();
  // Everything enqueued here is a function of B and key_bucket only (decode_graphs.h).
  auto body = [&] {
    carve_outputs();
    ctx.topk = ws_.Ints(B * K);  // [B, index_topk]
    ctx.topk_valid = false;
    MatView h = ws_.Mat(B, H);  // [B, H] residual stream
    backend_->GatherRows(embed_.view, t.tokens, h);
    for (const DecoderLayer& layer : layers_) layer.Forward(ctx, h, kv_->layer(layer.layer_idx));
    final_norm_.Forward(ctx, h, normed);
    backend_->Linear(normed, lm_head_.view, logits, false);
  };
  GLM_RETURN_IF_ERROR(
      graphs_.Run(static_cast<int>(B), key_bucket, graphs_enabled() && graphs_allowed_, body));
  std::vector<int64_t> row_begin(B);  // one lm_head row per sequence
  for (int64_t i = 0; i < B; ++i) row_begin[i] = i;
  GLM_RETURN_IF_ERROR(tp_.Finish());  // before Emit's copy waits on the stream
  logits_out_.Emit(backend_, batch, row_begin, logits, result);
  for (int64_t i = 0; i < B; ++i) {
    SequenceOutput& out = result->seqs[i];
    out.hidden.clear();
    out.residual.clear();
    out.topk.clear();
    if (batch.seqs[i].want_hidden) {
      out.hidden.resize(H);
      backend_->CopyToHost(out.hidden.data(), normed.Row(i), H * sizeof(float));
    }
  }
  GLM_RETURN_IF_ERROR(backend_->status());
  backend_->SetPointerChecks(options_.debug_pointer_checks);
  return absl::OkStatus();
}

absl::Status GlmMoeDsaModel::WarmUp(int tokens, int num_seqs) {
  graphs_allowed_ = false;
  const int bs = kv_->geometry().block_size;
  ForwardBatch prefill;
  SequenceSlice s;
  s.token_ids.assign(tokens, 0);
  for (int b = 0; b * bs < tokens; ++b) s.block_table.push_back(b);
  prefill.seqs.push_back(s);
  ForwardResult r;
  absl::Status st = Forward(prefill, &r);
  if (st.ok() && num_seqs > 0) {
    ForwardBatch decode;  // every sequence at position 0 of block 0 (the values are discarded)
    for (int i = 0; i < num_seqs; ++i) {
      SequenceSlice d;
      d.seq_id = i;
      d.token_ids = {0};
      d.block_table = {0};
      decode.seqs.push_back(d);
    }
    st = Forward(decode, &r);
  }
  graphs_allowed_ = true;
  return Annotate(st, absl::StrCat("memory-planning warm-up (prefill of ", tokens,
                                   " tokens, decode of ", num_seqs, " sequences)"));
}

absl::Status GlmMoeDsaModel::AllocateKv(const std::vector<int>& kv_layers,
                                         int64_t weight_bytes) {
  const ModelConfig& c = config_;
  KvCacheGeometry geo = options_.kv;
  int64_t per_token = 0;  // latent (+ indexer keys) per layer held, in geo.dtype
  for (int l : kv_layers) per_token += KvBytesPerTokenOfLayer(c, geo.dtype, c.HasIndexer(l));
  MemoryPlan& mp = plan_;
  mp.kv_block_size = geo.block_size;
  mp.kv_bytes_per_block = per_token * std::max(geo.block_size, 0);
  constexpr int64_t kMiB = int64_t{1} << 20;
  backend_->Synchronize();
  GLM_RETURN_IF_ERROR(backend_->status());
  DeviceMemoryInfo mem;
  const bool device = load_memory_.total_bytes > 0 && backend_->MemoryInfo(&mem).ok();
  const int64_t max_len =
      options_.plan_max_model_len > 0 ? options_.plan_max_model_len : c.max_position_embeddings;
  if (device) {
    mp.measured = true;
    mp.device_total_bytes = mem.total_bytes;
    mp.device_free_bytes_before = load_memory_.free_bytes;
    // cudaMemGetInfo moves in 2 MiB steps and small allocations share blocks: the larger of
    // the free-memory delta and the bytes the loader allocated.
    mp.weights_bytes = std::max(load_memory_.free_bytes - mem.free_bytes, weight_bytes);
    mp.backend_workspace_bytes = mem.workspace_bytes;
    const bool warm = options_.plan_max_num_seqs > 0 && first_stage() && last_stage() &&
                      geo.block_size > 0;
    if (warm) {
      mp.warmup_tokens = static_cast<int>(std::clamp<int64_t>(
          std::max(options_.plan_max_batched_tokens, 1), 1, std::max<int64_t>(max_len, 1)));
      mp.warmup_num_seqs = options_.plan_max_num_seqs;
      const int blocks = (mp.warmup_tokens + geo.block_size - 1) / geo.block_size;
      GLM_ASSIGN_OR_RETURN(kv_, PagedKvStorage::Create(backend_, c, {geo.block_size, blocks},
                                                       kv_layers));
      arena_ = MakeSlotArena(geo.block_size, blocks);
      GLM_RETURN_IF_ERROR(WarmUp(mp.warmup_tokens, mp.warmup_num_seqs));
      arena_.reset();
      kv_.reset();
      backend_->Synchronize();
      GLM_RETURN_IF_ERROR(backend_->status());
      const int64_t free_before_warmup = mem.free_bytes;
      GLM_RETURN_IF_ERROR(backend_->MemoryInfo(&mem));
      mp.activation_bytes = free_before_warmup - mem.free_bytes;
      // The indexer materializes [rows, num_keys] scores: at the longest context that outgrows
      // what the warm-up (num_keys = warm-up tokens) reached.
      mp.indexer_reserve_bytes =
          std::max<int64_t>(mp.warmup_num_seqs, mp.warmup_tokens) * max_len * 4;
    }
    mp.graph_reserve_bytes = backend_->SupportsGraphs() && graphs_enabled() ? 64 * kMiB : 0;
  }
  const int64_t reserves = mp.graph_reserve_bytes + mp.indexer_reserve_bytes;
  const int64_t avail = device ? mem.free_bytes - reserves : 0;
  auto fail = [&](const std::string& what) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " (device ", mp.device_total_bytes / kMiB, " MiB: weights ",
        mp.weights_bytes / kMiB, " MiB, activations ", mp.activation_bytes / kMiB,
        " MiB after a warm-up of ", mp.warmup_num_seqs, " decode sequences and ", mp.warmup_tokens,
        " prefill tokens, reserves ", reserves / kMiB, " MiB, free now ", mem.free_bytes / kMiB,
        " MiB). Fix: lower max_num_seqs or max_num_batched_tokens (activations), lower "
        "max_model_len (", max_len, "; indexer reserve), or raise the memory budget "
        "(gpu_memory_fraction / kv_cache_bytes)"));
  };
  if (geo.num_blocks > 0) {
    mp.source = "kv_num_blocks";
  } else if (options_.kv_cache_bytes > 0 && mp.kv_bytes_per_block > 0) {
    mp.source = "kv_cache_bytes";
    if (device && options_.kv_cache_bytes > avail) {
      return fail(absl::StrCat("kv_cache_bytes ", options_.kv_cache_bytes / kMiB,
                               " MiB does not fit: ", std::max<int64_t>(avail, 0) / kMiB,
                               " MiB are left, short by ",
                               (options_.kv_cache_bytes - avail) / kMiB, " MiB"));
    }
    geo.num_blocks = static_cast<int>(
        std::min<int64_t>(options_.kv_cache_bytes / mp.kv_bytes_per_block, 1 << 30));
  } else if (options_.gpu_memory_fraction > 0 && mp.kv_bytes_per_block > 0) {
    if (!device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu_memory_fraction needs a backend that reports device memory; the ",
          backend_->name(), " backend does not: size the KV cache with kv_cache_bytes or "
          "kv_num_blocks"));
    }
    if (options_.gpu_memory_fraction > 1.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu_memory_fraction=", options_.gpu_memory_fraction, " must be in (0, 1]"));
    }
    mp.source = "memory_fraction";
    mp.memory_fraction = options_.gpu_memory_fraction;
    const int64_t budget =
        static_cast<int64_t>(options_.gpu_memory_fraction * static_cast<double>(mem.total_bytes));
    const int64_t used = mem.total_bytes - mem.free_bytes;
    // The key-slot table comes out of the same budget: 4 bytes per slot, at most 5 per position
    // (SlotArenaCapacity), and its 4096-slot floor.
    const int64_t slot_floor = 4096 * 4, slot_per_block = 5 * int64_t{geo.block_size};
    const int64_t kv_bytes = std::min(budget - used - reserves, avail) - slot_floor;
    const int64_t need_blocks = (max_len + geo.block_size - 1) / geo.block_size;
    if (kv_bytes < need_blocks * (mp.kv_bytes_per_block + slot_per_block)) {
      return fail(absl::StrCat(
          "gpu_memory_fraction ", options_.gpu_memory_fraction, " leaves ",
          std::max<int64_t>(kv_bytes, 0) / kMiB,
          " MiB for the KV cache, less than one sequence of max_model_len ", max_len,
          " tokens needs with its key slots (",
          need_blocks * (mp.kv_bytes_per_block + slot_per_block) / kMiB, " MiB; short by ",
          (need_blocks * (mp.kv_bytes_per_block + slot_per_block) - kv_bytes) / kMiB, " MiB)"));
    }
    geo.num_blocks = static_cast<int>(
        std::min<int64_t>(kv_bytes / (mp.kv_bytes_per_block + slot_per_block), 1 << 30));
  }
  const int64_t slot_table_bytes = SlotArenaCapacity(geo.block_size, geo.num_blocks) * 4;
  if (device && geo.num_blocks > 0 &&
      geo.num_blocks * mp.kv_bytes_per_block + slot_table_bytes > mem.free_bytes) {
    return fail(absl::StrCat("the KV cache of ", geo.num_blocks, " blocks (",
                             geo.num_blocks * mp.kv_bytes_per_block / kMiB,
                             " MiB) and its key-slot table (", slot_table_bytes / kMiB,
                             " MiB) do not fit in the free device memory"));
  }
  GLM_ASSIGN_OR_RETURN(kv_, PagedKvStorage::Create(backend_, c, geo, kv_layers));
  if (options_.random_kv) kv_->FillRandom(backend_, 1);
  arena_ = MakeSlotArena(geo.block_size, geo.num_blocks);
  if (absl::Status st = arena_->Reserve(); !st.ok()) {
    return fail(absl::StrCat("the key-slot table for ", geo.num_blocks, " KV blocks: ",
                             st.message()));
  }
  mp.slot_table_bytes = arena_->bytes();
  mp.kv_num_blocks = geo.num_blocks;
  mp.kv_bytes = geo.num_blocks * mp.kv_bytes_per_block;
  mp.max_tokens = static_cast<int64_t>(geo.num_blocks) * geo.block_size;
  GLM_LOG_INFO("memory plan on {}: {}", backend_->name(), mp.ToString());
  return absl::OkStatus();
}

absl::Status GlmMoeDsaModel::ForwardMtp(const ForwardBatch& batch,
                                        const std::vector<std::vector<float>>& hidden,
                                        ForwardResult* result) {
  if (mtp_ == nullptr) {
    return absl::UnimplementedError(
        "this model has no MTP layer (num_nextn_predict_layers is 0, the checkpoint lacks "
        "model.layers.<num_hidden_layers>.eh_proj, or load_mtp was false)");
  }
  GLM_RETURN_IF_ERROR(StepStatus());
  const int64_t H = config_.hidden_size;
  if (hidden.size() != batch.seqs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardMtp: ", hidden.size(),
                                                   " hidden blocks for ", batch.seqs.size(),
                                                   " sequences; pass one per sequence"));
  }
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const size_t want = batch.seqs[i].token_ids.size() * H;
    if (hidden[i].size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ForwardMtp: sequence ", batch.seqs[i].seq_id, " has ", hidden[i].size(),
          " hidden values; expected num_tokens * hidden_size = ", want));
    }
  }
  GLM_ASSIGN_OR_RETURN(StepPlan plan, Plan(batch));  // after the checks: it updates the arena
  StepContext ctx;
  int32_t* tokens = nullptr;
  Begin(plan, &ctx, &tokens);
  const int64_t T = ctx.num_rows;
  MatView h_in = ws_.Mat(T, H);  // [T, H] main model's post-norm hidden at t
  for (const SeqRows& s : plan.seqs) {
    const auto& src = hidden[&s - plan.seqs.data()];
    backend_->CopyToDevice(h_in.Row(s.row_begin), src.data(), src.size() * sizeof(float));
  }
  MatView e = ws_.Mat(T, H);  // [T, H] embedding of token t+1
  backend_->GatherRows(embed_.view, tokens, e);
  MatView cat = ws_.Mat(T, 2 * H);  // [T, 2H] = enorm(e) | hnorm(h)
  mtp_->enorm.Forward(ctx, e, cat.Cols(0, H));
  mtp_->hnorm.Forward(ctx, h_in, cat.Cols(H, H));
  MatView x = ws_.Mat(T, H);  // [T, H]
  backend_->Linear(cat, mtp_->eh_proj.view, x, false);
  mtp_->layer->Forward(ctx, x, kv_->layer(config_.num_hidden_layers));
  // want_hidden returns the MTP layer output before shared_head.norm (the next draft step's h).
  Finish(ctx, plan, batch, x, mtp_->head_norm, &x, result);
  return StepStatus();
}

#ifdef GLM_HAVE_WEIGHTS
class StoreWeights : public WeightSource {
 public:
  explicit StoreWeights(std::unique_ptr<WeightStore> store) : store_(std::move(store)) {}
  bool Has(const std::string& name) const override { return store_->Contains(name); }
  absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                               std::vector<int64_t>* shape) override {
    GLM_ASSIGN_OR_RETURN(std::vector<int64_t> logical, store_->ShapeOf(name));
    if (shape != nullptr) *shape = logical;
    return store_->ReadFloat(name);
  }
  // Only the slice's bytes are read (and dequantized) from the mapped file.
  absl::StatusOr<std::vector<float>> ReadFloatSlice(const std::string& name,
                                                    const TensorSlice& slice,
                                                    std::vector<int64_t>* shape) override {
    GLM_ASSIGN_OR_RETURN(std::vector<int64_t> logical, store_->ShapeOf(name));
    if (shape != nullptr) *shape = logical;
    switch (slice.dim) {
      case TensorSlice::kRows:
        if (logical.size() != 2) break;
        return store_->ReadRowSlice(name, slice.begin, slice.end);
      case TensorSlice::kCols:
        return store_->ReadColSlice(name, slice.begin, slice.end);
      case TensorSlice::kWhole:
        return store_->ReadFloat(name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " has ", logical.size(), " dimensions; a slice needs a 2-D tensor"));
  }
  bool IsFp8Block(const std::string& name) const override {
    auto view = store_->Get(name);
    if (!view.ok() || view->dtype != DType::kF8E4M3 || view->shape.size() != 2) return false;
    const BlockSize b = store_->options().block;
    return b.rows == 128 && b.cols == 128 && store_->ScaleFor(name).has_value();
  }
  absl::StatusOr<Fp8BlockTensor> ReadFp8Block(const std::string& name) override {
    GLM_ASSIGN_OR_RETURN(TensorView view, store_->Get(name));
    std::optional<TensorView> scale = store_->ScaleFor(name);
    if (view.dtype != DType::kF8E4M3 || view.shape.size() != 2 || !scale.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, " is not a 2-D F8_E4M3 weight with a weight_scale_inv block scale"));
    }
    Fp8BlockTensor t;
    t.shape = view.shape;
    t.data.resize(view.nbytes);
    std::memcpy(t.data.data(), view.data, view.nbytes);
    GLM_ASSIGN_OR_RETURN(t.scales, store_->ReadFloat(scale->name));
    return t;
  }
  // Copies only the slice's e4m3 bytes out of the mapped file (the scales are small).
  absl::StatusOr<Fp8BlockTensor> ReadFp8BlockSlice(const std::string& name,
                                                   const TensorSlice& slice) override {
    GLM_ASSIGN_OR_RETURN(TensorView view, store_->Get(name));
    std::optional<TensorView> scale = store_->ScaleFor(name);
    if (view.dtype != DType::kF8E4M3 || view.shape.size() != 2 || !scale.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, " is not a 2-D F8_E4M3 weight with a weight_scale_inv block scale"));
    }
    GLM_ASSIGN_OR_RETURN(std::vector<float> scales, store_->ReadFloat(scale->name));
    return SliceFp8Block(name, reinterpret_cast<const uint8_t*>(view.data), view.shape, scales,
                         slice);
  }
  // INT4 / INT8 / NVFP4 weights as stored (weight_source.h); only the slice's bytes are copied.
  std::optional<QuantizedInfo> QuantizedInfoOf(const std::string& name) const override {
    return StoreQuantizedInfo(*store_, name);
  }
  absl::StatusOr<QuantizedTensor> ReadQuantized(const std::string& name,
                                                const TensorSlice& slice) override {
    return ReadStoreQuantized(*store_, name, slice);
  }

 private:
  std::unique_ptr<WeightStore> store_;
};
#endif

}  // namespace

int64_t KvCacheBytesPerToken(const ModelConfig& config, const ModelLoadOptions& options) {
  const int L = config.num_hidden_layers;
  const int last = options.last_layer < 0 ? L - 1 : std::min(options.last_layer, L - 1);
  int64_t bytes = 0;
  auto add = [&](int l) {
    bytes += KvBytesPerTokenOfLayer(config, options.kv.dtype, config.HasIndexer(l));
  };
  for (int l = std::max(0, options.first_layer); l <= last; ++l) add(l);
  if (options.load_mtp && config.num_nextn_predict_layers > 0 && last == L - 1) add(L);
  return bytes;
}

std::optional<ModelWeightMemory> WeightMemoryOf(const Model& model) {
  const auto* m = dynamic_cast<const GlmMoeDsaModel*>(&model);
  if (m == nullptr) return std::nullopt;
  return m->weight_memory;
}

std::optional<SlotArenaStats> SlotArenaStatsOf(const Model& model) {
  const auto* m = dynamic_cast<const GlmMoeDsaModel*>(&model);
  if (m == nullptr) return std::nullopt;
  return m->slot_arena_stats();
}

bool SetKeySlotRebuild(Model& model, bool on) {
  auto* m = dynamic_cast<GlmMoeDsaModel*>(&model);
  if (m == nullptr) return false;
  m->rebuild_key_slots = on;
  return true;
}

absl::StatusOr<std::unique_ptr<Model>> CreateGlmMoeDsa(const ModelConfig& config,
                                                      WeightSource& weights, Backend* backend,
                                                      const ModelLoadOptions& options) {
  auto model = std::make_unique<GlmMoeDsaModel>(config, options, backend);
  GLM_RETURN_IF_ERROR(model->Load(weights));
  return std::unique_ptr<Model>(std::move(model));
}

absl::StatusOr<std::unique_ptr<Model>> LoadGlmMoeDsa(const ModelLoadOptions& options) {
  return LoadGlmMoeDsa(options, nullptr);
}

absl::StatusOr<std::unique_ptr<Model>> LoadGlmMoeDsa(const ModelLoadOptions& options,
                                                     std::unique_ptr<Backend> backend) {
#ifdef GLM_HAVE_WEIGHTS
  GLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  WeightStoreOptions store_options;
  if (config.quantization.has_value()) {
    store_options.block = {config.quantization->block_rows, config.quantization->block_cols};
  }
  store_options.quantization = config.quantization;
  LayerSelection sel;
  sel.first_layer = options.first_layer;
  sel.last_layer = options.last_layer < 0 ? config.num_hidden_layers - 1 : options.last_layer;
  sel.embedding = sel.first_layer == 0 || (options.load_mtp &&
                                           sel.last_layer == config.num_hidden_layers - 1);
  sel.head = sel.last_layer == config.num_hidden_layers - 1;
  sel.num_hidden_layers = config.num_hidden_layers;
  sel.mtp = options.load_mtp;
  store_options.filter = LayerRangeFilter(sel);
  store_options.verify_total_size = false;
  auto store = WeightStore::Open(options.model_dir, std::move(store_options));
  if (!store.ok()) return Annotate(store.status(), options.model_dir);
  StoreWeights weights(std::move(store).value());
  if (backend == nullptr) {
    auto created =
        CreateBackend(options.backend, options.num_threads, options.device, options.kernel_policy);
    if (!created.ok()) return Annotate(created.status(), options.model_dir);
    backend = std::move(created).value();
  }
  auto model = std::make_unique<GlmMoeDsaModel>(config, options, backend.get());
  if (absl::Status s = model->Load(weights); !s.ok()) return Annotate(s, options.model_dir);
  model->owned_backend = std::move(backend);
  return std::unique_ptr<Model>(std::move(model));
#else
  (void)backend;
  return absl::UnimplementedError(absl::StrCat(
      "LoadGlmMoeDsa(", options.model_dir, "): built without engine/weights (glm_weights)"));
#endif
}

}  // namespace glm::engine
