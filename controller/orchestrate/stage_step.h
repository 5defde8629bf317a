// The Stage phase (between Plan and Ready): on every node in parallel, StageNccl (skipped with a
// line when cluster.yaml names no NCCL library; with the pinned build's hash, version and holders
// from Preflight's NcclStagePlan) then StageWeights for the node's shard. Agents fetch missing or
// mismatched files from peers over gRPC (FetchFile at fabric_ip:stage_port from Info, else the
// peer's nodes[].agent address);
// progress (file, bytes, rate, ETA) is forwarded into the Up stream as per-node UpEvents with
// byte progress. A failure stops bring-up naming the node, what failed (the agent's message names
// the file) and the fix.
#pragma once

#include <functional>
#include <map>
#include <optional>
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

// Where to fetch from `node`: fabric_ip:stage_port when its Info reports a stage port, else its
// nodes[].agent address; tls_name is the agent host when that differs. nullopt without an address.
std::optional<glm::v1::StagePeer> StagePeerFor(
    const NodeEndpoint& node, const std::map<std::string, glm::v1::InfoResponse>& infos);

// Every other node, as stage peers (StagePeerFor).
std::vector<glm::v1::StagePeer> StagePeers(const ClusterTopology& topology,
                                           const std::string& node,
                                           const std::map<std::string, glm::v1::InfoResponse>& infos);

glm::v1::StageWeightsRequest BuildStageWeightsRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos, const std::string& manifest_json);

// With a pinned build in `plan`: its hash and size, and the holders other than `node` as peers
// (they serve their own library). Without one: path and version only (checked in place).
glm::v1::StageNcclRequest BuildStageNcclRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos, const NcclStagePlan& plan = {});

}  // namespace glm::orchestrate
