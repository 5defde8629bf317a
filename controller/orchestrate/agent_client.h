// The controller's view of one agent: the calls bring-up and `glmctl down` make. The gRPC
// implementation is in grpc_agent_client.h; tests use testing/fake_agent_client.h.
// Implementations are thread-safe: steps call every node's client from its own thread.
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
  // arrives (on the calling thread); the result is the stream's final status.
  using ProgressFn = std::function<void(const glm::v1::Progress&)>;
  virtual absl::Status StageNccl(const glm::v1::StageNcclRequest& request,
                                 const ProgressFn& on_progress, Clock::Duration timeout) = 0;
  virtual absl::Status StageWeights(const glm::v1::StageWeightsRequest& request,
                                    const ProgressFn& on_progress, Clock::Duration timeout) = 0;
  // Shard lifecycle streams (the Load phase; `glmctl down`), same contract as staging.
  virtual absl::Status LoadShard(const glm::v1::LoadShardRequest& request,
                                 const ProgressFn& on_progress, Clock::Duration timeout) = 0;
  virtual absl::Status StopShard(const glm::v1::StopShardRequest& request,
                                 const ProgressFn& on_progress, Clock::Duration timeout) = 0;
  // Starts the loaded shard's engine; returns once the agent's rank has joined its group (every
  // rank of the replica must be started concurrently) or failed.
  virtual absl::Status StartShard(const glm::v1::StartShardRequest& request,
                                  const ProgressFn& on_progress, Clock::Duration timeout) = 0;
  // Restarts: the shard admits nothing and its requests in flight finish (bounded by the
  // request's timeout_ms; DEADLINE_EXCEEDED when some are left).
  virtual absl::Status DrainShard(const glm::v1::DrainShardRequest& request,
                                  const ProgressFn& on_progress, Clock::Duration timeout) = 0;
  // One generation on a head shard (the canary): every token event to `on_event`, in order.
  using TokenFn = std::function<void(const glm::v1::TokenEvent&)>;
  virtual absl::Status Generate(const glm::v1::GenerateRequest& request, const TokenFn& on_event,
                                Clock::Duration timeout) = 0;
  // The agent process exits for its supervisor to start a fresh one (`restart --processes`).
  virtual absl::StatusOr<glm::v1::RestartProcessResponse> RestartProcess(
      const glm::v1::RestartProcessRequest& request, Clock::Duration timeout) = 0;
};

// Makes a client for a node (cheap: no I/O; connecting happens on the first call).
class AgentClientFactory {
 public:
  virtual ~AgentClientFactory() = default;
  virtual absl::StatusOr<std::shared_ptr<AgentClient>> Create(const NodeEndpoint& node) = 0;
};

}  // namespace glm::orchestrate
