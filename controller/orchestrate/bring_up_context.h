// What the bring-up steps share during one run: the topology (filled by Validate, extended by
// Plan), a client per node (filled by Connect), the live cluster state and the event sink that
// streams progress to `glmctl up`. Emit is thread-safe (steps fan out over nodes).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "controller/orchestrate/agent_client.h"
#include "controller/orchestrate/cluster_state.h"
#include "controller/orchestrate/nccl_source.h"
#include "controller/orchestrate/topology.h"
#include "glm/v1/controller.pb.h"

namespace glm::orchestrate {

class BringUpContext {
 public:
  using EventSink = std::function<void(const glm::v1::UpEvent&)>;

  BringUpContext(ClusterState* state, EventSink sink) : state_(state), sink_(std::move(sink)) {}

  ClusterTopology topology;
  std::map<std::string, std::shared_ptr<AgentClient>> agents;  // by node name
  std::map<std::string, glm::v1::InfoResponse> infos;          // by node name (Connect)
  NcclStagePlan nccl_plan;  // the pinned NCCL build and its holders (Preflight, for Stage)

  ClusterState& state() { return *state_; }

  // Records a connected client (thread-safe; Connect fans out over nodes).
  void SetAgent(const std::string& node, std::shared_ptr<AgentClient> client) {
    std::lock_guard<std::mutex> lock(mu_);
    agents[node] = std::move(client);
  }
  void SetInfo(const std::string& node, const glm::v1::InfoResponse& info) {
    std::lock_guard<std::mutex> lock(mu_);
    infos[node] = info;
  }

  // Serialized: safe from the per-node threads of a step.
  void Emit(const glm::v1::UpEvent& event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sink_) sink_(event);
  }
  // A per-node line; also sets the node's state in ClusterState.
  void NodeEvent(const std::string& node, glm::v1::NodeState node_state,
                 const std::string& message, const std::string& error = "") {
    state_->SetNodeState(node, node_state, error);
    glm::v1::UpEvent e;
    e.set_phase(state_->phase());
    e.set_node(node);
    e.set_node_state(node_state);
    e.set_message(message);
    Emit(e);
  }

 private:
  ClusterState* const state_;
  std::mutex mu_;
  EventSink sink_;
};

}  // namespace glm::orchestrate
