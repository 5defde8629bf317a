// Decides whether each node is alive from its agent's status stream.
//
// A node is alive while its stream is not broken and the last message (change or heartbeat)
// arrived at most `heartbeat_timeout` ago (default 3 s; agents send a heartbeat every 1 s). Arming
// a node (bring-up finished for it) counts as having just heard from it, which gives its watcher
// one timeout to open the stream. Once armed the monitor drives the node's state: alive -> Ready,
// not alive -> Unreachable with a last_error saying why; alive but reporting `degraded` (its GID
// entry moved after bring-up) -> Degraded with the agent's message as last_error. A node armed
// with `expect_shard` (bring-up loaded its engine shard) whose agent then reports no Loaded or
// Running shard (it restarted, or the shard failed) is Degraded too, with a message naming the
// shard state and the fix (self-healing reloads its replica; `glmctl restart --replica N` by
// hand). Unarmed nodes are tracked but their state is left to bring-up.
//
// Stale messages are dropped: within one agent process (instance_id) versions must not go back.
// A new instance_id (the agent restarted) resets the version.
//
// Time comes from the injected Clock; Tick() evaluates timeouts (the controller calls it every
// 250 ms; tests call it by hand with a FakeClock). Thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/orchestrate/cluster_state.h"
#include "glm/v1/agent.pb.h"

namespace glm::orchestrate {

class HealthMonitor {
 public:
  HealthMonitor(Clock* clock, ClusterState* state,
                Clock::Duration heartbeat_timeout = std::chrono::seconds(3));

  // Starts/stops driving `node`'s state. Arm after bring-up reached Ready; disarm on Down or
  // before a re-run of bring-up. `expect_shard`: bring-up loaded a shard on the node.
  void Arm(const std::string& node, bool expect_shard = false);
  void DisarmAll();

  // Stream events, from the node's watcher thread.
  // Returns false when the message is stale (older version of the same instance) and was dropped.
  bool OnStatus(const std::string& node, const glm::v1::AgentStatus& status);
  void OnStreamBroken(const std::string& node, const std::string& error);

  // Evaluates heartbeat timeouts. Returns the nodes that just became Unreachable because their
  // heartbeats stopped (their watchers should cancel and reconnect the stream).
  std::vector<std::string> Tick();

  bool alive(const std::string& node) const;
  Clock::Duration heartbeat_timeout() const { return timeout_; }

 private:
  struct Liveness {
    bool armed = false;
    bool broken = false;     // the stream failed and no message arrived since
    bool timed_out = false;  // heartbeats stopped and no message arrived since
    Clock::TimePoint last_seen{};
    std::string instance_id;
    int64_t version = 0;
    bool degraded = false;         // the agent reports a degraded state (e.g. GID entry moved)
    std::string degraded_message;
    bool expect_shard = false;     // armed after a bring-up that loaded the node's shard
    bool shard_known = false;      // a status arrived since Arm (shard_state is current)
    glm::v1::ShardState shard_state = glm::v1::SHARD_STATE_UNSPECIFIED;
  };
  // Empty when the node is healthy as far as its shard goes; else why it is Degraded.
  static std::string ShardProblem(const std::string& node, const Liveness& l);
  bool AliveLocked(const Liveness& l, Clock::TimePoint now) const;
  void ApplyLocked(const std::string& node, Liveness& l, const std::string& reason);

  Clock* const clock_;
  ClusterState* const state_;
  const Clock::Duration timeout_;
  mutable std::mutex mu_;
  std::map<std::string, Liveness> nodes_;
};

}  // namespace glm::orchestrate
