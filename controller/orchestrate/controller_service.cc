#include "controller/orchestrate/controller_service.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "controller/orchestrate/bring_up_context.h"
#include "controller/orchestrate/logs_forward.h"
#include "controller/orchestrate/steps.h"
#include "proto/rpc/status_map.h"

namespace glm::orchestrate {

glm::v1::BringUpPhase ToProto(Phase phase) {
  switch (phase) {
    case Phase::kIdle: return glm::v1::BRING_UP_PHASE_IDLE;
    case Phase::kValidate: return glm::v1::BRING_UP_PHASE_VALIDATE;
    case Phase::kConnect: return glm::v1::BRING_UP_PHASE_CONNECT;
    case Phase::kPreflight: return glm::v1::BRING_UP_PHASE_PREFLIGHT;
    case Phase::kPlan: return glm::v1::BRING_UP_PHASE_PLAN;
    case Phase::kStage: return glm::v1::BRING_UP_PHASE_STAGE;
    case Phase::kLoad: return glm::v1::BRING_UP_PHASE_LOAD;
    case Phase::kCanary: return glm::v1::BRING_UP_PHASE_CANARY;
    case Phase::kGateway: return glm::v1::BRING_UP_PHASE_GATEWAY;
    case Phase::kReady: return glm::v1::BRING_UP_PHASE_READY;
    case Phase::kFailed: return glm::v1::BRING_UP_PHASE_FAILED;
    case Phase::kDown: return glm::v1::BRING_UP_PHASE_DOWN;
  }
  return glm::v1::BRING_UP_PHASE_UNSPECIFIED;
}

ControllerService::ControllerService(ControllerServiceOptions options,
                                     const ClusterTopology& initial, Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      start_(clock->Now()),
      cluster_name_(initial.cluster_name),
      state_(clock),
      monitor_(clock, &state_),
      factory_(initial.tls),
      watchers_(&factory_, &monitor_, options_.heartbeat) {
  state_.Reset(initial);
  std::vector<std::unique_ptr<BringUpStep>> steps;
  steps.push_back(std::make_unique<ValidateStep>(options_.loader));
  steps.push_back(std::make_unique<ConnectStep>(
      &factory_, options_.connect_policy,
      [](Clock::Duration d) { std::this_thread::sleep_for(d); }));
  steps.push_back(std::make_unique<PreflightStep>(std::chrono::seconds(60), options_.nccl_source));
  steps.push_back(std::make_unique<PlanStep>(options_.planner));
  steps.push_back(std::make_unique<StageStep>(options_.stage_manifest));
  steps.push_back(std::make_unique<LoadStep>());
  steps.push_back(std::make_unique<CanaryStep>(options_.canary_tokenizer, &canary_reference_));
  auto machine = BringUpMachine::Create(
      std::move(steps), [this](Phase, Phase to, const std::string& message) {
        state_.SetPhase(ToProto(to), message);
        glm::v1::UpEvent e;
        e.set_phase(ToProto(to));
        e.set_message(message.empty() ? absl::StrCat("phase ", PhaseName(to)) : message);
        std::lock_guard<std::mutex> lock(sink_mu_);
        if (sink_) sink_->Write(e);
      });
  // The step list above is fixed and ordered; failure here is a programming error.
  if (!machine.ok()) {
    GLM_LOG_ERROR("bring-up machine: {}", machine.status().ToString());
    std::abort();
  }
  machine_ = *std::move(machine);
  if (options_.reconcile_interval.count() > 0) {
    reconcile_thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(reconcile_mu_);
      while (!reconcile_cv_.wait_for(lock, options_.reconcile_interval,
                                     [this] { return stopping_; })) {
        lock.unlock();
        ReconcileOnce();
        lock.lock();
      }
    });
  }
}

ControllerService::~ControllerService() { Shutdown(); }

