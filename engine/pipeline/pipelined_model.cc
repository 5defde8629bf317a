#include "engine/pipeline/pipelined_model.h"

#include <utility>

#include "common/logging.h"

namespace glm::engine::pipeline {

PipelinedModel::PipelinedModel(std::unique_ptr<Model> local, std::unique_ptr<StageGroup> group,
                               int num_blocks)
    : group_(std::move(group)), local_(std::move(local)) {
  geometry_ = local_->kv_geometry();
  geometry_.num_blocks = num_blocks;
  heartbeat_interval_ = group_->topology().op_timeout / 4;
  last_message_ = std::chrono::steady_clock::now();
}

PipelinedModel::~PipelinedModel() { Stop(); }

absl::Status PipelinedModel::SendMessage(StepMessage message) {
  if (stopped_) return absl::FailedPreconditionError("the pipeline group was stopped");
  message.released = std::move(released_);
  released_.clear();
  absl::Status s = group_->Send(message);
  last_message_ = std::chrono::steady_clock::now();
  if (s.ok()) ++num_messages_;
  return s;
}

absl::Status PipelinedModel::Forward(const ForwardBatch& batch, ForwardResult* result) {
  StepMessage m;
  m.kind = MessageKind::kStep;
  m.batch = batch;
  // The slices go on the wire without activations; the head's stage starts at layer 0.
  for (SequenceSlice& s : m.batch.seqs) {
    s.input_residual.clear();
    s.input_topk.clear();
  }
  if (absl::Status s = SendMessage(m); !s.ok()) return s;
  return group_->RunStep(*local_, m.batch, result);
}

absl::Status PipelinedModel::ForwardMtp(const ForwardBatch& batch,
                                        const std::vector<std::vector<float>>& hidden,
                                        ForwardResult* result) {
  StepMessage m;
  m.kind = MessageKind::kMtpStep;
  m.batch = batch;
  m.mtp_hidden = hidden;
  if (absl::Status s = SendMessage(m); !s.ok()) return s;
  return group_->RunMtpStep(*local_, m.batch, m.mtp_hidden, result);
}

void PipelinedModel::ReleaseSequence(int64_t seq_id) {
  local_->ReleaseSequence(seq_id);
  released_.push_back(seq_id);
}

std::chrono::steady_clock::time_point PipelinedModel::next_heartbeat() const {
  return last_message_ + heartbeat_interval_;
}

absl::Status PipelinedModel::HeartbeatIfDue() {
  if (!group_->failure().ok()) return group_->failure();
  if (std::chrono::steady_clock::now() < next_heartbeat()) return absl::OkStatus();
  StepMessage m;
  m.kind = MessageKind::kIdle;
  return SendMessage(std::move(m));
}

void PipelinedModel::Stop() {
  if (stopped_) return;
  if (group_->failure().ok()) {
    StepMessage m;
    m.kind = MessageKind::kStop;
    absl::Status s = SendMessage(std::move(m));
    if (s.ok()) s = group_->Barrier();
    if (!s.ok()) {
      GLM_LOG_WARN("pipeline stop message not delivered: {}", s.ToString());
    }
  }
  stopped_ = true;
  group_->Close();
}

}  // namespace glm::engine::pipeline
