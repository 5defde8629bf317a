// GlmMoeDsaForCausalLM (GLM-5 / GLM-5.2) on a Backend: embedding, decoder layers (MLA + DSA
// indexer + IndexShare, dense SwiGLU or MoE), final norm, lm_head, and the MTP layer.
// Forward pass: ../shared/specs/glm5-architecture.md §3 (matches transformers 5.17, see
// tests/golden/HF_NOTES.md); the scheduler drives it through engine/model/forward_batch.h.
//
// Behaviour of the Model returned here:
// - KV: the model allocates kv.num_blocks * kv.block_size slots per layer it holds (MLA latent
//   c_kv | roped k_pe, kv_lora_rank + qk_rope_head_dim floats; plus index_head_dim floats of
//   indexer keys on full-indexer layers and the MTP layer). With kv.dtype kFp8 the rows are the
//   656-byte latent / 132-byte indexer-key layouts of engine/backend/kv_fp8_layout.h (GLM-5
//   widths), written by quantizing paged writes and read by the fp8 Attention / IndexerTopK.
//   Forward writes the new tokens' KV at the slots their block_table names and reads positions
//   < start_pos from there, so prefill may come in chunks and decode is one token per step.
//   Block ids are the block manager's.
// - Attention form: per slice, expanded (kv_b_proj per head) when it has more than one new token
//   and options.expanded_prefill, else absorbed (q_nope W_UK against the latent cache). Both are
//   tested to agree to ~1e-6 relative.
// - DSA top-k ties (exact zeros after the ReLU are common in real models) go to the lower
//   position; transformers does not pin a rule.
// - Pipeline stages: with first_layer > 0 the slices carry input_residual (and input_topk when the
//   first layer is IndexShare "shared"); without the last layer Forward returns residual/topk
//   instead of logits (forward_batch.h).
// - ForwardMtp: logits = lm_head(shared_head.norm(x)); want_hidden returns x, the MTP layer's
//   output before shared_head.norm (the h of the next draft step). Positions are those of the
//   hidden rows (t), the tokens are t+1; the MTP layer's KV lives in the same blocks.
// - Tensor parallelism (options.tp_size > 1): each rank holds its share of the sharded weights
//   and all-reduces the row-parallel outputs (engine/model/tp.h); logits, hidden rows and top-k
//   are the same on every rank, the KV cache whole on each. A failed all-reduce is fatal (the
//   step's error and every later step's).
// - Not thread-safe: one Forward at a time. Errors are InvalidArgument for malformed batches
//   (bad block ids, short block tables, token ids outside the vocabulary), and the backend's
//   sticky error (Backend::status(): a CUDA fault, out of memory) after a step that hit one;
//   every later step returns it too.
// - Device backends: a step allocates nothing once its workspace has grown to the
//   step's size; per-step host work is O(new tokens + blocks): the [T] int tables (tokens,
//   positions, new slots, row offsets, key counts) are built and copied in, while the key slots
//   of the cached positions live in a persistent per-sequence SlotArena (slot_arena.h) that only
//   receives the positions whose blocks changed (one slot per sequence in a decode step). So a
//   decode step of fixed batch shape is captured as a CUDA graph reading the [T] tables from a
//   persistent buffer and the key slots from the arena (decode_graphs.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config/model_config.h"
#include "engine/model/forward_batch.h"
#include "engine/model/slot_arena.h"
#include "kernels/kernel_policy.h"

