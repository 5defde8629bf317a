#include "controller/orchestrate/health_monitor.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace glm::orchestrate {

HealthMonitor::HealthMonitor(Clock* clock, ClusterState* state, Clock::Duration heartbeat_timeout)
    : clock_(clock), state_(state), timeout_(heartbeat_timeout) {}

bool HealthMonitor::AliveLocked(const Liveness& l, Clock::TimePoint now) const {
  return !l.broken && !l.timed_out && now - l.last_seen <= timeout_;
}

std::string HealthMonitor::ShardProblem(const std::string& node, const Liveness& l) {
  if (!l.expect_shard || !l.shard_known) return "";
  if (l.shard_state == glm::v1::SHARD_STATE_LOADED ||
      l.shard_state == glm::v1::SHARD_STATE_RUNNING) {
    return "";
  }
  std::string state = glm::v1::ShardState_Name(l.shard_state);
  if (state.rfind("SHARD_STATE_", 0) == 0) state = state.substr(12);
  return absl::StrFormat(
      "engine shard is %s, not loaded (the agent restarted or the shard failed since bring-up); "
      "self-healing reloads its replica once every agent of it answers (see `glmctl status` for "
      "the shard's last error on %s; `glmctl restart --replica N` reloads it by hand)",
      state, node);
}

void HealthMonitor::ApplyLocked(const std::string& node, Liveness& l, const std::string& reason) {
  if (!l.armed) return;
  bool alive = AliveLocked(l, clock_->Now());
  glm::v1::NodeState current = state_->node_state(node);
  std::string shard_problem = alive ? ShardProblem(node, l) : "";
  if (alive && (l.degraded || !shard_problem.empty())) {
    const std::string& why = l.degraded ? l.degraded_message : shard_problem;
    if (current != glm::v1::NODE_STATE_DEGRADED) {
      GLM_LOG_WARN("node degraded node={} reason=\"{}\"", node, why);
    }
    state_->SetNodeState(node, glm::v1::NODE_STATE_DEGRADED, why);
  } else if (alive && current != glm::v1::NODE_STATE_READY) {
    state_->SetNodeState(node, glm::v1::NODE_STATE_READY);
    state_->ClearNodeError(node);
    GLM_LOG_INFO("node ready node={} instance={}", node, l.instance_id);
  } else if (!alive && current != glm::v1::NODE_STATE_UNREACHABLE) {
    state_->SetNodeState(node, glm::v1::NODE_STATE_UNREACHABLE, reason);
    GLM_LOG_WARN("node unreachable node={} reason=\"{}\"", node, reason);
  }
}

void HealthMonitor::Arm(const std::string& node, bool expect_shard) {
  std::lock_guard<std::mutex> lock(mu_);
  Liveness& l = nodes_[node];
  l.armed = true;
  l.expect_shard = expect_shard;
  l.shard_known = false;
  l.timed_out = false;
  l.last_seen = std::max(l.last_seen, clock_->Now());
  ApplyLocked(node, l, l.broken ? "status stream broken" : "");
}

void HealthMonitor::DisarmAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, l] : nodes_) l.armed = false;
}

bool HealthMonitor::OnStatus(const std::string& node, const glm::v1::AgentStatus& status) {
  std::lock_guard<std::mutex> lock(mu_);
  Liveness& l = nodes_[node];
  if (status.instance_id() == l.instance_id && status.version() < l.version) {
    return false;  // stale: an older snapshot of the same agent process
  }
  l.instance_id = status.instance_id();
  l.version = status.version();
  l.broken = false;
  l.timed_out = false;
  l.last_seen = clock_->Now();
  l.degraded = status.degraded();
  l.degraded_message = status.degraded_message();
  l.shard_known = true;
  l.shard_state = status.has_shard() ? status.shard().state() : status.shard_state();
  state_->RecordStatus(node, status);
  ApplyLocked(node, l, "");
  return true;
}

void HealthMonitor::OnStreamBroken(const std::string& node, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  Liveness& l = nodes_[node];
  l.broken = true;
  ApplyLocked(node, l, "status stream broken: " + error);
}

std::vector<std::string> HealthMonitor::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> timed_out;
  auto now = clock_->Now();
  for (auto& [name, l] : nodes_) {
    if (!l.broken && !l.timed_out && l.last_seen != Clock::TimePoint{} &&
        now - l.last_seen > timeout_) {
      l.timed_out = true;
      timed_out.push_back(name);
      double silent_s = std::chrono::duration<double>(now - l.last_seen).count();
      ApplyLocked(name, l,
                  absl::StrFormat("no heartbeat for %.1f s (limit %.1f s): the agent is hung or "
                                  "the network to it is down",
                                  silent_s, std::chrono::duration<double>(timeout_).count()));
    }
  }
  return timed_out;
}

bool HealthMonitor::alive(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  return it != nodes_.end() && AliveLocked(it->second, clock_->Now());
}

}  // namespace glm::orchestrate
