// The controller's view of one agent: the unary calls bring-up makes. The gRPC implementation is
// in grpc_agent_client.h; tests use fakes. Implementations are thread-safe.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/orchestrate/topology.h"
#include "glm/v1/agent.pb.h"

namespace glm::orchestrate {

class AgentClient {
 public:
  virtual ~AgentClient() = default;
  // Errors keep the RPC's code (UNAVAILABLE when the agent cannot be reached).
  virtual absl::StatusOr<glm::v1::InfoResponse> Info(Clock::Duration timeout) = 0;
  virtual absl::StatusOr<glm::v1::PreflightResponse> Preflight(
      const glm::v1::PreflightRequest& request, Clock::Duration timeout) = 0;

  // Staging streams (the Stage phase): every Progress message goes to `on_progress` as it
  // arrives (on the calling thread); the result is the stream's final status. The defaults
  // answer UNIMPLEMENTED so fakes that predate staging need not implement them.
  using ProgressFn = std::function<void(const glm::v1::Progress&)>;
  virtual absl::Status StageNccl(const glm::v1::StageNcclRequest& request,
                                 const ProgressFn& on_progress, Clock::Duration timeout) {
    (void)request, (void)on_progress, (void)timeout;
    return absl::UnimplementedError("StageNccl is not implemented by this client");
  }
  virtual absl::Status StageWeights(const glm::v1::StageWeightsRequest& request,
                                    const ProgressFn& on_progress, Clock::Duration timeout) {
    (void)request, (void)on_progress, (void)timeout;
    return absl::UnimplementedError("StageWeights is not implemented by this client");
  }
  // Shard lifecycle streams (the Load phase; `glmctl down`), same contract as staging.
  virtual absl::Status LoadShard(const glm::v1::LoadShardRequest& request,
                                 const ProgressFn& on_progress, Clock::Duration timeout) {
    (void)request, (void)on_progress, (void)timeout;
    return absl::UnimplementedError("LoadShard is not implemented by this client");
  }
  virtual absl::Status StopShard(const glm::v1::StopShardRequest& request,
                                 const ProgressFn& on_progress, Clock::Duration timeout) {
    (void)request, (void)on_progress, (void)timeout;
    return absl::UnimplementedError("StopShard is not implemented by this client");
  }
};

// Makes a client for a node (cheap: no I/O; connecting happens on the first call).
class AgentClientFactory {
 public:
  virtual ~AgentClientFactory() = default;
  virtual absl::StatusOr<std::shared_ptr<AgentClient>> Create(const NodeEndpoint& node) = 0;
};

}  // namespace glm::orchestrate
