// The head's view of a replica spread over ranks: a Model the scheduler drives exactly like a
// local one. Each Forward broadcasts the step (step_message.h) to every rank, runs the head's own
// stage (layers [0, last_layer] of pp stage 0, TP rank 0) and returns the last stage's result
// (stage_group.h). The followers (StageFollower) mirror every call.
//
// - kv_geometry(): the local stage's, with num_blocks the smallest over the replica (every rank
//   holds each block the head's block manager hands out).
// - ReleaseSequence: applied locally at once and queued; the queue rides on the next message
//   (step or idle), so every rank releases before its next step, as the head did.
// - Failures are never contained (AfterFailedStep returns the failure): once a step fails
//   anywhere the group is closed and every later call returns the first error, which names the
//   rank and the stage.
// - Heartbeat: while the scheduler is idle the engine calls HeartbeatIfDue, which sends an idle
//   message every op_timeout / 4, so followers waiting for the next step do not time out and a
//   dead or stalled follower is seen within op_timeout even without traffic.
//
// Micro-batching is the next step: today one step is in flight, so with PP stages each stage
// idles while the others run. Splitting the running sequences into >= pp_size micro-batches with
// a step id each, and letting the head keep pp_size steps outstanding (results matched by id),
// keeps every stage busy; the wire format already numbers messages.
//
// Not thread-safe: the engine's step-loop thread only.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "engine/model/forward_batch.h"
#include "engine/pipeline/stage_group.h"

namespace glm::engine::pipeline {

class PipelinedModel : public Model {
 public:
  // `local` holds the head's stage; `group` is formed (StageGroup::Create); `num_blocks` is the
  // replica's agreed KV block count (StageGroup::AgreeKvBlocks).
  PipelinedModel(std::unique_ptr<Model> local, std::unique_ptr<StageGroup> group, int num_blocks);
  ~PipelinedModel() override;

  const ModelConfig& config() const override { return local_->config(); }
  const KvCacheGeometry& kv_geometry() const override { return geometry_; }
  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) override;
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
  // Tells every follower to leave its loop (best effort: a failed group has nobody to tell) and
  // closes the group. Later calls fail.
  void Stop();
  // Messages sent so far (steps and heartbeats): the head's progress counter.
  int64_t num_messages() const { return num_messages_; }

 private:
  absl::Status SendMessage(StepMessage message);

  std::unique_ptr<StageGroup> group_;  // declared first: the model goes before its TP group
  std::unique_ptr<Model> local_;
  KvCacheGeometry geometry_;
  std::vector<int64_t> released_;
  std::chrono::steady_clock::duration heartbeat_interval_;
  std::chrono::steady_clock::time_point last_message_;
  int64_t num_messages_ = 0;
  bool stopped_ = false;
};

}  // namespace glm::engine::pipeline
