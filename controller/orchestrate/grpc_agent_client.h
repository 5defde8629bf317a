// gRPC implementations of AgentClient/AgentClientFactory, and the per-node status watchers that
// feed the HealthMonitor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "controller/orchestrate/agent_client.h"
#include "controller/orchestrate/health_monitor.h"
#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/rpc/credentials.h"

namespace glm::orchestrate {

// Channels to agents, with the controller's client credentials (mTLS when configured).
class GrpcAgentClientFactory : public AgentClientFactory {
 public:
  explicit GrpcAgentClientFactory(rpc::TlsFiles tls) : tls_(std::move(tls)) {}
  absl::StatusOr<std::shared_ptr<AgentClient>> Create(const NodeEndpoint& node) override;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(const std::string& address);

 private:
  rpc::TlsFiles tls_;
};

class GrpcAgentClient : public AgentClient {
 public:
  GrpcAgentClient(std::string node, std::string address, std::shared_ptr<grpc::Channel> channel);
  absl::StatusOr<glm::v1::InfoResponse> Info(Clock::Duration timeout) override;
  absl::StatusOr<glm::v1::PreflightResponse> Preflight(const glm::v1::PreflightRequest& request,
                                                       Clock::Duration timeout) override;
  absl::Status StageNccl(const glm::v1::StageNcclRequest& request, const ProgressFn& on_progress,
                         Clock::Duration timeout) override;
  absl::Status StageWeights(const glm::v1::StageWeightsRequest& request,
                            const ProgressFn& on_progress, Clock::Duration timeout) override;
  absl::Status LoadShard(const glm::v1::LoadShardRequest& request, const ProgressFn& on_progress,
                         Clock::Duration timeout) override;
  absl::Status StopShard(const glm::v1::StopShardRequest& request, const ProgressFn& on_progress,
                         Clock::Duration timeout) override;
  absl::Status StartShard(const glm::v1::StartShardRequest& request, const ProgressFn& on_progress,
                          Clock::Duration timeout) override;
  absl::Status DrainShard(const glm::v1::DrainShardRequest& request, const ProgressFn& on_progress,
                          Clock::Duration timeout) override;
  absl::Status Generate(const glm::v1::GenerateRequest& request, const TokenFn& on_event,
                        Clock::Duration timeout) override;
  absl::StatusOr<glm::v1::RestartProcessResponse> RestartProcess(
      const glm::v1::RestartProcessRequest& request, Clock::Duration timeout) override;

 private:
  const std::string node_;
  const std::string address_;
  std::unique_ptr<glm::v1::Agent::Stub> stub_;
};

// One thread per node holding a WatchStatus stream open; reconnects (backoff 100 ms .. 1 s) when
// it breaks. A ticker thread runs HealthMonitor::Tick every `tick` and cancels streams whose
// heartbeats stopped, so a silent peer (network partition) is reconnected too.
class StatusWatchers {
 public:
  StatusWatchers(GrpcAgentClientFactory* factory, HealthMonitor* monitor,
                 std::chrono::milliseconds heartbeat = std::chrono::milliseconds(1000),
                 std::chrono::milliseconds tick = std::chrono::milliseconds(250));
  ~StatusWatchers();

  // Starts watching these nodes, replacing any previous set.
  void Start(const std::vector<NodeEndpoint>& nodes);
  // Stops every watcher and waits for the threads (bounded by the stream cancellation).
  void Stop();

 private:
  struct Watcher {
    NodeEndpoint node;
    std::thread thread;
    std::mutex mu;
    grpc::ClientContext* ctx = nullptr;  // current stream, for cancellation
  };
  void RunWatcher(Watcher* w);
  void CancelStream(const std::string& node);
  bool SleepUnlessStopped(std::chrono::milliseconds d);

  GrpcAgentClientFactory* const factory_;
  HealthMonitor* const monitor_;
  const std::chrono::milliseconds heartbeat_;
  const std::chrono::milliseconds tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::unique_ptr<Watcher>> watchers_;
  std::thread ticker_;
};

}  // namespace glm::orchestrate