void ControllerService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(reconcile_mu_);
    stopping_ = true;
  }
  reconcile_cv_.notify_all();
  if (reconcile_thread_.joinable()) reconcile_thread_.join();
  watchers_.Stop();
  rendezvous_.Shutdown();
}

std::unique_lock<std::mutex> ControllerService::LockOps(
    grpc::ServerWriter<glm::v1::UpEvent>* writer) {
  std::unique_lock<std::mutex> ops(ops_mu_, std::try_to_lock);
  if (ops.owns_lock()) return ops;
  // A restart (glmctl restart, or self-healing) is running: it is bounded by its timeouts.
  if (writer != nullptr) {
    glm::v1::UpEvent e;
    e.set_message("waiting for the restart in progress (glmctl restart or self-healing) to end");
    writer->Write(e);
  }
  ops.lock();
  return ops;
}

std::optional<ClusterTopology> ControllerService::LastTopology() {
  std::lock_guard<std::mutex> lock(topology_mu_);
  return last_topology_;
}

void ControllerService::Admit(const ClusterTopology& topology, int replica) {
  for (const NodeEndpoint& n : topology.nodes) {
    if (n.replica != replica) continue;
    state_.SetNodeState(n.name, glm::v1::NODE_STATE_READY);
    state_.ClearNodeError(n.name);
    monitor_.Arm(n.name, /*expect_shard=*/true);
  }
  state_.SetReplicaMode(replica, ReplicaMode::kServe);
}

int ControllerService::ReconcileOnce() {
  if (machine_->phase() != Phase::kReady || machine_->running()) return 0;
  std::unique_lock<std::mutex> ops(ops_mu_, std::try_to_lock);
  if (!ops.owns_lock()) return 0;
  std::optional<ClusterTopology> topology = LastTopology();
  if (!topology) return 0;
  const glm::v1::ClusterStatus snap = state_.Snapshot();
  const Clock::TimePoint now = clock_->Now();
  auto show = [&](int r) {
    state_.SetReplicaRestarts(r, budget_.Count(r, now), budget_.budget(), exhausted_.count(r) > 0);
  };
  std::vector<int> heal = ReplicasToHeal(
      snap, [this](const std::string& node) { return monitor_.alive(node); },
      [this](int r) { return exhausted_.count(r) == 0; });
  int healed = 0;
  for (int r : heal) {
    std::string why;
    for (const auto& rs : snap.replicas()) {
      if (rs.index() == r) why = rs.message();
    }
    if (!budget_.Allows(r, now)) {
      const std::string reason = absl::StrCat(
          budget_.budget() == 0
              ? std::string("self-healing is off (lifecycle.restart_budget 0)")
              : absl::StrCat("restart budget exhausted: ", budget_.Count(r, now),
                             " automatic restarts within ",
                             std::chrono::duration_cast<std::chrono::seconds>(budget_.window())
                                 .count(),
                             " s (lifecycle.restart_budget ", budget_.budget(), ")"),
          "; last failure: ", why.empty() ? "unknown" : why,
          ". Fix: find the cause (glmctl logs, glmctl status), then glmctl restart --replica ", r,
          " (or glmctl up)");
      exhausted_[r] = reason;
      state_.SetReplicaMode(r, ReplicaMode::kHeld, reason);
      show(r);
      GLM_LOG_ERROR("self-healing replica={}: {}", r, reason);
      continue;
    }
    budget_.Record(r, now);
    show(r);
    GLM_LOG_INFO("self-healing replica={}: every agent answers again; restarting its group ({})",
                 r, why);
    ReplicaRestartOptions opts;
    opts.drain = false;
    opts.reason = "self-healing";
    absl::Status s = RestartReplica(*topology, r, &factory_, &state_, options_.canary_tokenizer,
                                    &canary_reference_, opts, [](const glm::v1::UpEvent& e) {
                                      GLM_LOG_INFO("self-healing: {}", e.message());
                                    });
    if (s.ok()) {
      Admit(*topology, r);
      ++healed;
      GLM_LOG_INFO("self-healing replica={}: back in service", r);
    } else {
      state_.SetReplicaMode(r, ReplicaMode::kHeld,
                            absl::StrCat("self-healing restart failed: ", s.message()));
      GLM_LOG_WARN("self-healing replica={}: restart failed: {}", r, glm::ToStd(s.message()));
    }
  }
  return healed;
}

