// The gateway's view of the cluster (controller/gateway/replica_backend.h) from the controller's
// ClusterState, with generations streamed from each replica's head shard over gRPC's callback
// API: no thread per request, so thousands of streams may be open.
//
// A replica is ready when ClusterState derives it Ready, its head shard (pp 0, tp 0) is Running,
// the head's status heartbeat is recent (stale_after) and, while it has requests in flight, its
// step counter moved within stall_after (a group that hangs with every process alive shows
// "stalled" instead of taking more requests).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "controller/gateway/replica_backend.h"
#include "controller/orchestrate/cluster_state.h"
#include "controller/orchestrate/grpc_agent_client.h"

namespace glm::orchestrate {

struct ReplicaBackendOptions {
  Clock::Duration stale_after = std::chrono::seconds(5);
  Clock::Duration stall_after = std::chrono::seconds(30);
};

class GrpcReplicaBackend : public gateway::ReplicaBackend {
 public:
  // `state` and `channels` outlive this object.
  GrpcReplicaBackend(ClusterState* state, GrpcAgentClientFactory* channels, Clock* clock,
                     ReplicaBackendOptions options = {});

  std::vector<gateway::ReplicaInfo> Replicas() override;
  std::map<std::string, std::string> NodeStates() override;
  std::shared_ptr<gateway::GenerateCall> Generate(int replica,
                                                  const gateway::GenerateParams& params,
                                                  gateway::GenerateCallbacks callbacks) override;

 private:
  struct Head {
    std::string node;
    std::string address;
  };
  struct Progress {
    int64_t steps = -1;
    Clock::TimePoint changed{};
  };
  // The head of `replica` as of now; NotFound/Unavailable naming why there is none.
  absl::StatusOr<Head> FindHead(int replica);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelFor(const std::string& address);

  ClusterState* const state_;
  GrpcAgentClientFactory* const channels_;
  Clock* const clock_;
  const ReplicaBackendOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channel_cache_;
  std::map<int, Progress> progress_;
};

}  // namespace glm::orchestrate
