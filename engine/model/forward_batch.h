// The contract between the scheduler (engine/sched) and the model (engine/model): one forward
// step over a batch of sequence slices whose KV lives in a paged cache.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/kv_fp8_layout.h"
#include "engine/config/model_config.h"
#include "engine/model/model_runtime.h"

namespace glm::engine {

// Geometry of the paged KV cache. The block manager hands out block ids in [0, num_blocks); the
// model owns the storage. One block holds `block_size` consecutive token positions of one
// sequence, for every layer of this shard (MLA latent c_kv + roped k_pe, and indexer keys on
// layers with a full indexer).
// dtype: how the rows are stored (engine/backend/kv_fp8_layout.h): fp32 (the reference), or fp8
// (656-byte MLA latent rows and 132-byte indexer keys at GLM-5 widths, power-of-two scales).
struct KvCacheGeometry {
  int block_size = 16;
  int num_blocks = 0;
  KvDType dtype = KvDType::kF32;
};

// Parses "fp32" | "fp8" (--kv-dtype, EngineOptions::kv_dtype); InvalidArgument naming the
// accepted values otherwise.
absl::Status ParseKvDType(const std::string& s, KvDType* out);
const char* KvDTypeName(KvDType dtype);

// New tokens of one sequence for this step.
struct SequenceSlice {
  int64_t seq_id = 0;
  std::vector<int32_t> token_ids;    // [num_new_tokens] tokens to run now
  int32_t start_pos = 0;             // position of token_ids[0]; positions < start_pos are cached
  std::vector<int32_t> block_table;  // physical blocks covering positions [0, start_pos + n)
  bool all_logits = false;           // logits for every new token (else only the last one)
  bool want_hidden = false;          // return final post-norm hidden rows (MTP drafting)
  // Pick the next token on the backend instead of returning logits (Backend::Sample, the rule of
  // engine/sample SampleToken without banned tokens): only for a slice with one output row
  // (!all_logits). The model then leaves SequenceOutput::logits empty and sets sampled_token; a
  // model that does not sample returns logits as usual (the caller samples on the host).
  //
  // logprobs >= 0 (then enabled is false): the caller draws this row's token on the host with the
  // parameters below and needs its raw logprobs (engine/sample/logprobs.h) with that many
  // alternatives, so a model returns the logits row as usual. Except a pipeline whose last stage
  // is another process (engine/pipeline): that stage draws the token with the same rule
  // (SampleToken) and returns sampled_token plus SequenceOutput::sampled_logprob /
  // top_logprobs instead of the vocab row, so only ids and the pairs cross ranks.
  struct DeviceSample {
    bool enabled = false;
    float temperature = 0.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    uint64_t seed = 0;
    int64_t index = 0;  // the draw number: tokens the request generated before this one
    int32_t logprobs = -1;
  };
  DeviceSample sample;
  // Pipeline parallelism (a Model holding layers [first_layer, last_layer] only):
  // on a stage without layer 0, the residual stream entering its first layer,
  // [num_new_tokens, hidden_size] = the previous stage's SequenceOutput::residual;
  std::vector<float> input_residual;
  // and, when its first layer is an IndexShare "shared" layer, the top-k of the previous stage's
  // last full-indexer layer, [num_new_tokens, index_topk] = SequenceOutput::topk.
  std::vector<int32_t> input_topk;
};

struct ForwardBatch {
  std::vector<SequenceSlice> seqs;
};

struct SequenceOutput {
  std::vector<float> logits;  // [num_rows, vocab_size]; num_rows = n if all_logits else 1
  int32_t sampled_token = -1;  // SequenceSlice::sample was honoured: the token (logits empty)
  // sampled_token drawn for a slice with sample.logprobs = k: the raw log_softmax of its row at
  // sampled_token and the min(k, vocab_size) most likely (id, logprob), logprob descending, ties
  // lower id first (engine/sample/logprobs.h).
  float sampled_logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  std::vector<float> hidden;  // [num_rows, hidden_size] when want_hidden, else empty
  // On a stage without the last layer (no logits then): the residual stream after its last layer
  // for every new token, [num_new_tokens, hidden_size], and the current DSA top-k
  // [num_new_tokens, index_topk] (logical positions, -1 padded) when the next stage starts at a
  // "shared" layer. Feed both to the next stage's SequenceSlice.
  std::vector<float> residual;
  std::vector<int32_t> topk;
};

struct ForwardResult {
  std::vector<SequenceOutput> seqs;  // same order as ForwardBatch::seqs
};

// Runs the decoder over a batch. Not thread-safe: one step at a time (the scheduler's thread).
// Writes the KV of the new tokens into the blocks named by each block_table; reads cached
// positions from them. Errors are setup-level problems (bad block ids, sizes); the engine fails
// fast on them.
class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const KvCacheGeometry& kv_geometry() const = 0;
  virtual absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) = 0;

  // MTP draft step (layer num_hidden_layers): for each slice, token_ids are the tokens t+1 whose
  // embeddings pair with `hidden` rows (the main model's post-norm hidden state at t), one row per
  // token; the MTP layer keeps its own KV in the same blocks. Returns draft logits per row (or the
  // last row only) in result. Unimplemented when the checkpoint has no MTP layer.
  virtual absl::Status ForwardMtp(const ForwardBatch& batch,
                                  const std::vector<std::vector<float>>& hidden,
                                  ForwardResult* result) = 0;

  // Runtime reports (engine/model/model_runtime.h). The memory plan is fixed at load;
  // the graph counters may be read from any thread. Defaults for models without them.
  virtual MemoryPlan memory_plan() const { return {}; }
  virtual DecodeGraphStats decode_graph_stats() const { return {}; }

  // After Forward returned `failure`: OK when the failure left the model as it was before the
  // call (it stopped before running anything on its device: the key-slot table could not grow,
  // a batch was rejected), so the caller may fail just that step's sequences and go on; else the
  // error that makes the model unusable. Default: every failure is fatal.
  virtual absl::Status AfterFailedStep(const absl::Status& failure) const { return failure; }

  // The caller will not run seq_id again with its current blocks (finished, aborted or
  // preempted): a model may drop per-sequence state now (the key-slot arena's region) instead
  // of aging it out. Calling it for an unknown seq_id is a no-op; a later Forward of the same
  // seq_id starts afresh.
  virtual void ReleaseSequence(int64_t /*seq_id*/) {}

  // The asynchronous form of Forward, for a model that can keep several steps in flight (a
  // pipeline whose stages work on different micro-batches at once, engine/pipeline).
  // Submit starts a step over `batch` and returns its ticket (1, 2, 3, ... per model); Collect
  // waits for the oldest outstanding step, which must be `ticket` (steps complete in submission
  // order), and returns what Forward would have. A failure may surface from either call; after
  // a failure the caller collects no more tickets of that model unless AfterFailedStep says the
  // failure was contained. The caller keeps at most max_steps_in_flight() steps outstanding and
  // never puts a sequence in two outstanding steps (its next input depends on the last sample),
  // nor releases a sequence whose step is outstanding.
  // Default: Submit runs Forward at once and keeps the result for Collect (one step in flight).
  virtual absl::StatusOr<int64_t> Submit(const ForwardBatch& batch) {
    const int64_t ticket = ++sync_last_ticket_;
    sync_result_ = ForwardResult{};
    sync_status_ = Forward(batch, &sync_result_);
    return ticket;
  }
  virtual absl::Status Collect(int64_t ticket, ForwardResult* result) {
    if (ticket != sync_last_ticket_ || sync_collected_ == ticket) {
      return absl::FailedPreconditionError(
          "Model::Collect: the ticket is not the step outstanding (collect in submission order)");
    }
    sync_collected_ = ticket;
    *result = std::move(sync_result_);
    return sync_status_;
  }
  // How many steps Submit accepts before a Collect; 1 unless the model overlaps steps.
  virtual int max_steps_in_flight() const { return 1; }

 private:
  // The default Submit / Collect's one outstanding step.
  int64_t sync_last_ticket_ = 0;
  int64_t sync_collected_ = 0;
  ForwardResult sync_result_;
  absl::Status sync_status_;
};

}  // namespace glm::engine
