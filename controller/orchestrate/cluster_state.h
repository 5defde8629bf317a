// The controller's live view of the cluster: bring-up phase, every node, every replica. Written by
// the bring-up steps and the health monitor, read by Status/Health RPCs. Thread-safe.
//
// Replica state is derived from its nodes: Failed if any of its nodes is Unreachable or Failed
// (or its shard failed), Degraded if any is Degraded, Ready if all are Ready, Pending otherwise.
// The controller's own intent overrides that: a replica it drains shows Draining, one it
// reloads Restarting, and one it holds out of service (a failed canary, an exhausted restart
// budget) Failed with the reason. Only Ready replicas are routed to.
//
// The cluster's health follows: Pending until bring-up reached Ready, then Ready when every
// replica is, Degraded when some are, Failed when none is.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/orchestrate/topology.h"
#include "glm/v1/agent.pb.h"
#include "glm/v1/controller.pb.h"

namespace glm::orchestrate {

// What the controller is doing with a replica (see the header comment).
enum class ReplicaMode { kServe, kDraining, kRestarting, kHeld };

class ClusterState {
 public:
  explicit ClusterState(Clock* clock);

  // Replaces the node list (all Pending), keeping nothing from before. Replicas are cleared.
  void Reset(const ClusterTopology& topology);
  // Sets the replicas (node names of each); every replica's mode goes back to kServe.
  void SetReplicas(const std::vector<std::vector<std::string>>& replicas);
  // The controller's intent for replica `index` (ignored when out of range). `message` says why
  // (shown as the replica's message while the mode is not kServe).
  void SetReplicaMode(int index, ReplicaMode mode, const std::string& message = "");
  ReplicaMode replica_mode(int index) const;
  // Self-healing bookkeeping shown in status: restarts within the window and the budget.
  void SetReplicaRestarts(int index, int auto_restarts, int budget, bool exhausted);
  void SetReplicaEpoch(int index, int64_t epoch);
  int replica_count() const;

  void SetPhase(glm::v1::BringUpPhase phase, const std::string& message = "");
  glm::v1::BringUpPhase phase() const;

  // Sets a node's state; a non-empty `error` becomes its last_error (an empty one keeps it).
  void SetNodeState(const std::string& node, glm::v1::NodeState state,
                    const std::string& error = "");
  glm::v1::NodeState node_state(const std::string& node) const;
  void ClearNodeError(const std::string& node);
  // The node's resolved GID entry (preflight; later the agent's watcher via RecordStatus).
  void SetNodeGid(const std::string& node, const glm::v1::GidEntry& gid);

  // The node's engine shard as its agent reported it (the Load phase's last progress message;
  // afterwards RecordStatus keeps it current).
  void SetNodeShard(const std::string& node, const glm::v1::ShardStatus& shard);

  void RecordInfo(const std::string& node, const glm::v1::InfoResponse& info);
  // Records a status message's fields and the time it arrived (heartbeat age).
  void RecordStatus(const std::string& node, const glm::v1::AgentStatus& status);

  // Full snapshot with derived replica states and heartbeat ages.
  glm::v1::ClusterStatus Snapshot() const;
  // True iff there is at least one replica and every replica is Ready; `why` names the rest.
  bool Healthy(std::string* why) const;
  // Pending / Ready / Degraded / Failed (header comment); `why` says why it is not Ready.
  glm::v1::ClusterHealth Health(std::string* why) const;

 private:
  struct Node {
    glm::v1::NodeStatus status;
    bool has_heartbeat = false;
    Clock::TimePoint last_heartbeat{};
  };
  // `why` (optional): the reason when the replica is Failed.
  glm::v1::ReplicaState DeriveReplicaLocked(const std::vector<std::string>& nodes,
                                            std::string* why = nullptr) const;

  struct ReplicaControl {
    ReplicaMode mode = ReplicaMode::kServe;
    std::string message;
    int auto_restarts = 0;
    int budget = 0;
    bool exhausted = false;
    int64_t epoch = 0;
  };
  static glm::v1::ClusterHealth HealthOf(const glm::v1::ClusterStatus& snap, std::string* why);

  Clock* const clock_;
  mutable std::mutex mu_;
  std::string cluster_name_;
  std::string config_path_;
  glm::v1::BringUpPhase phase_ = glm::v1::BRING_UP_PHASE_IDLE;
  std::string phase_message_;
  std::vector<std::string> order_;
  std::map<std::string, Node> nodes_;
  std::vector<std::vector<std::string>> replicas_;
  std::vector<ReplicaControl> controls_;  // one per replica
};

}  // namespace glm::orchestrate
