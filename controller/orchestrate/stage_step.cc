#include "controller/orchestrate/stage_step.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/orchestrate/steps.h"

namespace glm::orchestrate {

namespace {

// "10.0.0.11:47101" → {"10.0.0.11", 47101}; "[::1]:5" → {"::1", 5}. Port 0 when unparsable.
std::pair<std::string, int> SplitHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return {address, 0};
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return {host, 0};
    port = port * 10 + (c - '0');
  }
  return {host, port};
}

}  // namespace

std::optional<glm::v1::StagePeer> StagePeerFor(
    const NodeEndpoint& n, const std::map<std::string, glm::v1::InfoResponse>& infos) {
  auto [agent_host, agent_port] = SplitHostPort(n.address);
  glm::v1::StagePeer p;
  p.set_node(n.name);
  auto it = infos.find(n.name);
  if (it != infos.end() && it->second.stage_port() > 0) {
    // The agent's second port on the fabric: staging traffic stays off the management network.
    p.set_host(!it->second.fabric_ip().empty() ? it->second.fabric_ip() : n.fabric_ip);
    p.set_port(it->second.stage_port());
  } else {
    p.set_host(agent_host);
    p.set_port(agent_port);
  }
  if (p.host().empty() || p.port() <= 0) return std::nullopt;
  // Under mTLS the peer's certificate names its nodes[].agent host (glmctl certs).
  if (p.host() != agent_host) p.set_tls_name(agent_host);
  return p;
}

std::vector<glm::v1::StagePeer> StagePeers(
    const ClusterTopology& topology, const std::string& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos) {
  std::vector<glm::v1::StagePeer> peers;
  for (const auto& n : topology.nodes) {
    if (n.name == node) continue;
    if (auto p = StagePeerFor(n, infos)) peers.push_back(*std::move(p));
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
    const std::map<std::string, glm::v1::InfoResponse>& infos, const NcclStagePlan& plan) {
  glm::v1::StageNcclRequest r;
  r.set_library_path(topology.nccl_library);
  r.set_expected_version(topology.nccl_expected_version);
  if (topology.nccl_library.empty() || plan.expected_hash.empty()) return r;
  r.set_expected_hash(plan.expected_hash);
  r.set_peer_size(static_cast<int64_t>(plan.size));
  // peer_path stays empty: holders serve their own NCCL library (FetchFile nccl_library).
  for (const auto& holder : plan.holders) {
    if (holder == node.name) continue;
    const NodeEndpoint* n = topology.FindNode(holder);
    if (n == nullptr) continue;
    if (auto p = StagePeerFor(*n, infos)) *r.add_peers() = *std::move(p);
  }
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
  return ForEachConnectedNode(ctx, "staging", [&](const NodeEndpoint& node, AgentClient& client,
                                                  const NodeFailFn& fail) {
    auto forward = [&](const glm::v1::Progress& p) {
      glm::v1::UpEvent e;
      e.set_phase(glm::v1::BRING_UP_PHASE_STAGE);
      e.set_node(node.name);
      e.set_node_state(glm::v1::NODE_STATE_CONNECTED);
      e.set_message(p.message());
      if (p.total_bytes() > 0) *e.mutable_progress() = p;
      ctx.Emit(e);
    };
    absl::Status s = client.StageNccl(
        BuildStageNcclRequest(ctx.topology, node, ctx.infos, ctx.nccl_plan), forward, timeout_);
    if (!s.ok()) {
      fail(absl::StrCat("node ", node.name, ": NCCL staging failed: ", s.message(),
                        ". Fix: install NCCL ", ctx.topology.nccl_expected_version, " at ",
                        ctx.topology.nccl_library, " on one node (or point nccl.source at it on "
                        "the controller's host), or correct nccl.expected_version"));
      return;
    }
    s = client.StageWeights(
        BuildStageWeightsRequest(ctx.topology, node, ctx.infos, manifest_json), forward, timeout_);
    if (!s.ok()) {
      fail(absl::StrCat("node ", node.name, ": weight staging failed: ", s.message(),
                        ". Fix: put a verified copy of the named file into this node's model "
                        "directory (model.path ", ctx.topology.model_dir,
                        ", or the agent's --model-dir), or run a peer's agent with --fabric-ip and "
                        "--stage-root on a complete copy of the model; then re-run glmctl up"));
    }
  });
}

}  // namespace glm::orchestrate
