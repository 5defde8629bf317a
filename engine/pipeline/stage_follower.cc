#include "engine/pipeline/stage_follower.h"

#include <utility>

#include "common/logging.h"

namespace glm::engine::pipeline {

StageFollower::StageFollower(Model* model, std::unique_ptr<StageGroup> group)
    : model_(model), group_(std::move(group)) {
  thread_ = std::thread([this] { Loop(); });
}

StageFollower::~StageFollower() {
  stop_ = true;
  thread_.join();
}

absl::Status StageFollower::status() const {
  std::lock_guard<std::mutex> l(mu_);
  return status_;
}

absl::Status StageFollower::Serve(StepMessage& m) {
  for (int64_t id : m.released) model_->ReleaseSequence(id);
  ForwardResult result;
  switch (m.kind) {
    case MessageKind::kStep:
      return group_->RunStep(*model_, m.batch, &result);
    case MessageKind::kMtpStep:
      return group_->RunMtpStep(*model_, m.batch, m.mtp_hidden, &result);
    case MessageKind::kIdle:
    case MessageKind::kStop:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void StageFollower::Loop() {
  const ShardTopology& t = group_->topology();
  absl::Status end;
  while (!stop_.load()) {
    absl::StatusOr<StepMessage> m = group_->Receive();
    if (!m.ok()) {
      end = m.status();
      break;
    }
    ++num_messages_;
    if (m->kind == MessageKind::kStop) {
      end = group_->Barrier();
      if (end.ok()) {
        GLM_LOG_INFO("pipeline follower stopped by the head pp_rank={} tp_rank={} steps={}",
                     t.pp_rank, t.tp_rank, num_steps_.load());
      }
      break;
    }
    end = Serve(*m);
    if (!end.ok()) break;
    if (m->kind == MessageKind::kStep || m->kind == MessageKind::kMtpStep) ++num_steps_;
  }
  if (!end.ok()) {
    GLM_LOG_ERROR("pipeline follower failed pp_rank={} tp_rank={}: {}", t.pp_rank, t.tp_rank,
                  end.ToString());
  }
  group_->Close();
  {
    std::lock_guard<std::mutex> l(mu_);
    status_ = end;
  }
  done_ = true;
}

}  // namespace glm::engine::pipeline
