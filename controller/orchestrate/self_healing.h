// Self-healing: the controller's reconcile loop brings a replica whose group broke back into
// service with no command, once every one of its agents answers again (systemd or the local
// launcher restarted the dead one). Level-triggered: each pass looks at the cluster as it is now
// (ClusterState and the health monitor), never at a queue of events, so a missed or repeated
// event changes nothing.
//
// A restart budget (lifecycle.restart_budget restarts of one replica per restart_window) stops
// a flapping replica: beyond it the replica is held Failed with the reason until an operator
// restarts it (`glmctl restart --replica N`, which also clears its count).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "glm/v1/controller.pb.h"

namespace glm::orchestrate {

// Restarts per replica in a sliding window. Not thread-safe (the reconcile loop owns it).
class RestartBudget {
 public:
  RestartBudget(int budget, Clock::Duration window) : budget_(budget), window_(window) {}

  // True when `replica` had fewer than `budget` restarts in the window ending at `now`.
  bool Allows(int replica, Clock::TimePoint now);
  void Record(int replica, Clock::TimePoint now);
  int Count(int replica, Clock::TimePoint now);
  void Reset(int replica) { restarts_.erase(replica); }
  void Configure(int budget, Clock::Duration window) {
    budget_ = budget;
    window_ = window;
  }
  int budget() const { return budget_; }
  Clock::Duration window() const { return window_; }

 private:
  void Expire(std::deque<Clock::TimePoint>& times, Clock::TimePoint now) const;

  int budget_;
  Clock::Duration window_;
  std::map<int, std::deque<Clock::TimePoint>> restarts_;
};

// The replicas of `snap` that self-healing should restart now: `may_heal(index)` (its budget
// allows it), every node's agent is alive (`alive(node)`), the replica is not being drained or
// restarted, and it does not serve: Failed, or Degraded with some node's shard not Running. (A
// Degraded replica whose shards all run, say with a moved GID entry, is left to the operator.)
std::vector<int> ReplicasToHeal(const glm::v1::ClusterStatus& snap,
                                const std::function<bool(const std::string&)>& alive,
                                const std::function<bool(int)>& may_heal);

}  // namespace glm::orchestrate
