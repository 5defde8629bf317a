#include "controller/orchestrate/cluster_state.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"

namespace glm::orchestrate {

ClusterState::ClusterState(Clock* clock) : clock_(clock) {}

void ClusterState::Reset(const ClusterTopology& topology) {
  std::lock_guard<std::mutex> lock(mu_);
  cluster_name_ = topology.cluster_name;
  config_path_ = topology.config_path;
  order_.clear();
  nodes_.clear();
  replicas_.clear();
  controls_.clear();
  for (const auto& n : topology.nodes) {
    order_.push_back(n.name);
    Node& node = nodes_[n.name];
    node.status.set_name(n.name);
    node.status.set_address(n.address);
    node.status.set_state(glm::v1::NODE_STATE_PENDING);
    node.status.set_replica(-1);
    node.status.set_last_heartbeat_age_ms(-1);
  }
}

void ClusterState::SetReplicas(const std::vector<std::vector<std::string>>& replicas) {
  std::lock_guard<std::mutex> lock(mu_);
  replicas_ = replicas;
  controls_.assign(replicas.size(), ReplicaControl());
  for (auto& [name, node] : nodes_) node.status.set_replica(-1);
  for (size_t r = 0; r < replicas.size(); ++r) {
    for (const auto& name : replicas[r]) {
      auto it = nodes_.find(name);
      if (it != nodes_.end()) it->second.status.set_replica(static_cast<int32_t>(r));
    }
  }
}

void ClusterState::SetReplicaMode(int index, ReplicaMode mode, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= static_cast<int>(controls_.size())) return;
  controls_[index].mode = mode;
  controls_[index].message = message;
}

ReplicaMode ClusterState::replica_mode(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= static_cast<int>(controls_.size())) return ReplicaMode::kServe;
  return controls_[index].mode;
}

void ClusterState::SetReplicaRestarts(int index, int auto_restarts, int budget, bool exhausted) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= static_cast<int>(controls_.size())) return;
  controls_[index].auto_restarts = auto_restarts;
  controls_[index].budget = budget;
  controls_[index].exhausted = exhausted;
}

void ClusterState::SetReplicaEpoch(int index, int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= static_cast<int>(controls_.size())) return;
  controls_[index].epoch = epoch;
}

int ClusterState::replica_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(replicas_.size());
}

void ClusterState::SetPhase(glm::v1::BringUpPhase phase, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  phase_message_ = message;
}

glm::v1::BringUpPhase ClusterState::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

void ClusterState::SetNodeState(const std::string& node, glm::v1::NodeState state,
                                const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  it->second.status.set_state(state);
  if (!error.empty()) it->second.status.set_last_error(error);
}

glm::v1::NodeState ClusterState::node_state(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  return it == nodes_.end() ? glm::v1::NODE_STATE_UNSPECIFIED : it->second.status.state();
}

void ClusterState::ClearNodeError(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  if (it != nodes_.end()) it->second.status.clear_last_error();
}

void ClusterState::SetNodeGid(const std::string& node, const glm::v1::GidEntry& gid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  if (it != nodes_.end()) *it->second.status.mutable_gid() = gid;
}

void ClusterState::RecordInfo(const std::string& node, const glm::v1::InfoResponse& info) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  it->second.status.set_agent_version(info.version());
  it->second.status.set_instance_id(info.instance_id());
  it->second.status.set_uptime_ms(info.uptime_ms());
  it->second.status.set_insecure(info.insecure());
}

void ClusterState::SetNodeShard(const std::string& node, const glm::v1::ShardStatus& shard) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  *it->second.status.mutable_shard() = shard;
  it->second.status.set_shard_state(shard.state());
}

