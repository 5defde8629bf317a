// The controller's live view of the cluster: bring-up phase, every node, every replica. Written by
// the bring-up steps and the health monitor, read by Status/Health RPCs. Thread-safe.
//
// Replica state is derived, never stored: Failed if any of its nodes is Unreachable or Failed,
// Degraded if any is Degraded, Ready if all are Ready, Pending otherwise.
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

class ClusterState {
 public:
  explicit ClusterState(Clock* clock);

  // Replaces the node list (all Pending), keeping nothing from before. Replicas are cleared.
  void Reset(const ClusterTopology& topology);
  void SetReplicas(const std::vector<std::vector<std::string>>& replicas);

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

 private:
  struct Node {
    glm::v1::NodeStatus status;
    bool has_heartbeat = false;
    Clock::TimePoint last_heartbeat{};
  };
  // `why` (optional): the reason when the replica is Failed.
  glm::v1::ReplicaState DeriveReplicaLocked(const std::vector<std::string>& nodes,
                                            std::string* why = nullptr) const;

  Clock* const clock_;
  mutable std::mutex mu_;
  std::string cluster_name_;
  std::string config_path_;
  glm::v1::BringUpPhase phase_ = glm::v1::BRING_UP_PHASE_IDLE;
  std::string phase_message_;
  std::vector<std::string> order_;
  std::map<std::string, Node> nodes_;
  std::vector<std::vector<std::string>> replicas_;
};

}  // namespace glm::orchestrate
