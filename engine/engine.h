// The engine API: the one header the agent (and glm-run) includes. Token ids in, token ids out;
// no gRPC, agent or controller types.
//
// Threading contract:
//  - Engine owns one step-loop thread that runs the scheduler and the model; nothing else touches
//    them. Submit, Abort, Drain and Stats are thread-safe and may be called from any thread.
//  - Submit returns a RequestHandle whose TokenStream is a thread-safe queue filled by the step
//    loop. One consumer pops it (Next blocks; TryNext does not). Every stream ends with exactly
//    one event with finished = true (finish_reason stop / length / aborted / error).
//  - Destroying the Engine aborts everything in flight (each stream gets its final event) and
//    joins the loop. Streams stay valid after the engine is gone (they are shared_ptr-owned).
//  - A model failure (Forward/ForwardMtp error) fails every in-flight request with that error and
//    puts the engine in a failed state: later Submits return the error (fail fast, the agent
//    restarts the shard). Except a Forward failure the model reports as contained
//    (Model::AfterFailedStep OK: nothing ran, e.g. the key-slot table could not grow): then only
//    that step's requests fail with the error, and the engine goes on (Stats num_failed_steps).
//
// Distributed replicas (EngineOptions::shard with pp_size * tp_size > 1; engine/pipeline/):
//  - Create forms the replica's groups through shard.rendezvous (every rank of the replica calls
//    Create with the same group_key within connect_timeout), loads this rank's layers and TP
//    slice, and agrees on the KV block count (the smallest over the ranks).
//  - The head (pp 0, tp 0) returns an engine that works exactly as a single-process one: its
//    scheduler drives a PipelinedModel that sends every step to the other ranks and returns
//    the last stage's result. Every decision is the head's; the other ranks follow it. With
//    pp_size > 1 the head keeps up to max_steps_in_flight steps (micro-batches over disjoint
//    sequences) outstanding so the stages work at once; Stats() shows the steps in flight, the
//    most observed and each rank's time in its layers (stage_compute_seconds). The last
//    stage returns sampled ids, or logits rows where the head needs them (MTP verification,
//    prompt logits, min_tokens masking); a request with SamplingParams::logprobs has its token
//    drawn and its logprobs computed on the last stage, which sends the (id, logprob) pairs.
//  - Every other rank returns a follower engine: its loop serves the head's steps until the head
//    stops (destroying the head engine tells followers to stop cleanly) or the group fails.
//    Submit returns FailedPrecondition "not the head shard"; Stats().num_steps counts the steps
//    served and num_group_messages every message (heartbeats too) as the progress heartbeat;
//    status() / Stats().failed report a failure, group_done that the loop ended.
//  - A rank that dies (its sockets close) fails the group at once; one that stalls, within
//    shard.op_timeout. The head then fails every in-flight request with an error naming the rank
//    and stage, and the engine stays failed (the agent restarts the group).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/forward_batch.h"
#include "engine/pipeline/shard_topology.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/request.h"
#include "engine/sched/scheduler.h"