void ClusterState::RecordStatus(const std::string& node, const glm::v1::AgentStatus& status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  Node& n = it->second;
  n.status.set_instance_id(status.instance_id());
  n.status.set_status_version(status.version());
  n.status.set_uptime_ms(status.uptime_ms());
  n.status.set_shard_state(status.shard_state());
  if (!status.last_error().empty()) n.status.set_last_error(status.last_error());
  if (status.has_gid()) *n.status.mutable_gid() = status.gid();
  // No shard in the message: the agent holds none (it restarted); an old one must not linger.
  if (status.has_shard()) {
    *n.status.mutable_shard() = status.shard();
  } else {
    n.status.clear_shard();
  }
  n.status.set_gid_fingerprint(status.gid_fingerprint());
  n.has_heartbeat = true;
  n.last_heartbeat = clock_->Now();
}

glm::v1::ReplicaState ClusterState::DeriveReplicaLocked(const std::vector<std::string>& names,
                                                        std::string* why) const {
  bool all_ready = !names.empty();
  bool degraded = false;
  // A failed shard group fails the replica: the rank that saw it names the failing rank.
  for (const auto& name : names) {
    auto it = nodes_.find(name);
    if (it == nodes_.end()) continue;
    const glm::v1::NodeStatus& st = it->second.status;
    if (st.shard().state() == glm::v1::SHARD_STATE_FAILED) {
      if (why) {
        *why = absl::StrCat("node ", name, ": ",
                            st.shard().last_error().empty() ? "its shard failed"
                                                            : st.shard().last_error());
      }
      return glm::v1::REPLICA_STATE_FAILED;
    }
  }
  for (const auto& name : names) {
    auto it = nodes_.find(name);
    if (it == nodes_.end()) return glm::v1::REPLICA_STATE_FAILED;
    auto s = it->second.status.state();
    if (s == glm::v1::NODE_STATE_UNREACHABLE || s == glm::v1::NODE_STATE_FAILED) {
      if (why) {
        *why = absl::StrCat("node ", name, " is ", glm::v1::NodeState_Name(s).substr(11),
                            it->second.status.last_error().empty() ? "" : ": ",
                            it->second.status.last_error());
      }
      return glm::v1::REPLICA_STATE_FAILED;
    }
    if (s == glm::v1::NODE_STATE_DEGRADED) degraded = true;
    if (s != glm::v1::NODE_STATE_READY) all_ready = false;
  }
  if (degraded) return glm::v1::REPLICA_STATE_DEGRADED;
  return all_ready ? glm::v1::REPLICA_STATE_READY : glm::v1::REPLICA_STATE_PENDING;
}

glm::v1::ClusterStatus ClusterState::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  glm::v1::ClusterStatus out;
  out.set_cluster_name(cluster_name_);
  out.set_config_path(config_path_);
  out.set_phase(phase_);
  out.set_phase_message(phase_message_);
  auto now = clock_->Now();
  for (const auto& name : order_) {
    const Node& n = nodes_.at(name);
    glm::v1::NodeStatus* s = out.add_nodes();
    *s = n.status;
    s->set_last_heartbeat_age_ms(
        n.has_heartbeat
            ? std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_heartbeat).count()
            : -1);
  }
  for (size_t r = 0; r < replicas_.size(); ++r) {
    glm::v1::ReplicaStatus* rs = out.add_replicas();
    rs->set_index(static_cast<int32_t>(r));
    std::string why;
    rs->set_state(DeriveReplicaLocked(replicas_[r], &why));
    rs->set_message(why);
    const ReplicaControl& c = controls_[r];
    switch (c.mode) {
      case ReplicaMode::kServe: break;
      case ReplicaMode::kDraining: rs->set_state(glm::v1::REPLICA_STATE_DRAINING); break;
      case ReplicaMode::kRestarting: rs->set_state(glm::v1::REPLICA_STATE_RESTARTING); break;
      case ReplicaMode::kHeld: rs->set_state(glm::v1::REPLICA_STATE_FAILED); break;
    }
    if (c.mode != ReplicaMode::kServe) rs->set_message(c.message);
    rs->set_auto_restarts(c.auto_restarts);
    rs->set_restart_budget(c.budget);
    rs->set_budget_exhausted(c.exhausted);
    rs->set_epoch(c.epoch);
    for (const auto& name : replicas_[r]) {
      rs->add_nodes(name);
      const glm::v1::ShardStatus& shard = nodes_.at(name).status.shard();
      if (!shard.head() || shard.mtp_draft_tokens() == 0) continue;
      rs->set_mtp_draft_tokens(shard.mtp_draft_tokens());
      rs->set_spec_drafts(shard.spec_drafts());
      rs->set_spec_draft_tokens(shard.spec_draft_tokens());
      rs->set_spec_accepted_tokens(shard.spec_accepted_tokens());
      *rs->mutable_spec_accepted_per_position() = shard.spec_accepted_per_position();
    }
  }
  std::string why;
  out.set_health(HealthOf(out, &why));
  out.set_health_message(why);
  return out;
}

