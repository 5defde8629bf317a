// A rank other than the head: a thread that serves the head's messages (step_message.h) with
// this rank's stage until the head stops it or the group fails.
//
// Per message, strictly in order: apply the releases (Model::ReleaseSequence), then kStep runs
// StageGroup::RunStep, kMtpStep RunMtpStep, kIdle nothing, kStop a final barrier and a clean
// exit. With micro-batches in flight the head's next step message waits (in the head's sender)
// until this rank has handed the previous step on, so one thread suffices here. Any failure (a
// peer gone or silent past op_timeout, a malformed message, a model error) closes this rank's
// communicators, so the rest of the group fails at once, and ends the loop with that error.
//
// Thread-safety: the counters and status are readable from any thread (the agent polls them as
// the progress heartbeat); the model and the group belong to the loop thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "engine/model/forward_batch.h"
#include "engine/pipeline/stage_group.h"

namespace glm::engine::pipeline {

class StageFollower {
 public:
  // Starts the loop over `model` (not owned; outlives this) and `group`.
  StageFollower(Model* model, std::unique_ptr<StageGroup> group);
  // Asks the loop to stop after the message it is waiting for (the head sends one at least every
  // op_timeout / 4), joins it and closes the group, so the head sees this rank leave.
  ~StageFollower();
  StageFollower(const StageFollower&) = delete;
  StageFollower& operator=(const StageFollower&) = delete;

  // OK while serving and after the head stopped the group cleanly; the error that ended the loop
  // otherwise.
  absl::Status status() const;
  // The loop has ended (stopped by the head, or failed).
  bool done() const { return done_.load(); }
  // Steps served (kStep and kMtpStep) and messages received (steps and heartbeats).
  int64_t num_steps() const { return num_steps_.load(); }
  int64_t num_messages() const { return num_messages_.load(); }
  // Wall time in this rank's layers so far (StageGroup::compute_nanos).
  int64_t compute_nanos() const { return group_->compute_nanos(); }

 private:
  void Loop();
  absl::Status Serve(StepMessage& message);

  Model* model_;
  std::unique_ptr<StageGroup> group_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<int64_t> num_steps_{0};
  std::atomic<int64_t> num_messages_{0};
  mutable std::mutex mu_;
  absl::Status status_;
  std::thread thread_;
};

}  // namespace glm::engine::pipeline