namespace glm::engine {

struct EngineOptions {
  std::string model_dir;  // HF layout: config.json, *.safetensors
  // KV cache: kv_num_blocks > 0 gives the block count directly; otherwise kv_cache_bytes is
  // divided by the per-block size of this model (latent + indexer keys in kv_dtype).
  int kv_block_size = 16;
  int kv_num_blocks = 0;
  int64_t kv_cache_bytes = int64_t{1} << 30;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  bool enable_chunked_prefill = true;
  bool enable_prefix_caching = true;
  int max_model_len = 0;          // 0 = the model's max_position_embeddings
  int num_threads = 0;            // CPU backend threads; 0 = hardware concurrency
  // "cpu", "cuda" or "auto" (cuda when built with it and a GPU is usable; else cpu). Asking for
  // cuda where it cannot work fails Create with a message naming the fix.
  std::string backend = "auto";
  int device = 0;                 // CUDA device ordinal (backend cuda)
  // Linear weight storage: "fp32" (reference), "bf16", "auto" (fp8 checkpoints stay e4m3 with
  // block scales, else bf16), on cpu and cuda alike (ModelLoadOptions::weight_dtype).
  std::string weight_dtype = "fp32";
  // KV cache storage: "fp32" (reference) or "fp8" (656-byte MLA latent + 132-byte indexer key
  // rows at GLM-5 widths, engine/backend/kv_fp8_layout.h); any backend.
  std::string kv_dtype = "fp32";
  int mtp_draft_tokens = 0;       // k > 0: MTP speculative decoding with k drafts per step
  int max_queued_requests = 4096; // admission control: Submit fails with kUnavailable beyond it
  uint64_t seed = 0;              // seeds requests without SamplingParams::seed (0 = random)
  // Decode steps as CUDA graphs on the cuda backend (ModelLoadOptions::cuda_graphs).
  bool cuda_graphs = true;
  // Memory planning (ModelLoadOptions): with kv_num_blocks 0 and a fraction > 0 the KV
  // cache takes what is left of gpu_memory_fraction of the device after weights, warm-up
  // activations at max_num_seqs / max_num_batched_tokens and reserves (cuda backend only).
  double gpu_memory_fraction = 0.0;
  // Distributed replicas with pp_size > 1: steps (micro-batches over disjoint sequences) the
  // head keeps in flight, so every stage works on a different one (SchedulerOptions and
  // pipelined_model.h). 0 = pp_size; 1 = one step at a time. MTP keeps one in any case.
  int max_steps_in_flight = 0;
  // This engine's place in a replica spread over ranks (engine/pipeline/shard_topology.h). The
  // default is the whole model in this process. Budgets above (kv_cache_bytes, max_num_seqs,
  // ...) are per rank; the head's scheduler options are the ones that count.
  ShardTopology shard;
};

struct EngineStats {
  int64_t num_requests_submitted = 0;
  int64_t num_requests_finished = 0;
  int num_running = 0;
  int num_waiting = 0;  // inside the scheduler plus not yet picked up
  int kv_num_blocks = 0;
  int kv_num_free_blocks = 0;
  int kv_num_cached_blocks = 0;
  int64_t num_steps = 0;            // steps submitted to the model (a follower: served)
  int64_t num_steps_completed = 0;  // steps whose results were applied
  int num_steps_in_flight = 0;      // submitted, not completed yet
  int max_steps_in_flight_observed = 0;  // the most outstanding at once so far
  int64_t num_preemptions = 0;
  int64_t num_failed_steps = 0;  // steps failed without stopping the engine (SchedulerStats)
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_prompt_tokens = 0;  // prefix-cache hits
  int64_t num_computed_tokens = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_drafts = 0;  // verify steps with drafts (SchedulerStats)
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_draft_tokens = 0;
  std::vector<int64_t> num_accepted_per_position;  // [mtp_draft_tokens] (SchedulerStats)
  double draft_acceptance_rate = 0.0;  // accepted / drafted; 0 without MTP
  bool failed = false;
  // Distributed replicas: messages the head sent (steps and idle heartbeats) or this follower
  // received; it advances at least every shard.op_timeout / 4 while the group is alive.
  int64_t num_group_messages = 0;
  bool group_done = false;  // follower: its loop has ended (the head stopped it, or failure)
  // Distributed replicas: seconds this rank spent in its stage's layers; its growth over an
  // interval / the interval is the stage's busy fraction.
  double stage_compute_seconds = 0.0;
};

// A request's event queue. Thread-safe; one consumer.
class TokenStream {
 public:
  explicit TokenStream(int64_t request_id) : request_id_(request_id) {}
  int64_t request_id() const { return request_id_; }

  // Blocks until the next event; returns false once the finished event has been popped.
  bool Next(TokenEvent* event);
  // Non-blocking: false when no event is queued (or the stream is over).
  bool TryNext(TokenEvent* event);
  // Convenience: pops everything up to the finished event and returns the token ids.
  std::vector<int32_t> CollectTokens(TokenEvent* final_event = nullptr);

  // Producer side (the engine).
  void Push(TokenEvent event);