glm::v1::ClusterHealth ClusterState::HealthOf(const glm::v1::ClusterStatus& snap,
                                              std::string* why) {
  if (snap.phase() != glm::v1::BRING_UP_PHASE_READY) {
    *why = absl::StrCat("bring-up phase is ",
                        absl::AsciiStrToLower(glm::v1::BringUpPhase_Name(snap.phase()).substr(15)),
                        snap.phase_message().empty() ? "" : ": ", snap.phase_message());
    return snap.phase() == glm::v1::BRING_UP_PHASE_FAILED ? glm::v1::CLUSTER_HEALTH_FAILED
                                                          : glm::v1::CLUSTER_HEALTH_PENDING;
  }
  int ready = 0;
  std::vector<std::string> problems;
  for (const auto& r : snap.replicas()) {
    if (r.state() == glm::v1::REPLICA_STATE_READY) {
      ++ready;
      continue;
    }
    problems.push_back(absl::StrCat(
        "replica ", r.index(), " is ",
        absl::AsciiStrToLower(glm::v1::ReplicaState_Name(r.state()).substr(14)),
        r.message().empty() ? "" : ": ", r.message()));
  }
  *why = absl::StrJoin(problems, "; ");
  if (snap.replicas_size() == 0) {
    *why = "no replicas planned yet";
    return glm::v1::CLUSTER_HEALTH_PENDING;
  }
  if (ready == snap.replicas_size()) return glm::v1::CLUSTER_HEALTH_READY;
  return ready > 0 ? glm::v1::CLUSTER_HEALTH_DEGRADED : glm::v1::CLUSTER_HEALTH_FAILED;
}

glm::v1::ClusterHealth ClusterState::Health(std::string* why) const {
  glm::v1::ClusterStatus snap = Snapshot();
  if (why) *why = snap.health_message();
  return snap.health();
}

bool ClusterState::Healthy(std::string* why) const {
  glm::v1::ClusterStatus snap = Snapshot();
  std::vector<std::string> problems;
  if (snap.phase() != glm::v1::BRING_UP_PHASE_READY) {
    problems.push_back(absl::StrCat("bring-up phase is ",
                                    glm::v1::BringUpPhase_Name(snap.phase()).substr(15),
                                    snap.phase_message().empty() ? "" : ": ",
                                    snap.phase_message()));
  }
  if (snap.replicas_size() == 0) problems.push_back("no replicas planned yet");
  for (const auto& r : snap.replicas()) {
    if (r.state() == glm::v1::REPLICA_STATE_READY) continue;
    std::vector<std::string> bad;
    for (const auto& name : r.nodes()) {
      for (const auto& n : snap.nodes()) {
        if (n.name() == name && n.state() != glm::v1::NODE_STATE_READY) {
          bad.push_back(absl::StrCat(name, " ", glm::v1::NodeState_Name(n.state()).substr(11)));
        }
      }
    }
    problems.push_back(absl::StrCat("replica ", r.index(), " is ",
                                    glm::v1::ReplicaState_Name(r.state()).substr(14), " (",
                                    absl::StrJoin(bad, ", "), ")",
                                    r.message().empty() ? "" : ": ", r.message()));
  }
  if (why) *why = absl::StrJoin(problems, "; ");
  return problems.empty();
}

}  // namespace glm::orchestrate
