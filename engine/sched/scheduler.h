// Continuous-batching scheduler: decides which sequences run each step and how many tokens each,
// drives the model (and the MTP drafter), samples, and emits TokenEvents.
//
// Per step, under a budget of max_num_batched_tokens:
//  1. Running sequences in admission order: a decoding one takes 1 token plus its MTP drafts; a
//     prefilling one the rest of its prompt, or as much as the budget allows (chunked prefill).
//     When the KV cache has no room for a sequence's next tokens, the most recently admitted
//     running sequence is preempted by recompute: its blocks are freed, it goes back to the front
//     of the waiting queue and later recomputes prompt + generated tokens (the seeded sampler
//     makes its output independent of this).
//  2. If nothing was preempted, waiting sequences are admitted (FIFO) while there are fewer than
//     max_num_seqs running, budget left and blocks for their first chunk. A new sequence first
//     takes the longest chain of cached full blocks of its tokens (prefix cache) and starts
//     computing after them; at least one token is always computed. With MTP a cached block is
//     used only if the token after it equals ours, so the reused MTP KV is exact (the entry at
//     a block's last position depends on the next token).
//  3. One Model::Forward over all scheduled slices; sampling; with MTP, verification (accept the
//     longest run of drafts equal to the tokens the target emits) and drafting for the next step.
//     A request with SamplingParams::logprobs gets the raw logprobs of every token it is given,
//     accepted drafts included (each from the row it was verified against).
//
// Steps in flight (SchedulerOptions::max_steps_in_flight, capped by the model's
// Model::max_steps_in_flight(); a pipeline's stages then work on different micro-batches at
// once): a step is submitted (Model::Submit) and collected (Model::Collect) later, oldest first.
//  - A sequence is in at most one outstanding step: its next input depends on that step's
//    sample. Steps 1-2 above consider only the sequences not in flight, so the running set is
//    split into micro-batches over disjoint sequences. With F free slots the micro-batch takes
//    about 1/F of the tokens waiting to run (running sequences' next tokens and waiting prompts,
//    capped by max_num_batched_tokens), in admission order, so micro-batches are balanced by
//    tokens (prefill chunks count their tokens).
//  - Step() submits one micro-batch while a slot is free and there is something to run; when the
//    slots are full or nothing is left to run it collects the oldest step (sampling, events).
//    With max_steps_in_flight 1 every Step submits and collects one step, as without the limit.
//  - KV blocks: a sequence in flight is never preempted (its queued step reads its blocks); when
//    the most recently admitted sequence is in flight and blocks run out, the micro-batch stops
//    there and preemption waits until that step is collected.
//  - Abort of a sequence in flight emits its kAborted event at once; its blocks are freed and
//    the model releases it (Model::ReleaseSequence) when its step is collected, so no rank frees
//    blocks a queued step still uses. AbortAll collects (and drops) every outstanding step first.
//  - MTP (num_draft_tokens > 0) keeps one step in flight: drafting needs the verified tokens of
//    the step before.
//
// Not thread-safe: one thread (the engine's step loop) calls everything except Validate(), which
// reads only immutable state and may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/block_manager.h"
#include "engine/model/forward_batch.h"
#include "engine/sample/logprobs.h"
#include "engine/sched/request.h"

