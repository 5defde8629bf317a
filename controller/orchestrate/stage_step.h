// The Stage phase (between Plan and Ready): on every node in parallel, StageNccl (skipped with a
// line when cluster.yaml names no NCCL library) then StageWeights for the node's shard. Agents
// fetch missing or mismatched files from peers' stage servers (fabric_ip:stage_port from Info);
// progress (file, bytes, rate, ETA) is forwarded into the Up stream as per-node UpEvents with
// byte progress. A failure stops bring-up naming the node, what failed (the agent's message names
// the file) and the fix.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/orchestrate/bring_up.h"
#include "controller/orchestrate/bring_up_context.h"
#include "glm/v1/agent.pb.h"

namespace glm::orchestrate {

class StageStep : public BringUpStep {
 public:
  // The source's weight manifest as JSON (agent/stage manifest.h), or "" when the controller has
  // none (each agent then verifies against a manifest of its own directory).
  using ManifestProvider = std::function<absl::StatusOr<std::string>(const ClusterTopology&)>;

  explicit StageStep(ManifestProvider manifest = nullptr,
                     Clock::Duration timeout = std::chrono::hours(12))
      : manifest_(std::move(manifest)), timeout_(timeout) {}
  Phase phase() const override { return Phase::kStage; }
  absl::Status Run(BringUpContext& ctx) override;

 private:
  ManifestProvider manifest_;
  const Clock::Duration timeout_;
};

// Every other node whose agent serves a stage server (Info stage_port > 0), as stage peers.
std::vector<glm::v1::StagePeer> StagePeers(const ClusterTopology& topology,
                                           const std::string& node,
                                           const std::map<std::string, glm::v1::InfoResponse>& infos);

glm::v1::StageWeightsRequest BuildStageWeightsRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos, const std::string& manifest_json);

glm::v1::StageNcclRequest BuildStageNcclRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos);

}  // namespace glm::orchestrate