grpc::Status ControllerService::Up(grpc::ServerContext*, const glm::v1::UpRequest* req,
                                   grpc::ServerWriter<glm::v1::UpEvent>* writer) {
  if (!req->cluster_name().empty() && req->cluster_name() != cluster_name_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("this controller serves cluster '", cluster_name_,
                                     "' (", options_.config_path, "), not '",
                                     req->cluster_name(),
                                     "': point glmctl at the right controller (--controller) or "
                                     "change controller.listen in one of the YAML files"));
  }
  if (machine_->running()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "bring-up is already running; follow it with `glmctl status`");
  }
  std::unique_lock<std::mutex> ops = LockOps(writer);
  std::string why;
  if (!req->force() && machine_->phase() == Phase::kReady && state_.Healthy(&why)) {
    glm::v1::UpEvent e;
    e.set_phase(glm::v1::BRING_UP_PHASE_READY);
    e.set_already_up(true);
    e.set_message(absl::StrCat("cluster '", cluster_name_,
                               "' is already up and every replica is Ready; nothing to do"));
    writer->Write(e);
    return grpc::Status::OK;
  }
  if (machine_->running()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "bring-up is already running; follow it with `glmctl status`");
  }
  // Re-run: stop health watching (bring-up owns node states while it runs), then bring up.
  watchers_.Stop();
  monitor_.DisarmAll();
  {
    std::lock_guard<std::mutex> lock(sink_mu_);
    sink_ = writer;
  }
  BringUpContext ctx(&state_, [this](const glm::v1::UpEvent& e) {
    std::lock_guard<std::mutex> lock(sink_mu_);
    if (sink_) sink_->Write(e);
  });
  GLM_LOG_INFO("bring-up start cluster={}", cluster_name_);
  absl::Status result = machine_->Run(ctx);
  if (!ctx.topology.nodes.empty()) {
    std::lock_guard<std::mutex> lock(topology_mu_);
    last_topology_ = ctx.topology;  // what `down` stops shards on
  }
  if (result.ok()) {
    // A fresh bring-up: self-healing starts with its whole budget.
    budget_ = RestartBudget(ctx.topology.lifecycle.restart_budget,
                            ctx.topology.lifecycle.restart_window);
    exhausted_.clear();
    for (size_t r = 0; r < ctx.topology.replicas.size(); ++r) {
      state_.SetReplicaRestarts(static_cast<int>(r), 0, budget_.budget(), false);
    }
    for (const auto& node : ctx.topology.nodes) {
      state_.SetNodeState(node.name, glm::v1::NODE_STATE_READY);
      state_.ClearNodeError(node.name);
      monitor_.Arm(node.name, /*expect_shard=*/true);  // the Load phase loaded it
      glm::v1::UpEvent ready;
      ready.set_phase(glm::v1::BRING_UP_PHASE_READY);
      ready.set_node(node.name);
      ready.set_node_state(glm::v1::NODE_STATE_READY);
      ready.set_message("ready; health watching on");
      std::lock_guard<std::mutex> lock(sink_mu_);
      writer->Write(ready);
    }
    watchers_.Start(ctx.topology.nodes);
    glm::v1::UpEvent e;
    e.set_phase(glm::v1::BRING_UP_PHASE_READY);
    e.set_message(absl::StrCat("cluster '", cluster_name_, "' is up: ",
                               ctx.topology.nodes.size(), " nodes, ",
                               ctx.topology.replicas.size(), " replica(s) Ready"));
    std::lock_guard<std::mutex> lock(sink_mu_);
    writer->Write(e);
  }
  {
    std::lock_guard<std::mutex> lock(sink_mu_);
    sink_ = nullptr;
  }
  GLM_LOG_INFO("bring-up end cluster={} ok={} error=\"{}\"", cluster_name_, result.ok(),
               glm::ToStd(result.message()));
  return rpc::ToGrpc(result);
}

