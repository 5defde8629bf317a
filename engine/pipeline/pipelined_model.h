// The head's view of a replica spread over ranks: a Model the scheduler drives exactly like a
// local one. Each step sends the message (step_message.h) to every rank, runs the head's own
// stage (layers [0, last_layer] of pp stage 0, TP rank 0) and returns the last stage's result
// (stage_group.h). The followers (StageFollower) mirror every call.
//
// Steps in flight (micro-batches): Submit / Collect (Model's asynchronous form) keep up to
// max_steps_in_flight() steps outstanding (the load option, pp_size by default), so stage s works
// on step i while stage s + 1 works on step i - 1. Three threads on the head, one communicator
// each (stage_group.h):
//  - the step thread (the caller): Submit queues the message for the sender, runs stage 0 and
//    hands its activations to stage 1 (which takes them once it has finished the step before);
//  - the sender: sends the messages in order; a send waits only for its receiver to take it, so
//    the step thread never waits for a busy stage to take the next message;
//  - the receiver (pp_size > 1): receives the last stage's results in submission order; Collect
//    waits for the oldest.
// Forward is Submit then Collect (one step in flight). ForwardMtp needs no step outstanding (the
// scheduler keeps one step in flight with MTP) and waits for its result.
//
// - kv_geometry(): the local stage's, with num_blocks the smallest over the replica (every rank
//   holds each block the head's block manager hands out).
// - ReleaseSequence: applied locally at once and queued; the queue rides on the next message
//   (step or idle), so every rank releases before its next step, as the head did. The caller
//   never releases a sequence whose step is outstanding (Model::Submit), so no rank frees blocks
//   a queued step still uses.
// - Failures are never contained (AfterFailedStep returns the failure): once a step fails
//   anywhere the group is failed and every later call (and every outstanding Collect) returns
//   the first error, which names the rank and the stage.
// - Heartbeat: while the scheduler is idle the engine calls HeartbeatIfDue, which sends an idle
//   message every op_timeout / 4, so followers waiting for the next step do not time out and a
//   dead or stalled follower is seen within op_timeout even without traffic.
//
// Not thread-safe: the engine's step-loop thread only (the sender and receiver are internal).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/model/forward_batch.h"
#include "engine/pipeline/stage_group.h"

namespace glm::engine::pipeline {

class PipelinedModel : public Model {
 public:
  // `local` holds the head's stage; `group` is formed (StageGroup::Create); `num_blocks` is the
  // replica's agreed KV block count (StageGroup::AgreeKvBlocks). `max_steps_in_flight` <= 0
  // means pp_size; 1 keeps one step in flight.
  PipelinedModel(std::unique_ptr<Model> local, std::unique_ptr<StageGroup> group, int num_blocks,
                 int max_steps_in_flight = 0);
  ~PipelinedModel() override;

  const ModelConfig& config() const override { return local_->config(); }
  const KvCacheGeometry& kv_geometry() const override { return geometry_; }
  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) override;
  absl::StatusOr<int64_t> Submit(const ForwardBatch& batch) override;
  absl::Status Collect(int64_t ticket, ForwardResult* result) override;
  int max_steps_in_flight() const override { return max_steps_in_flight_; }
  absl::Status ForwardMtp(const ForwardBatch& batch, const std::vector<std::vector<float>>& hidden,
                          ForwardResult* result) override;
  MemoryPlan memory_plan() const override { return local_->memory_plan(); }
  DecodeGraphStats decode_graph_stats() const override { return local_->decode_graph_stats(); }
  absl::Status AfterFailedStep(const absl::Status& failure) const override { return failure; }
  void ReleaseSequence(int64_t seq_id) override;

  // When the last message went out at least op_timeout / 4 ago: an idle message (with the
  // pending releases). Returns the group's failure, if any.
  absl::Status HeartbeatIfDue();
  // When the next heartbeat is due (the engine's idle wait ends there).
  std::chrono::steady_clock::time_point next_heartbeat() const;
  // Waits for the outstanding steps, tells every follower to leave its loop (best effort: a
  // failed group has nobody to tell), stops the sender and receiver and closes the group. Later
  // calls fail.
  void Stop();
  // Messages sent so far (steps and heartbeats): the head's progress counter. Any thread.
  int64_t num_messages() const { return num_messages_.load(); }
  // Wall time in the head's own layers so far (StageGroup::compute_nanos). Any thread.
  int64_t compute_nanos() const { return group_->compute_nanos(); }
  // Steps submitted and not collected.
  int num_steps_in_flight() const { return static_cast<int>(outstanding_.size()); }

 private:
  // A step whose result the receiver fills (or, pp_size 1, the step thread at once).
  struct Pending {
    int64_t ticket = 0;
    ForwardBatch batch;  // the slices as sent (sizes of the result)
    bool done = false;
    absl::Status status;
    ForwardResult result;
  };

  // Queues `message` (with the pending releases) for the sender.
  absl::Status SendMessage(StepMessage message);
  // Waits until the sender has sent everything queued (or failed).
  absl::Status FlushSends();
  // Queues `pending` for the receiver and waits for its result.
  absl::Status Await(const std::shared_ptr<Pending>& pending);
  void SenderLoop();
  void ReceiverLoop();

  std::unique_ptr<StageGroup> group_;  // declared first: the model goes before its TP group
  std::unique_ptr<Model> local_;
  KvCacheGeometry geometry_;
  int max_steps_in_flight_ = 1;
  std::vector<int64_t> released_;
  std::chrono::steady_clock::duration heartbeat_interval_;
  std::chrono::steady_clock::time_point last_message_;
  std::atomic<int64_t> num_messages_{0};
  int64_t last_ticket_ = 0;
  std::deque<std::shared_ptr<Pending>> outstanding_;  // step thread: submission order
  bool stopped_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StepMessage> to_send_;                  // guarded by mu_
  int64_t num_queued_ = 0, num_sent_ = 0;            // guarded by mu_
  std::deque<std::shared_ptr<Pending>> to_receive_;  // guarded by mu_ (and Pending::done)
  bool quit_ = false;                                // guarded by mu_
  std::thread sender_;
  std::thread receiver_;
};

}  // namespace glm::engine::pipeline
