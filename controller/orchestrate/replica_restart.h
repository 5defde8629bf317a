// Restarting one replica's shard group: what `glmctl restart` does per replica and what the
// controller's self-healing does to a replica whose agents are back.
//
//   drain (optional): the replica leaves routing (ClusterState mode kDraining) and its head
//       shard drains, bounded by drain_timeout (requests still running then end with an error
//       when the shard stops)
//   restart: mode kRestarting; StopShard on every node of the replica (or, with `processes`,
//       RestartProcess: each agent exits and its supervisor starts a fresh one, awaited by its
//       new instance id), then LoadShard and StartShard (a fresh group epoch) as bring-up's
//       Load phase does, then the canary (canary.h)
//
// The replica stays out of routing throughout; the caller re-admits it (arms health watching,
// marks its nodes Ready, mode kServe) when this returns OK. An error names the step and node.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "controller/orchestrate/agent_client.h"
#include "controller/orchestrate/bring_up_context.h"
#include "controller/orchestrate/canary.h"
#include "controller/orchestrate/cluster_state.h"
#include "controller/orchestrate/topology.h"

namespace glm::orchestrate {

struct ReplicaRestartOptions {
  bool drain = true;  // false for a failed group: nothing in it can finish
  Clock::Duration drain_timeout = std::chrono::seconds(30);
  bool processes = false;
  Clock::Duration process_timeout = std::chrono::seconds(60);  // a restarted agent answers again
  Clock::Duration load_timeout = std::chrono::hours(2);
  Clock::Duration canary_timeout = std::chrono::minutes(5);
  std::string reason = "restart";  // shown as the replica's message while it restarts
};

// The nodes of `replica` in `topology`, as a topology of their own (what the Load phase and the
// canary run over).
ClusterTopology ReplicaTopology(const ClusterTopology& topology, int replica);

absl::Status RestartReplica(const ClusterTopology& topology, int replica,
                            AgentClientFactory* factory, ClusterState* state,
                            const CanaryTokenizer& tokenizer, CanaryReference* reference,
                            const ReplicaRestartOptions& options,
                            const BringUpContext::EventSink& sink);

}  // namespace glm::orchestrate