grpc::Status ControllerService::Status(grpc::ServerContext*, const glm::v1::StatusRequest*,
                                       glm::v1::ClusterStatus* resp) {
  *resp = state_.Snapshot();
  resp->set_controller_version(options_.version);
  const int64_t uptime_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_->Now() - start_).count();
  resp->set_controller_uptime_ms(uptime_ms);
  if (resp->config_path().empty()) resp->set_config_path(options_.config_path);
  if (options_.cert_expires_in_s) {
    resp->set_controller_cert_expires_in_s(*options_.cert_expires_in_s - uptime_ms / 1000);
  }
  if (options_.ca_expires_in_s) {
    resp->set_ca_expires_in_s(*options_.ca_expires_in_s - uptime_ms / 1000);
  }
  resp->set_insecure_listen(options_.insecure_listen);
  return grpc::Status::OK;
}

grpc::Status ControllerService::Health(grpc::ServerContext*, const glm::v1::HealthRequest*,
                                       glm::v1::HealthResponse* resp) {
  std::string why;
  resp->set_healthy(state_.Healthy(&why));
  resp->set_message(resp->healthy() ? "every replica is Ready" : why);
  resp->set_cluster_name(cluster_name_);
  std::string health_why;
  resp->set_health(state_.Health(&health_why));
  return grpc::Status::OK;
}

