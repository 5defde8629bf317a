#include "controller/orchestrate/stage_step.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/orchestrate/steps.h"

namespace glm::orchestrate {

std::vector<glm::v1::StagePeer> StagePeers(
    const ClusterTopology& topology, const std::string& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos) {
  std::vector<glm::v1::StagePeer> peers;
  for (const auto& n : topology.nodes) {
    if (n.name == node) continue;
    auto it = infos.find(n.name);
    if (it == infos.end() || it->second.stage_port() <= 0) continue;
    glm::v1::StagePeer p;
    p.set_node(n.name);
    p.set_host(!it->second.fabric_ip().empty() ? it->second.fabric_ip() : n.fabric_ip);
    p.set_port(it->second.stage_port());
    if (p.host().empty()) continue;
    peers.push_back(std::move(p));
  }
  return peers;
}

glm::v1::StageWeightsRequest BuildStageWeightsRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos, const std::string& manifest_json) {
  glm::v1::StageWeightsRequest r;
  r.set_model_dir(topology.model_dir);
  r.set_layer_begin(node.layer_begin);
  r.set_layer_end(node.layer_end);
  r.set_first_stage(node.first_stage);
  r.set_last_stage(node.last_stage);
  r.set_include_mtp(node.last_stage);
  r.set_manifest_json(manifest_json);
  for (auto& p : StagePeers(topology, node.name, infos)) *r.add_peers() = std::move(p);
  return r;
}

glm::v1::StageNcclRequest BuildStageNcclRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos) {
  glm::v1::StageNcclRequest r;
  r.set_library_path(topology.nccl_library);
  r.set_expected_version(topology.nccl_expected_version);
  for (auto& p : StagePeers(topology, node.name, infos)) *r.add_peers() = std::move(p);
  return r;
}

absl::Status StageStep::Run(BringUpContext& ctx) {
  std::string manifest_json;
  if (manifest_) {
    absl::StatusOr<std::string> m = manifest_(ctx.topology);
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("building the weight manifest of ", ctx.topology.model_dir,
                                       ": ", m.status().message(),
                                       ". Fix: make model.path readable on the controller"));
    }
    manifest_json = *std::move(m);
  }
  std::mutex mu;
  std::vector<std::string> failures;
  ParallelFor(ctx.topology.nodes, [&](const NodeEndpoint& node) {
    std::shared_ptr<AgentClient> client;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ctx.agents.find(node.name);
      if (it != ctx.agents.end()) client = it->second;
    }
    auto fail = [&](const std::string& msg) {
      ctx.NodeEvent(node.name, glm::v1::NODE_STATE_FAILED, msg, msg);
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(msg);
    };
    if (!client) {
      fail(absl::StrCat("node ", node.name, ": not connected; staging skipped"));
      return;
    }
    auto forward = [&](const glm::v1::Progress& p) {
      glm::v1::UpEvent e;
      e.set_phase(glm::v1::BRING_UP_PHASE_STAGE);
      e.set_node(node.name);
      e.set_node_state(glm::v1::NODE_STATE_CONNECTED);
      e.set_message(p.message());
      if (p.total_bytes() > 0) *e.mutable_progress() = p;
      ctx.Emit(e);
    };
    absl::Status s = client->StageNccl(BuildStageNcclRequest(ctx.topology, node, ctx.infos),
                                       forward, timeout_);
    if (!s.ok()) {
      fail(absl::StrCat("node ", node.name, ": NCCL staging failed: ", s.message(),
                        ". Fix: put the pinned library at nccl.library (", ctx.topology.nccl_library,
                        ") on a peer or this node, or correct nccl.expected_version"));
      return;
    }
    s = client->StageWeights(
        BuildStageWeightsRequest(ctx.topology, node, ctx.infos, manifest_json), forward, timeout_);
    if (!s.ok()) {
      fail(absl::StrCat("node ", node.name, ": weight staging failed: ", s.message(),
                        ". Fix: put a verified copy of the named file into this node's model "
                        "directory (model.path ", ctx.topology.model_dir,
                        ", or the agent's --model-dir), or run a peer's agent with --fabric-ip and "
                        "--stage-root on a complete copy of the model; then re-run glmctl up"));
      return;
    }
  });
  if (!failures.empty()) {
    std::sort(failures.begin(), failures.end());
    return absl::FailedPreconditionError(absl::StrJoin(failures, "\n"));
  }
  return absl::OkStatus();
}

}  // namespace glm::orchestrate