namespace glm::engine {

struct SchedulerOptions {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;  // tokens per forward step (drafts count)
  bool enable_chunked_prefill = true;
  bool enable_prefix_caching = true;
  int num_draft_tokens = 0;  // MTP k; 0 = no speculative decoding
  int max_model_len = 0;     // prompt + generated tokens; 0 = model's max_position_embeddings
  // Steps (micro-batches) outstanding at once; the model's max_steps_in_flight() caps it and MTP
  // sets it to 1. 0 = the model's.
  int max_steps_in_flight = 0;
};

struct SchedulerStats {
  int num_running = 0;
  int num_waiting = 0;
  int64_t num_steps = 0;                 // steps submitted to the model
  int64_t num_steps_completed = 0;       // steps collected (their results applied)
  int num_steps_in_flight = 0;           // submitted, not collected yet
  int max_steps_in_flight_observed = 0;  // the most ever outstanding at once
  int64_t num_preemptions = 0;
  int64_t num_failed_steps = 0;          // steps whose Forward failed but left the model usable
  int64_t num_prompt_tokens = 0;         // prompt tokens of admitted requests
  int64_t num_cached_prompt_tokens = 0;  // tokens served from the prefix cache (incl. recompute)
  int64_t num_computed_tokens = 0;       // tokens run through Model::Forward (drafts included)
  int64_t num_generated_tokens = 0;
  int64_t num_drafts = 0;                // verify steps with at least one draft
  int64_t num_draft_tokens = 0;          // drafts verified
  // [k]: drafts accepted at position i of their run (i = 0 is the first draft after the
  // verified token); a run stops at its first rejected draft.
  std::vector<int64_t> num_accepted_per_position;
  int64_t num_accepted_draft_tokens = 0;
  BlockManagerStats kv;
  double draft_acceptance_rate() const {
    return num_draft_tokens == 0 ? 0.0
                                 : static_cast<double>(num_accepted_draft_tokens) / num_draft_tokens;
  }
};

// Receives every event; called on the scheduler's thread.
using EventSink = std::function<void(int64_t request_id, TokenEvent event)>;

class Scheduler {
 public:
  // `model` must outlive the scheduler; its kv_geometry() sizes the block manager.
  Scheduler(Model* model, const SchedulerOptions& options, EventSink sink);
  ~Scheduler();

  // Admission checks that do not depend on load: prompt non-empty, ids in vocab, fits the
  // model length and the whole KV cache, fits the token budget without chunked prefill, sampling
  // params valid, MTP requested but the model has no MTP layer. Thread-safe.
  absl::Status Validate(const Request& request) const;

  // Queues a validated request. `seed` is used when request.sampling.seed is unset.
  absl::Status Add(int64_t request_id, Request request, uint64_t seed);
  // Drops a request wherever it is and emits its finished event (kAborted). False if unknown.
  bool Abort(int64_t request_id);
  // Fails every request with `error` (one kError event each) and forgets them.
  void FailAll(const absl::Status& error);
  // Aborts every request (one kAborted event each).
  void AbortAll();

  bool HasWork() const { return !running_.empty() || !waiting_.empty() || !in_flight_.empty(); }
  // Submits one micro-batch, collects the oldest outstanding step, or both (see the header).
  // A non-OK status is a model failure: the caller should FailAll and stop.
  absl::Status Step();
  // The limit in force: options, the model's and MTP's caps applied.
  int max_steps_in_flight() const { return max_in_flight_; }

  SchedulerStats Stats() const;
  const BlockManager& block_manager() const { return *blocks_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Sequence;
  struct Scheduled {
    Sequence* seq;
    int num_new;     // real tokens (prompt or last sampled)
    int num_drafts;  // draft tokens appended to the slice
  };

  // A submitted step: its slices (in the order of the batch) and the sequences they belong to.
  struct InFlight {
    int64_t ticket = 0;
    std::vector<Scheduled> sched;
    ForwardBatch batch;
  };

  // Steps 1-3 over the sequences not in flight; `submitted` tells whether a step went out.
  absl::Status ScheduleAndSubmit(bool* submitted);
  // Collects the oldest outstanding step and applies its result.
  absl::Status CollectOldest();
  // Applies a collected step's outputs: sampling, MTP verification and drafting.
  absl::Status ApplyResult(const std::vector<Scheduled>& sched, const ForwardBatch& batch,
                           ForwardResult& result);
  // Collects every outstanding step and drops the results (AbortAll).
  void DropInFlight();
  void Preempt(Sequence* seq);
  void Finish(Sequence* seq, FinishReason reason);
  // Appends a sampled token, emits it (with `logprobs`, moved from, when the request asked for
  // them); returns true if the sequence finished.
  bool AppendToken(Sequence* seq, int32_t token, TokenLogprobs* logprobs);
  int64_t PositionsToReserve(const Sequence& seq, int num_new, int num_drafts) const;

  Model* model_;
  SchedulerOptions options_;
  EventSink sink_;
  std::unique_ptr<BlockManager> blocks_;
  int64_t vocab_size_ = 0;
  int64_t hidden_size_ = 0;
  std::vector<int32_t> eos_ids_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order; the back is preempted first
  std::deque<InFlight> in_flight_;  // submission order
  int max_in_flight_ = 1;
  SchedulerStats stats_;
};

}  // namespace glm::engine