grpc::Status ControllerService::Restart(grpc::ServerContext* server_ctx,
                                        const glm::v1::RestartRequest* req,
                                        grpc::ServerWriter<glm::v1::UpEvent>* writer) {
  if (!req->cluster_name().empty() && req->cluster_name() != cluster_name_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("this controller serves cluster '", cluster_name_, "' (",
                                     options_.config_path, "), not '", req->cluster_name(),
                                     "': point glmctl at the right controller (--controller)"));
  }
  if (machine_->running()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "bring-up is running; restart when it ends (glmctl status)");
  }
  // A day at most: beyond it the drain deadlines (now + timeout) overflow.
  constexpr int64_t kMaxDrainTimeoutMs = int64_t{24} * 3600 * 1000;
  if (req->drain_timeout_ms() < 0 || req->drain_timeout_ms() > kMaxDrainTimeoutMs) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("RestartRequest.drain_timeout_ms = ", req->drain_timeout_ms(),
                                     " is outside [0, ", kMaxDrainTimeoutMs,
                                     "] (0 = lifecycle.drain_timeout of cluster.yaml). Fix: give "
                                     "glmctl restart a drain timeout up to a day"));
  }
  std::unique_lock<std::mutex> ops = LockOps(writer);
  std::optional<ClusterTopology> topology = LastTopology();
  if (machine_->phase() != Phase::kReady || !topology) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("cluster '", cluster_name_, "' is not up (bring-up phase ",
                                     PhaseName(machine_->phase()),
                                     "); nothing to restart. Fix: glmctl up"));
  }
  const int count = static_cast<int>(topology->replicas.size());
  std::vector<int> replicas(req->replicas().begin(), req->replicas().end());
  if (replicas.empty()) {
    for (int r = 0; r < count; ++r) replicas.push_back(r);
  }
  for (int r : replicas) {
    if (r < 0 || r >= count) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("--replica ", r, ": cluster '", cluster_name_, "' has ",
                                       count, " replica(s), 0..", count - 1));
    }
  }
  std::sort(replicas.begin(), replicas.end());
  replicas.erase(std::unique(replicas.begin(), replicas.end()), replicas.end());

  std::mutex write_mu;
  auto sink = [&](const glm::v1::UpEvent& e) {
    std::lock_guard<std::mutex> lock(write_mu);
    writer->Write(e);
  };
  ReplicaRestartOptions opts;
  opts.drain = true;
  opts.processes = req->processes();
  opts.drain_timeout = req->drain_timeout_ms() > 0
                           ? std::chrono::milliseconds(req->drain_timeout_ms())
                           : std::chrono::duration_cast<std::chrono::milliseconds>(
                                 topology->lifecycle.drain_timeout);
  opts.reason = req->rolling() ? "rolling restart" : "restart";
  GLM_LOG_INFO("restart cluster={} replicas=[{}] rolling={} processes={}", cluster_name_,
               absl::StrJoin(replicas, ","), req->rolling(), req->processes());

  // An operator's restart gives self-healing its whole budget back (here, before any thread of
  // a parallel restart runs: budget_ and exhausted_ are not thread-safe).
  for (int r : replicas) {
    budget_.Reset(r);
    exhausted_.erase(r);
  }
  // One replica: restart it, then re-admit it (or hold it out with the error).
  auto restart_one = [&](int r) -> absl::Status {
    const auto started = std::chrono::steady_clock::now();
    absl::Status s = RestartReplica(*topology, r, &factory_, &state_, options_.canary_tokenizer,
                                    &canary_reference_, opts, sink);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                         started).count();
    glm::v1::UpEvent e;
    e.set_replica(r);
    if (s.ok()) {
      Admit(*topology, r);
      state_.SetReplicaRestarts(r, 0, budget_.budget(), false);
      e.set_phase(glm::v1::BRING_UP_PHASE_READY);
      e.set_message(absl::StrFormat("replica %d: back in service (%.2f s)", r, seconds));
    } else {
      state_.SetReplicaMode(r, ReplicaMode::kHeld, absl::StrCat(opts.reason, " failed: ",
                                                                s.message()));
      e.set_phase(glm::v1::BRING_UP_PHASE_FAILED);
      e.set_message(absl::StrFormat("replica %d: restart failed after %.2f s: %s", r, seconds,
                                    glm::ToStd(s.message())));
    }
    sink(e);
    return s;
  };

  std::vector<std::string> failed;
  if (req->rolling()) {
    for (size_t i = 0; i < replicas.size(); ++i) {
      if (server_ctx->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED,
                            absl::StrCat("rolling restart cancelled by the client after ", i,
                                         " of ", replicas.size(), " replica(s)"));
      }
      absl::Status s = restart_one(replicas[i]);
      if (!s.ok()) {
        // Stop here: restarting the next replica too could take the last serving one down.
        return grpc::Status(
            grpc::StatusCode::ABORTED,
            absl::StrCat("rolling restart stopped at replica ", replicas[i], " (", i, " of ",
                         replicas.size(), " restarted before it): ", s.message(),
                         "\nFix: see glmctl status / glmctl logs for that replica, then "
                         "glmctl restart --rolling --replica ", replicas[i]));
      }
    }
  } else {
    std::mutex mu;
    ParallelFor(replicas, [&](int r) {
      absl::Status s = restart_one(r);
      if (s.ok()) return;
      std::lock_guard<std::mutex> lock(mu);
      failed.push_back(absl::StrCat("replica ", r, ": ", s.message()));
    });
    if (!failed.empty()) {
      std::sort(failed.begin(), failed.end());
      return grpc::Status(grpc::StatusCode::ABORTED, absl::StrJoin(failed, "\n"));
    }
  }
  glm::v1::UpEvent done;
  done.set_phase(glm::v1::BRING_UP_PHASE_READY);
  done.set_message(absl::StrCat("restarted ", replicas.size(), " replica(s) of cluster '",
                                cluster_name_, "'", req->rolling() ? ", one at a time" : ""));
  sink(done);
  return grpc::Status::OK;
}

