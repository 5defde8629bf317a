#include "engine/pipeline/pipelined_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_util.h"

namespace glm::engine::pipeline {

PipelinedModel::PipelinedModel(std::unique_ptr<Model> local, std::unique_ptr<StageGroup> group,
                               int num_blocks, int max_steps_in_flight)
    : group_(std::move(group)), local_(std::move(local)) {
  geometry_ = local_->kv_geometry();
  geometry_.num_blocks = num_blocks;
  const ShardTopology& t = group_->topology();
  max_steps_in_flight_ = max_steps_in_flight > 0 ? max_steps_in_flight : t.pp_size;
  heartbeat_interval_ = t.op_timeout / 4;
  last_message_ = std::chrono::steady_clock::now();
  sender_ = std::thread([this] { SenderLoop(); });
  if (t.pp_size > 1) receiver_ = std::thread([this] { ReceiverLoop(); });
}

PipelinedModel::~PipelinedModel() { Stop(); }

void PipelinedModel::SenderLoop() {
  while (true) {
    StepMessage m;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return quit_ || !to_send_.empty(); });
      if (to_send_.empty()) return;
      m = std::move(to_send_.front());
      to_send_.pop_front();
    }
    // A failure is the group's (StageGroup::failure); later sends return it at once.
    const absl::Status s = group_->Send(m);
    if (s.ok()) ++num_messages_;
    {
      std::lock_guard<std::mutex> l(mu_);
      ++num_sent_;
    }
    cv_.notify_all();
  }
}

void PipelinedModel::ReceiverLoop() {
  while (true) {
    std::shared_ptr<Pending> p;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return quit_ || !to_receive_.empty(); });
      if (to_receive_.empty()) return;
      p = to_receive_.front();
      to_receive_.pop_front();
    }
    ForwardResult result;
    const absl::Status s = group_->RecvResult(p->batch, &result);
    {
      std::lock_guard<std::mutex> l(mu_);
      p->status = s;
      p->result = std::move(result);
      p->done = true;
    }
    cv_.notify_all();
  }
}

absl::Status PipelinedModel::SendMessage(StepMessage message) {
  if (stopped_) return absl::FailedPreconditionError("the pipeline group was stopped");
  if (absl::Status f = group_->failure(); !f.ok()) return f;
  message.released = std::move(released_);
  released_.clear();
  {
    std::lock_guard<std::mutex> l(mu_);
    to_send_.push_back(std::move(message));
    ++num_queued_;
  }
  cv_.notify_all();
  last_message_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status PipelinedModel::FlushSends() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return num_sent_ == num_queued_; });
  return group_->failure();
}

absl::Status PipelinedModel::Await(const std::shared_ptr<Pending>& p) {
  {
    std::lock_guard<std::mutex> l(mu_);
    to_receive_.push_back(p);
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return p->done; });
  return p->status;
}

absl::StatusOr<int64_t> PipelinedModel::Submit(const ForwardBatch& batch) {
  if (static_cast<int>(outstanding_.size()) >= max_steps_in_flight_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PipelinedModel::Submit: ", outstanding_.size(),
        " steps are outstanding, the most this model keeps (max_steps_in_flight): collect one"));
  }
  auto p = std::make_shared<Pending>();
  p->ticket = ++last_ticket_;
  p->batch = batch;
  // The slices go on the wire without activations; the head's stage starts at layer 0.
  for (SequenceSlice& s : p->batch.seqs) {
    s.input_residual.clear();
    s.input_topk.clear();
  }
  StepMessage m;
  m.kind = MessageKind::kStep;
  m.batch = p->batch;
  if (absl::Status s = SendMessage(std::move(m)); !s.ok()) return s;
  ForwardResult local;
  if (absl::Status s = group_->RunStep(*local_, p->batch, &local); !s.ok()) return s;
  if (group_->topology().pp_size == 1) {
    // The head is the last stage (TP only): its outputs are the result.
    p->result = std::move(local);
    p->done = true;
  } else {
    std::lock_guard<std::mutex> l(mu_);
    to_receive_.push_back(p);
  }
  cv_.notify_all();
  outstanding_.push_back(p);
  return p->ticket;
}

absl::Status PipelinedModel::Collect(int64_t ticket, ForwardResult* result) {
  if (outstanding_.empty() || outstanding_.front()->ticket != ticket) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PipelinedModel::Collect: step ", ticket, " is not the oldest outstanding (",
        outstanding_.empty() ? int64_t{0} : outstanding_.front()->ticket,
        "): collect in submission order"));
  }
  std::shared_ptr<Pending> p = std::move(outstanding_.front());
  outstanding_.pop_front();
  {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return p->done; });
  }
  if (!p->status.ok()) return p->status;
  *result = std::move(p->result);
  return absl::OkStatus();
}

absl::Status PipelinedModel::Forward(const ForwardBatch& batch, ForwardResult* result) {
  absl::StatusOr<int64_t> ticket = Submit(batch);
  if (!ticket.ok()) return ticket.status();
  return Collect(*ticket, result);
}

absl::Status PipelinedModel::ForwardMtp(const ForwardBatch& batch,
                                        const std::vector<std::vector<float>>& hidden,
                                        ForwardResult* result) {
  if (!outstanding_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PipelinedModel::ForwardMtp with ", outstanding_.size(),
        " steps outstanding: collect them first (MTP keeps one step in flight)"));
  }
  StepMessage m;
  m.kind = MessageKind::kMtpStep;
  m.batch = batch;
  m.mtp_hidden = hidden;
  if (absl::Status s = SendMessage(m); !s.ok()) return s;
  GLM_RETURN_IF_ERROR(group_->RunMtpStep(*local_, batch, hidden, result));
  if (group_->topology().pp_size == 1) return absl::OkStatus();
  auto p = std::make_shared<Pending>();
  p->batch = batch;
  GLM_RETURN_IF_ERROR(Await(p));
  *result = std::move(p->result);
  return absl::OkStatus();
}

void PipelinedModel::ReleaseSequence(int64_t seq_id) {
  local_->ReleaseSequence(seq_id);
  released_.push_back(seq_id);
}

std::chrono::steady_clock::time_point PipelinedModel::next_heartbeat() const {
  return last_message_ + heartbeat_interval_;
}

absl::Status PipelinedModel::HeartbeatIfDue() {
  if (absl::Status f = group_->failure(); !f.ok()) return f;
  if (std::chrono::steady_clock::now() < next_heartbeat()) return absl::OkStatus();
  StepMessage m;
  m.kind = MessageKind::kIdle;
  return SendMessage(std::move(m));
}

void PipelinedModel::Stop() {
  if (stopped_) return;
  // The last stage hands every outstanding result over before it reads the stop message.
  for (const std::shared_ptr<Pending>& p : outstanding_) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return p->done; });
  }
  outstanding_.clear();
  if (group_->failure().ok()) {
    StepMessage m;
    m.kind = MessageKind::kStop;
    absl::Status s = SendMessage(std::move(m));
    if (s.ok()) s = FlushSends();
    if (s.ok()) s = group_->Barrier();
    if (!s.ok()) {
      GLM_LOG_WARN("pipeline stop message not delivered: {}", s.ToString());
    }
  }
  stopped_ = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  sender_.join();
  if (receiver_.joinable()) receiver_.join();
  group_->Close();
}

}  // namespace glm::engine::pipeline