namespace glm::engine {

class Backend;
class Communicator;
class WeightSource;

struct ModelLoadOptions {
  std::string model_dir;     // HF layout: config.json + *.safetensors (+ index)
  KvCacheGeometry kv;        // paged KV storage the model allocates for every layer it holds
                             // (kv.dtype: fp32 or the fp8 layouts, kv_fp8_layout.h)
  int num_threads = 0;       // CPU backend threads; 0 = hardware concurrency
  // Backend LoadGlmMoeDsa creates (engine/backend/create_backend.h): "cpu", "cuda", or "auto"
  // (cuda when the build has it and a GPU is usable). cuda without CUDA support compiled in or
  // without a device is an error naming the fix.
  std::string backend = "cpu";
  int device = 0;            // CUDA device ordinal (backend cuda)
  int first_layer = 0;       // first decoder layer of this shard (PP)
  int last_layer = -1;       // inclusive, -1 = last decoder layer
  bool load_mtp = true;      // load layer num_hidden_layers (MTP) when the checkpoint has it
  // Tensor parallelism inside the linear layers (engine/model/tp.h has the split of every
  // weight, per ../shared/specs/serving.md §6.1): this rank loads only its share of the sharded
  // weights and runs its share of the heads and of every MLP / expert's intermediate width; the
  // row-parallel outputs (o_proj, the MoE's experts, the dense MLP's down) are all-reduced
  // through tp_comm, whose rank() and size() must be tp_rank and tp_size. tp_comm is not owned,
  // must outlive the model, and is required when tp_size > 1. On a device backend (cuda) a
  // device communicator (NcclCommunicator on this backend's stream, Backend::device_stream)
  // all-reduces in place; a host one (GlooCommunicator) through staged copies (tp.h); decode
  // steps run without CUDA graphs either way. Every rank of the group must run the same steps with the same batches; on a
  // device backend that includes the memory-planning warm-up inside the load
  // (plan_max_num_seqs), so load the ranks concurrently with the same options.
  // Needs num_attention_heads, moe_intermediate_size and intermediate_size (of the layers held)
  // divisible by tp_size.
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* tp_comm = nullptr;
  // Expanded (kv_b_proj, per-head K/V) attention for prefill slices with more than one new
  // token; the absorbed (latent) form otherwise. Both give the same result (tested); false forces
  // the absorbed form everywhere.
  bool expanded_prefill = true;
  // Storage of Linear weights (attention, indexer and MLP/expert projections, eh_proj, lm_head):
  // "fp32" (the reference), "bf16", or "auto" (e4m3 + 128x128 block scales where the checkpoint
  // is fp8; INT4 / INT8 / NVFP4 packed rows + scales as stored where the checkpoint has them and
  // the backend takes them (cuda; the cpu backend gets them widened); bf16 otherwise), kv_b_proj
  // included (the absorbed attention reads it per head, Backend::AbsorbPerHead; a quantized one
  // is widened to bf16). fp32 and bf16 widen quantized checkpoints (exact / rounded). Norm weights, biases, the embedding and the MoE router stay fp32.
  // Narrow dtypes need a backend that supports them (Backend::SupportsWeightDType: cpu and cuda
  // both do, with the same numerics).
  std::string weight_dtype = "fp32";
  // Decode steps (every slice one token, whole model on this shard, batch <= 64) on a backend
  // with graphs (cuda) run as CUDA graphs: captured on the first step of each (batch size, key
  // bucket), replayed after (engine/model/decode_graphs.h). Replay equals eager bitwise.
  bool cuda_graphs = true;
  // Linear weights that share an input (q_a | kv_a | indexer wk | weights_proj, q_b | indexer
  // wq_b, an MLP's gate | up) are stored and computed as one (FusedLinear, layers.h): fewer
  // launches and weight streams per step, the same dot products. false loads each on its own
  // (A/B runs: glm-bench-cuda-decode --fused both).
  bool fuse_linears = true;
  // Keep the kernels' per-launch pointer checks (a driver query per pointer) on every step
  // instead of only on the first one (debugging; measures their cost).
  bool debug_pointer_checks = false;
  // Benches: fill the paged KV cache with random values once it is allocated
  // (PagedKvStorage::FillRandom) instead of leaving it zero, so that a decode step over a context
  // that was never prefilled sees distinct indexer scores (a zero cache ties them all, which
  // the exact top-k resolves in its cheapest way) and non-uniform attention.
  bool random_kv = false;
  // Memory planning on a device backend. After the weights are loaded the model runs
  // warm-up steps at the largest step sizes (a prefill of plan_max_batched_tokens tokens, a decode
  // of plan_max_num_seqs sequences) so workspace and op scratch reach their peak, measures what
  // they took, and then sizes the KV cache when kv.num_blocks is 0: kv_cache_bytes when > 0,
  // else gpu_memory_fraction of the device's total memory minus everything in use and the
  // reserves (decode graphs, indexer scores at plan_max_model_len). Model::memory_plan()
  // reports it. plan_max_num_seqs 0 skips the warm-up (then only weights are measured).
  int64_t kv_cache_bytes = 0;
  double gpu_memory_fraction = 0.0;
  int plan_max_num_seqs = 0;
  int plan_max_batched_tokens = 0;
  int plan_max_model_len = 0;  // 0 = config max_position_embeddings
  // The kernel paths of a device backend (kernels/kernel_policy.h). Production keeps the
  // defaults; tests and benches set forced paths or a smaller shared-memory budget here.
  kernels::KernelPolicy kernel_policy;
};

// Bytes of backend memory the parameters of a model created here take (weights only), and how
// many Linear weights were stored per dtype. nullopt for a Model not created by this file.
struct ModelWeightMemory {
  int64_t total_bytes = 0;
  int64_t linear_bytes = 0;       // Linear weights as stored (fp8: e4m3 bytes + block scales)
  int64_t linear_fp32_bytes = 0;  // the same weights in fp32
  int64_t fp8_scale_bytes = 0;
  int64_t fp8_payload_bytes = 0;  // e4m3 bytes of the fp8 Linear weights
  int64_t num_linear_f32 = 0, num_linear_bf16 = 0, num_linear_fp8 = 0;
  // INT4 / INT8 / NVFP4 Linear weights kept as stored (packed rows + scales, in linear_bytes).
  int64_t num_linear_quantized = 0;
  int64_t quantized_bytes = 0;
};
std::optional<ModelWeightMemory> WeightMemoryOf(const Model& model);

// The key-slot arena's counters (slot_arena.h) of a Model created here (slots uploaded by the
// last step, rewrites, moves, growth, evictions); nullopt for any other Model. Step thread only.
std::optional<SlotArenaStats> SlotArenaStatsOf(const Model& model);
// Benchmarks only: with `on`, every step uploads the key slots of every cached position again
// (what each step cost before the arena: O(context) host work), results unchanged. False for a
// Model not created here.
bool SetKeySlotRebuild(Model& model, bool on);

// Bytes of paged KV storage per token position (per block: times kv.block_size) that a model
// loaded with `options` allocates: the layers in [first_layer, last_layer], plus the MTP layer
// when options.load_mtp and the config has one and last_layer is the last layer, in
// options.kv.dtype (fp32: 4 * (576 [+ 128]) per layer at GLM-5 widths; fp8: 656 [+ 132]).
// Use it to turn a memory budget into KvCacheGeometry::num_blocks.
int64_t KvCacheBytesPerToken(const ModelConfig& config, const ModelLoadOptions& options);

// Loads config.json and the weights from options.model_dir onto the backend options.backend
// names (the model owns it). Errors name the file and tensor (missing tensor, wrong shape, bad
// KV geometry), or the backend failure (no GPU, device out of memory).
absl::StatusOr<std::unique_ptr<Model>> LoadGlmMoeDsa(const ModelLoadOptions& options);
// Same on a backend the caller created (the model takes it; options.backend, num_threads, device
// and kernel_policy are not used): Engine::Create makes the backend before the TP group, whose
// NcclCommunicator enqueues on the backend's stream.
absl::StatusOr<std::unique_ptr<Model>> LoadGlmMoeDsa(const ModelLoadOptions& options,
                                                     std::unique_ptr<Backend> backend);

// Same, from an already parsed config and an arbitrary weight source (tests, synthetic models).
// `backend` must outlive the model; `weights` is only used during the call.
absl::StatusOr<std::unique_ptr<Model>> CreateGlmMoeDsa(const ModelConfig& config,
                                                      WeightSource& weights, Backend* backend,
                                                      const ModelLoadOptions& options);

}  // namespace glm::engine