grpc::Status ControllerService::Down(grpc::ServerContext*, const glm::v1::DownRequest*,
                                     glm::v1::DownResponse* resp) {
  std::unique_lock<std::mutex> ops = LockOps(nullptr);
  absl::Status s = machine_->MarkDown();
  if (!s.ok()) return rpc::ToGrpc(s);
  watchers_.Stop();
  monitor_.DisarmAll();
  // Stop every node's shard (frees its weights and KV cache). The nodes of the last bring-up, or
  // of cluster.yaml when this controller never ran one.
  std::optional<ClusterTopology> topology;
  {
    std::lock_guard<std::mutex> lock(topology_mu_);
    if (last_topology_) topology = last_topology_;
  }
  if (!topology && options_.loader) {
    if (auto loaded = options_.loader(); loaded.ok()) topology = *std::move(loaded);
  }
  int stopped = 0;
  std::vector<std::string> lines;
  if (topology) lines = StopShards(*topology, &factory_, std::chrono::seconds(5), &stopped);
  glm::v1::ClusterStatus snap = state_.Snapshot();
  for (const auto& n : snap.nodes()) state_.SetNodeState(n.name(), glm::v1::NODE_STATE_PENDING);
  resp->set_message(absl::StrCat("cluster '", cluster_name_,
                                 "' is down: health watching stopped; shards stopped on ", stopped,
                                 " of ", topology ? topology->nodes.size() : 0, " node(s)",
                                 lines.empty() ? "" : ":\n  ", absl::StrJoin(lines, "\n  ")));
  GLM_LOG_INFO("cluster down cluster={} shards_stopped={}", cluster_name_, stopped);
  return grpc::Status::OK;
}

grpc::Status ControllerService::Plan(grpc::ServerContext*, const glm::v1::PlanRequest* req,
                                     glm::v1::PlanResponse* resp) {
  std::string path = req->config_path().empty() ? options_.config_path : req->config_path();
  auto text = options_.plan_text(path, req->json());
  if (!text.ok()) return rpc::ToGrpc(text.status());
  if (req->json()) {
    resp->set_json(*text);
  } else {
    resp->set_text(*text);
  }
  return grpc::Status::OK;
}

grpc::Status ControllerService::Validate(grpc::ServerContext*, const glm::v1::ValidateRequest* req,
                                         glm::v1::ValidateResponse* resp) {
  if (req->config_path().empty() || req->config_path() == options_.config_path) {
    auto topology = options_.loader();
    resp->set_ok(topology.ok());
    resp->set_message(topology.ok() ? absl::StrCat(options_.config_path, ": valid")
                                    : std::string(topology.status().message()));
    return grpc::Status::OK;
  }
  // Another file on the controller host: planning validates it first.
  auto text = options_.plan_text(req->config_path(), false);
  resp->set_ok(text.ok());
  resp->set_message(text.ok() ? absl::StrCat(req->config_path(), ": valid")
                              : std::string(text.status().message()));
  return grpc::Status::OK;
}

grpc::Status ControllerService::Preflight(grpc::ServerContext*,
                                          const glm::v1::ClusterPreflightRequest* req,
                                          glm::v1::ClusterPreflightResponse* resp) {
  if (!req->cluster_name().empty() && req->cluster_name() != cluster_name_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("this controller serves cluster '", cluster_name_, "' (",
                                     options_.config_path, "), not '", req->cluster_name(),
                                     "': point glmctl at the right controller (--controller)"));
  }
  auto topology = options_.loader();
  if (!topology.ok()) return rpc::ToGrpc(topology.status());
  RetryPolicy policy = options_.connect_policy;
  policy.max_attempts = std::min(policy.max_attempts, 3);
  *resp = RunClusterPreflight(*topology, &factory_, policy,
                              [](Clock::Duration d) { std::this_thread::sleep_for(d); },
                              std::chrono::seconds(60), options_.nccl_source);
  GLM_LOG_INFO("cluster preflight cluster={} ok={} gid_warning=\"{}\"", cluster_name_, resp->ok(),
               resp->gid_warning());
  return grpc::Status::OK;
}

