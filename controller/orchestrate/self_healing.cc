#include "controller/orchestrate/self_healing.h"

namespace glm::orchestrate {

void RestartBudget::Expire(std::deque<Clock::TimePoint>& times, Clock::TimePoint now) const {
  while (!times.empty() && now - times.front() >= window_) times.pop_front();
}

bool RestartBudget::Allows(int replica, Clock::TimePoint now) {
  return Count(replica, now) < budget_;
}

void RestartBudget::Record(int replica, Clock::TimePoint now) {
  restarts_[replica].push_back(now);
}

int RestartBudget::Count(int replica, Clock::TimePoint now) {
  auto it = restarts_.find(replica);
  if (it == restarts_.end()) return 0;
  Expire(it->second, now);
  return static_cast<int>(it->second.size());
}

std::vector<int> ReplicasToHeal(const glm::v1::ClusterStatus& snap,
                                const std::function<bool(const std::string&)>& alive,
                                const std::function<bool(int)>& may_heal) {
  std::map<std::string, const glm::v1::NodeStatus*> nodes;
  for (const auto& n : snap.nodes()) nodes[n.name()] = &n;
  std::vector<int> out;
  for (const glm::v1::ReplicaStatus& r : snap.replicas()) {
    if (r.state() == glm::v1::REPLICA_STATE_READY || r.state() == glm::v1::REPLICA_STATE_PENDING ||
        r.state() == glm::v1::REPLICA_STATE_DRAINING ||
        r.state() == glm::v1::REPLICA_STATE_RESTARTING || r.nodes_size() == 0 ||
        (may_heal && !may_heal(r.index()))) {
      continue;
    }
    bool all_alive = true;
    bool shard_down = false;
    for (const std::string& name : r.nodes()) {
      auto it = nodes.find(name);
      if (it == nodes.end() || !alive(name)) {
        all_alive = false;
        break;
      }
      if (it->second->shard().state() != glm::v1::SHARD_STATE_RUNNING ||
          (it->second->shard_state() != glm::v1::SHARD_STATE_UNSPECIFIED &&
           it->second->shard_state() != glm::v1::SHARD_STATE_RUNNING)) {
        shard_down = true;
      }
    }
    if (!all_alive) continue;
    if (shard_down || r.state() == glm::v1::REPLICA_STATE_FAILED) out.push_back(r.index());
  }
  return out;
}

}  // namespace glm::orchestrate
