// How glmctl prints things: the live bring-up view, status tables and status JSON.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "common/human_bytes.h"
#include "glm/v1/controller.pb.h"
#include "nlohmann/json.hpp"

namespace glm::cli {

// "Ready", "Unreachable", ... (the names `glmctl status --json` uses).
std::string NodeStateName(glm::v1::NodeState s);
std::string ReplicaStateName(glm::v1::ReplicaState s);
std::string PhaseName(glm::v1::BringUpPhase p);
std::string ClusterHealthName(glm::v1::ClusterHealth h);  // "Degraded"
// "3d4h", "5m12s", "41s", "-".
std::string HumanDuration(int64_t ms);
// Live per-node bring-up progress. On a terminal it keeps one line per node plus a phase line and
// redraws them in place; otherwise it prints one plain line per event.
class UpProgress {
 public:
  UpProgress(std::ostream& out, bool tty, std::vector<std::string> nodes);
  void OnEvent(const glm::v1::UpEvent& event);
  // Leaves the final view in place (terminal) before the summary line; on a terminal, repeats
  // the cluster-wide "warning: ..." lines the redraws replaced.
  void Finish();

 private:
  void Redraw();

  std::ostream& out_;
  const bool tty_;
  std::vector<std::string> nodes_;
  std::map<std::string, std::pair<std::string, std::string>> lines_;  // node -> (state, message)
  std::string phase_;
  std::string phase_message_;
  std::vector<std::string> warnings_;
  int drawn_ = 0;
};

nlohmann::json StatusToJson(const glm::v1::ClusterStatus& status);
void PrintStatusTable(std::ostream& out, const glm::v1::ClusterStatus& status);

// `glmctl preflight`: {"ok", "gid_warning", "nodes": [{node, address, ok, error, gid|null,
// checks: [{id, status, message, evidence, fix}]}]}.
nlohmann::json PreflightToJson(const glm::v1::ClusterPreflightResponse& resp);
// One row per check id, one column per node (pass/warn/FAIL), a GID row with every node's
// resolved index side by side, then the message and fix of every warning and failure, and the
// GID disagreement warning.
void PrintPreflightTable(std::ostream& out, const glm::v1::ClusterPreflightResponse& resp);
// {"hca","port","index","gid","type","netdev"} or null when unset.
nlohmann::json GidToJson(const glm::v1::GidEntry& gid);

}  // namespace glm::cli