grpc::Status ControllerService::Generate(grpc::ServerContext* ctx,
                                         const glm::v1::GenerateRequest* req,
                                         grpc::ServerWriter<glm::v1::TokenEvent>* writer) {
  // A Ready replica whose head shard (pp 0, tp 0) runs.
  const glm::v1::ClusterStatus snap = state_.Snapshot();
  struct Head {
    int replica;
    std::string node;
    std::string address;
  };
  std::vector<Head> heads;
  for (const glm::v1::ReplicaStatus& r : snap.replicas()) {
    if (r.state() != glm::v1::REPLICA_STATE_READY) continue;
    for (const glm::v1::NodeStatus& n : snap.nodes()) {
      if (n.replica() != r.index()) continue;
      const glm::v1::ShardStatus& sh = n.shard();
      if (sh.state() == glm::v1::SHARD_STATE_RUNNING && sh.pp_rank() == 0 && sh.tp_rank() == 0) {
        heads.push_back({r.index(), n.name(), n.address()});
      }
    }
  }
  if (heads.empty()) {
    std::string why;
    state_.Healthy(&why);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("no replica of cluster '", cluster_name_,
                                     "' is Ready to serve", why.empty() ? "" : ": ", why,
                                     ". Fix: run `glmctl up` (and see `glmctl status`)"));
  }
  const Head head = heads[next_replica_.fetch_add(1) % heads.size()];
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = factory_.Channel(head.address);
  if (!channel.ok()) return rpc::ToGrpc(channel.status());
  auto stub = glm::v1::Agent::NewStub(*channel);
  grpc::ClientContext client;
  // The caller's cancel (or deadline) aborts the request on the head.
  std::atomic<bool> done{false};
  std::thread cancel_watch([&] {
    while (!done.load()) {
      if (ctx->IsCancelled()) {
        client.TryCancel();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto reader = stub->Generate(&client, *req);
  glm::v1::TokenEvent ev;
  while (reader->Read(&ev)) {
    if (!writer->Write(ev)) {
      client.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  done.store(true);
  cancel_watch.join();
  if (s.ok()) return s;
  return grpc::Status(s.error_code(),
                      absl::StrCat("replica ", head.replica, " (head shard on node ", head.node,
                                   " at ", head.address, "): ", s.error_message()));
}

grpc::Status ControllerService::RendezvousPut(grpc::ServerContext*,
                                              const glm::v1::RendezvousPutRequest* req,
                                              glm::v1::RendezvousPutResponse*) {
  return rpc::ToGrpc(rendezvous_.Put(req->namespace_(), req->key(), req->value()));
}

grpc::Status ControllerService::RendezvousGet(grpc::ServerContext*,
                                              const glm::v1::RendezvousGetRequest* req,
                                              glm::v1::RendezvousGetResponse* resp) {
  auto v = rendezvous_.Get(req->namespace_(), req->key(),
                           std::chrono::milliseconds(std::max<int64_t>(req->wait_ms(), 0)));
  if (!v.ok()) return rpc::ToGrpc(v.status());
  resp->set_value(*v);
  return grpc::Status::OK;
}

grpc::Status ControllerService::RendezvousDelete(grpc::ServerContext*,
                                                 const glm::v1::RendezvousDeleteRequest* req,
                                                 glm::v1::RendezvousDeleteResponse* resp) {
  resp->set_deleted(rendezvous_.Delete(req->namespace_()));
  return grpc::Status::OK;
}

grpc::Status ControllerService::Logs(grpc::ServerContext* ctx,
                                     const glm::v1::ClusterLogsRequest* req,
                                     grpc::ServerWriter<glm::v1::LogLine>* writer) {
  return ForwardLogs(
      *req, state_.Snapshot(), factory_, ProcessLogRing(), [ctx] { return ctx->IsCancelled(); },
      [writer](const glm::v1::LogLine& line) { return writer->Write(line); });
}

}  // namespace glm::orchestrate
