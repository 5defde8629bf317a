// The agent's versioned status, published to WatchStatus streams. Every change bumps `version`
// (strictly increasing within one process, identified by `instance_id`); heartbeats repeat the
// current version with heartbeat=true, so a receiver can tell liveness from change.
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "glm/v1/agent.pb.h"

namespace glm::agent {

class StatusPublisher {
 public:
  StatusPublisher(std::string node, std::string instance_id, Clock* clock);

  // Applies `mutate` to the status under the lock, bumps the version, wakes every waiter.
  void Update(const std::function<void(glm::v1::AgentStatus&)>& mutate);

  // The current status with uptime filled in.
  glm::v1::AgentStatus Snapshot() const;

  // Blocks until the version exceeds `seen_version` (returns the new status, heartbeat=false),
  // or `heartbeat` elapses (returns the current status with heartbeat=true). Returns false once
  // Shutdown() was called.
  bool Wait(int64_t seen_version, std::chrono::milliseconds heartbeat, glm::v1::AgentStatus* out);

  // Ends every Wait (graceful shutdown: streams finish OK instead of being cut).
  void Shutdown();

 private:
  glm::v1::AgentStatus SnapshotLocked() const;

  Clock* const clock_;
  const Clock::TimePoint start_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  glm::v1::AgentStatus status_;
  bool shutdown_ = false;
};

}  // namespace glm::agent
