// glm.v1.Controller served by glm-controller: owns the desired state ("up" or "down"), runs the
// bring-up machine for Up, answers Status/Health from ClusterState, and serves the rendezvous
// store. Thread-safe (gRPC calls handlers from its thread pool).
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <optional>
#include <string>

#include "common/clock.h"
#include "controller/orchestrate/bring_up.h"
#include "controller/orchestrate/canary.h"
#include "controller/orchestrate/cluster_state.h"
#include "controller/orchestrate/grpc_agent_client.h"
#include "controller/orchestrate/health_monitor.h"
#include "controller/orchestrate/load_step.h"
#include "controller/orchestrate/replica_restart.h"
#include "controller/orchestrate/self_healing.h"
#include "controller/orchestrate/stage_step.h"
#include "controller/orchestrate/steps.h"
#include "controller/rendezvous/rendezvous_store.h"
#include "glm/v1/controller.grpc.pb.h"

namespace glm::orchestrate {

struct ControllerServiceOptions {
  std::string version;
  std::string config_path;   // the cluster.yaml this controller serves
  // Loads and validates config_path (re-read on every Up: the file is the desired state).
  ValidateStep::Loader loader;
  PlanStep::Planner planner;
  // The source's weight manifest for the Stage phase (null or "": agents verify their own copy).
  StageStep::ManifestProvider stage_manifest;
  // The controller host's copy of the pinned NCCL build (null: none; nccl_source.h).
  NcclSourceProvider nccl_source;
  // Offline plan/validate for the Plan and Validate RPCs: (path, json) -> text.
  std::function<absl::StatusOr<std::string>(const std::string& path, bool json)> plan_text;
  RetryPolicy connect_policy;
  std::chrono::milliseconds heartbeat{1000};
  // The model's tokenizer on the controller host (text canaries, readable canary diffs).
  CanaryTokenizer canary_tokenizer;
  // Period of the self-healing reconcile pass (0: no self-healing thread; tests call
  // ReconcileOnce).
  std::chrono::milliseconds reconcile_interval{500};
  // Under mTLS: seconds until the controller's certificate and the cluster CA expire, read at
  // start (Status reports them less the uptime); nullopt without TLS.
  std::optional<int64_t> cert_expires_in_s;
  std::optional<int64_t> ca_expires_in_s;
  // Serving plaintext gRPC beyond loopback (controller.insecure: true): the listen address, shown
  // by Status; empty otherwise.
  std::string insecure_listen;
};

class ControllerService final : public glm::v1::Controller::Service {
 public:
  // `initial` is the topology read at start (names the cluster and lists nodes as Pending).
  ControllerService(ControllerServiceOptions options, const ClusterTopology& initial,
                    Clock* clock);
  ~ControllerService() override;

  // Stops watchers, the reconcile thread and wakes rendezvous waiters (before
  // grpc::Server::Shutdown).
  void Shutdown();

  // One self-healing pass (self_healing.h): restarts, one after the other, the replicas that
  // need it and whose agents are all back. Returns how many it restarted successfully. Does
  // nothing while bring-up or a restart runs, or unless the cluster was brought up.
  int ReconcileOnce();

  grpc::Status Up(grpc::ServerContext* ctx, const glm::v1::UpRequest* req,
                  grpc::ServerWriter<glm::v1::UpEvent>* writer) override;
  grpc::Status Status(grpc::ServerContext* ctx, const glm::v1::StatusRequest* req,
                      glm::v1::ClusterStatus* resp) override;
  grpc::Status Health(grpc::ServerContext* ctx, const glm::v1::HealthRequest* req,
                      glm::v1::HealthResponse* resp) override;
  grpc::Status Restart(grpc::ServerContext* ctx, const glm::v1::RestartRequest* req,
                       grpc::ServerWriter<glm::v1::UpEvent>* writer) override;
  grpc::Status Down(grpc::ServerContext* ctx, const glm::v1::DownRequest* req,
                    glm::v1::DownResponse* resp) override;
  grpc::Status Plan(grpc::ServerContext* ctx, const glm::v1::PlanRequest* req,
                    glm::v1::PlanResponse* resp) override;
  grpc::Status Validate(grpc::ServerContext* ctx, const glm::v1::ValidateRequest* req,
                        glm::v1::ValidateResponse* resp) override;
  grpc::Status Preflight(grpc::ServerContext* ctx, const glm::v1::ClusterPreflightRequest* req,
                         glm::v1::ClusterPreflightResponse* resp) override;
  // Forwards to the head shard of a Ready replica (round robin over the Ready ones).
  grpc::Status Generate(grpc::ServerContext* ctx, const glm::v1::GenerateRequest* req,
                        grpc::ServerWriter<glm::v1::TokenEvent>* writer) override;
  grpc::Status RendezvousPut(grpc::ServerContext* ctx, const glm::v1::RendezvousPutRequest* req,
                             glm::v1::RendezvousPutResponse* resp) override;
  grpc::Status RendezvousGet(grpc::ServerContext* ctx, const glm::v1::RendezvousGetRequest* req,
                             glm::v1::RendezvousGetResponse* resp) override;
  grpc::Status RendezvousDelete(grpc::ServerContext* ctx,
                                const glm::v1::RendezvousDeleteRequest* req,
                                glm::v1::RendezvousDeleteResponse* resp) override;
  // A daemon's log ring: "controller" (this process) or a node's agent (logs_forward.h).
  grpc::Status Logs(grpc::ServerContext* ctx, const glm::v1::ClusterLogsRequest* req,
                    grpc::ServerWriter<glm::v1::LogLine>* writer) override;

  ClusterState& state() { return state_; }
  // Channels to the agents, with the controller's client credentials (the gateway's backend).
  GrpcAgentClientFactory& channels() { return factory_; }

 private:
  const ControllerServiceOptions options_;
  Clock* const clock_;
  const Clock::TimePoint start_;
  std::string cluster_name_;
  ClusterState state_;
  HealthMonitor monitor_;
  GrpcAgentClientFactory factory_;
  StatusWatchers watchers_;
  rendezvous::RendezvousStore rendezvous_;
  std::atomic<uint64_t> next_replica_{0};  // Generate's round robin
  CanaryReference canary_reference_;
  std::unique_ptr<BringUpMachine> machine_;
  // Held by Up, Restart and a reconcile pass: one changes the cluster at a time.
  std::mutex ops_mu_;
  // Self-healing: its budget (guarded by ops_mu_) and thread.
  RestartBudget budget_{3, std::chrono::minutes(10)};
  std::map<int, std::string> exhausted_;  // replica -> why its budget ran out (ops_mu_)
  std::thread reconcile_thread_;
  std::mutex reconcile_mu_;
  std::condition_variable reconcile_cv_;
  bool stopping_ = false;
  // Back into routing after a successful restart: nodes Ready and watched, mode kServe.
  void Admit(const ClusterTopology& topology, int replica);
  std::optional<ClusterTopology> LastTopology();
  // ops_mu_, waiting (with an event to `writer` when given) while a restart holds it.
  std::unique_lock<std::mutex> LockOps(grpc::ServerWriter<glm::v1::UpEvent>* writer);
  // The topology of the last bring-up (Down stops the shards of its nodes).
  std::mutex topology_mu_;
  std::optional<ClusterTopology> last_topology_;
  // Events of the run in progress go to the current Up stream (null when none is attached).
  std::mutex sink_mu_;
  grpc::ServerWriter<glm::v1::UpEvent>* sink_ = nullptr;
};

glm::v1::BringUpPhase ToProto(Phase phase);

}  // namespace glm::orchestrate
