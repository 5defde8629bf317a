// The Load phase (after Stage): LoadShard on every node in parallel, then StartShard on every
// rank (StartReplicas), after which the replicas serve. LoadShard with its PP stage's layer
// range, its place in the TP x PP grid, the plan's per-node KV cache bytes and cluster.yaml's
// page_cache: policy. Byte progress is forwarded into the Up stream as per-node UpEvents; the
// agent's shard status (bytes, load time, page-cache actions) is recorded in ClusterState. A
// failure stops bring-up naming the node and the agent's message (which names the file or
// tensor and the fix). Re-running is cheap: an agent that already holds the same shard answers
// at once.
#pragma once

#include "absl/status/status.h"
#include "common/clock.h"
#include "controller/orchestrate/bring_up.h"
#include "controller/orchestrate/bring_up_context.h"
#include "glm/v1/agent.pb.h"

namespace glm::orchestrate {

class LoadStep : public BringUpStep {
 public:
  explicit LoadStep(Clock::Duration timeout = std::chrono::hours(2)) : timeout_(timeout) {}
  Phase phase() const override { return Phase::kLoad; }
  absl::Status Run(BringUpContext& ctx) override;

 private:
  const Clock::Duration timeout_;
};

// The LoadShard request for `node`; InvalidArgument when the plan gave it no layers.
absl::StatusOr<glm::v1::LoadShardRequest> BuildLoadShardRequest(const ClusterTopology& topology,
                                                                const NodeEndpoint& node);

// StartShard on every node, each replica's workers first and its head last, concurrently (a
// rank's start returns once the replica's groups formed), with a fresh epoch for the rendezvous
// namespaces and the controller's own address as the rendezvous. A failure names the node.
absl::Status StartReplicas(BringUpContext& ctx, Clock::Duration timeout);

// StopShard on every node of `topology` in parallel (what `glmctl down` asks the controller
// for). Returns one line per node: "node-1: stopped: freed ..." or "node-2: <error>"; never
// fails as a whole (an unreachable agent has no shard to free).
std::vector<std::string> StopShards(const ClusterTopology& topology, AgentClientFactory* factory,
                                    Clock::Duration timeout, int* stopped = nullptr);

}  // namespace glm::orchestrate