 private:
  const int64_t request_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool done_ = false;  // the finished event has been popped
};

struct RequestHandle {
  int64_t id = 0;
  std::shared_ptr<TokenStream> stream;
};

namespace pipeline {
class PipelinedModel;
class StageFollower;
class StageGroup;
}  // namespace pipeline

class Engine {
 public:
  // Loads the model from options.model_dir onto options.backend and starts the step loop.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // Runs `model` (tests inject fakes). The KV geometry is the model's; options.kv_* are ignored.
  static absl::StatusOr<std::unique_ptr<Engine>> CreateWithModel(std::unique_ptr<Model> model,
                                                                 const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors: kInvalidArgument (bad prompt/params, message says
  // which), kResourceExhausted (can never fit the KV cache), kUnavailable (draining, or more
  // than max_queued_requests in flight), kFailedPrecondition on a follower shard, or the model
  // failure that stopped the engine.
  absl::StatusOr<RequestHandle> Submit(Request request);
  // Aborts a request wherever it is; its stream ends with kAborted. Unknown ids are ignored.
  void Abort(int64_t request_id);
  // Stops admitting (Submit returns kUnavailable from now on) and blocks until every request in
  // flight has finished. Returns the engine's failure status if the model failed.
  absl::Status Drain();
  EngineStats Stats() const;
  // False on a follower shard of a distributed replica (it takes no requests).
  bool is_head() const { return follower_ == nullptr; }
  // OK while the engine can serve (a follower stopped cleanly by the head included); else the
  // failure that stopped it (a model error, a dead or stalled rank of the group). Any thread:
  // the agent polls it.
  absl::Status status() const;
  const ModelConfig& model_config() const { return model_->config(); }
  // The model's memory plan (fixed at load) and decode-graph counters; any thread.
  MemoryPlan memory_plan() const { return model_->memory_plan(); }
  DecodeGraphStats decode_graph_stats() const { return model_->decode_graph_stats(); }
  // How this rank's TP group all-reduces, fixed at Create: "nccl", "gloo (<why not NCCL>)"
  // (engine/pipeline/tp_transport.h), or empty without TP (tp_size 1). Any thread.
  const std::string& tp_transport() const { return tp_transport_; }

 private:
  Engine(std::unique_ptr<Model> model, const EngineOptions& options,
         pipeline::PipelinedModel* pipeline);
  // A follower shard: serves the head's steps with `model` over `group`.
  Engine(std::unique_ptr<Model> model, std::unique_ptr<pipeline::StageGroup> group,
         const EngineOptions& options);
  static absl::Status ValidateModelAndOptions(const Model& model, const EngineOptions& options);
  void Loop();
  void Deliver(int64_t request_id, TokenEvent event);
  void PublishStats();  // loop thread: copies scheduler stats, retires finished requests

  const EngineOptions options_;
  std::string tp_transport_;  // set by Create before the engine is handed out
  std::unique_ptr<Model> model_;
  std::unique_ptr<Scheduler> scheduler_;  // step-loop thread only (Validate: any thread)
  // Head of a distributed replica: model_ itself (step-loop thread only); else null.
  pipeline::PipelinedModel* pipeline_ = nullptr;
  // Follower of a distributed replica (then no scheduler and no step loop); else null.
  std::unique_ptr<pipeline::StageFollower> follower_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // loop waits for submissions/aborts/stop
  std::condition_variable idle_cv_;   // Drain waits for in_flight_ == 0
  struct Pending {
    int64_t id;
    Request request;
    uint64_t seed;
  };
  std::deque<Pending> pending_;
  std::vector<int64_t> aborts_;
  std::unordered_map<int64_t, std::shared_ptr<TokenStream>> streams_;
  int64_t next_id_ = 1;
  int64_t in_flight_ = 0;
  bool draining_ = false;
  bool stop_ = false;
  absl::Status failure_;
  uint64_t seed_state_ = 0;
  int64_t finished_unpublished_ = 0;  // loop thread only
  EngineStats stats_;
  std::thread loop_;
};

}  // namespace glm::engine
