#include "agent/service/status_publisher.h"

namespace glm::agent {

StatusPublisher::StatusPublisher(std::string node, std::string instance_id, Clock* clock)
    : clock_(clock), start_(clock->Now()) {
  status_.set_node(std::move(node));
  status_.set_instance_id(std::move(instance_id));
  status_.set_version(1);
  status_.set_shard_state(glm::v1::SHARD_STATE_NONE);
}

void StatusPublisher::Update(const std::function<void(glm::v1::AgentStatus&)>& mutate) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t version = status_.version();
    mutate(status_);
    status_.set_version(version + 1);
  }
  cv_.notify_all();
}

glm::v1::AgentStatus StatusPublisher::SnapshotLocked() const {
  glm::v1::AgentStatus out = status_;
  out.set_uptime_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_->Now() - start_).count());
  out.set_heartbeat(false);
  return out;
}

glm::v1::AgentStatus StatusPublisher::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return SnapshotLocked();
}

bool StatusPublisher::Wait(int64_t seen_version, std::chrono::milliseconds heartbeat,
                           glm::v1::AgentStatus* out) {
  std::unique_lock<std::mutex> lock(mu_);
  bool changed = cv_.wait_for(lock, heartbeat, [&] {
    return shutdown_ || status_.version() > seen_version;
  });
  if (shutdown_) return false;
  *out = SnapshotLocked();
  out->set_heartbeat(!changed);
  return true;
}

void StatusPublisher::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

}  // namespace glm::agent
