#include "controller/orchestrate/replica_restart.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "controller/orchestrate/load_step.h"
#include "controller/orchestrate/steps.h"

namespace glm::orchestrate {

ClusterTopology ReplicaTopology(const ClusterTopology& topology, int replica) {
  ClusterTopology t = topology;
  t.nodes.clear();
  for (const NodeEndpoint& n : topology.nodes) {
    if (n.replica == replica) t.nodes.push_back(n);
  }
  return t;
}

namespace {

int64_t Millis(Clock::Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// The agent on `node` answers Info with an instance id other than `old_instance`, within
// `timeout` (its supervisor started a fresh process).
absl::Status AwaitNewInstance(AgentClient& client, const NodeEndpoint& node,
                              const std::string& old_instance, Clock::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error = "no answer yet";
  while (std::chrono::steady_clock::now() < deadline) {
    auto info = client.Info(std::chrono::seconds(2));
    if (info.ok() && info->instance_id() != old_instance) return absl::OkStatus();
    last_error = info.ok() ? "the old process still answers" : std::string(info.status().message());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat(
      "node ", node.name, ": its agent did not come back within ", Millis(timeout) / 1000,
      " s after exiting for a restart (", last_error,
      "). Fix: check its supervisor (systemctl status glm-agent; for local clusters the "
      "launcher's line in the agent's log), then glmctl restart --replica ", node.replica));
}

}  // namespace

absl::Status RestartReplica(const ClusterTopology& topology, int replica,
                            AgentClientFactory* factory, ClusterState* state,
                            const CanaryTokenizer& tokenizer, CanaryReference* reference,
                            const ReplicaRestartOptions& options,
                            const BringUpContext::EventSink& sink) {
  BringUpContext ctx(state, sink);
  ctx.topology = ReplicaTopology(topology, replica);
  if (ctx.topology.nodes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", replica, " does not exist (the plan has ",
        topology.replicas.size(), " replicas: 0..", topology.replicas.size() - 1, ")"));
  }
  auto emit = [&](const std::string& message) {
    glm::v1::UpEvent e;
    e.set_replica(replica);
    e.set_message(absl::StrCat("replica ", replica, ": ", message));
    ctx.Emit(e);
    GLM_LOG_INFO("replica restart replica={}: {}", replica, message);
  };
  for (const NodeEndpoint& n : ctx.topology.nodes) {
    absl::StatusOr<std::shared_ptr<AgentClient>> client = factory->Create(n);
    if (!client.ok()) {
      return Annotate(client.status(), absl::StrCat("replica ", replica, ": node ", n.name));
    }
    ctx.SetAgent(n.name, *client);
  }
  const NodeEndpoint* head = nullptr;
  for (const NodeEndpoint& n : ctx.topology.nodes) {
    if (n.pp_rank == 0 && n.tp_rank == 0) head = &n;
  }

  if (options.drain && head != nullptr) {
    state->SetReplicaMode(replica, ReplicaMode::kDraining,
                          absl::StrCat(options.reason, ": draining"));
    emit(absl::StrCat("out of routing; draining its requests in flight (at most ",
                      Millis(options.drain_timeout) / 1000.0, " s)"));
    glm::v1::DrainShardRequest drain;
    drain.set_timeout_ms(std::max<int64_t>(1, Millis(options.drain_timeout)));
    std::string last;
    absl::Status drained = ctx.agents[head->name]->DrainShard(
        drain, [&](const glm::v1::Progress& p) { last = p.message(); },
        options.drain_timeout + std::chrono::seconds(10));
    if (drained.ok()) {
      emit(last.empty() ? "drained" : last);
    } else if (drained.code() == absl::StatusCode::kDeadlineExceeded) {
      emit(absl::StrCat("drain timeout: ", drained.message(),
                        "; they end with an error as the shard stops"));
    } else {
      // A shard that is not running has nothing to drain; anything else is worth a line too.
      emit(absl::StrCat("drain skipped: ", drained.message()));
    }
  }

  state->SetReplicaMode(replica, ReplicaMode::kRestarting,
                        absl::StrCat(options.reason, ": reloading its shards"));
  if (options.processes) {
    emit("restarting the agent processes");
    std::mutex mu;
    std::vector<std::string> failures;
    ParallelFor(ctx.topology.nodes, [&](const NodeEndpoint& n) {
      AgentClient& client = *ctx.agents[n.name];
      absl::Status s;
      auto old = client.RestartProcess(glm::v1::RestartProcessRequest(), std::chrono::seconds(30));
      if (!old.ok()) {
        s = Annotate(old.status(), absl::StrCat("node ", n.name, ": RestartProcess"));
      } else {
        s = AwaitNewInstance(client, n, old->instance_id(), options.process_timeout);
      }
      if (s.ok()) {
        ctx.NodeEvent(n.name, glm::v1::NODE_STATE_CONNECTED, "agent restarted (a new process)");
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(std::string(s.message()));
    });
    if (!failures.empty()) {
      std::sort(failures.begin(), failures.end());
      return absl::UnavailableError(absl::StrJoin(failures, "\n"));
    }
  } else {
    std::vector<std::string> lines = StopShards(ctx.topology, factory, std::chrono::seconds(30));
    emit(absl::StrCat("shards stopped (", absl::StrJoin(lines, "; "), ")"));
  }

  emit("loading and starting its shards");
  LoadStep load(options.load_timeout);
  absl::Status loaded = load.Run(ctx);
  if (!loaded.ok()) return Annotate(loaded, absl::StrCat("replica ", replica, ": reload failed"));

  state->SetReplicaMode(replica, ReplicaMode::kRestarting,
                        absl::StrCat(options.reason, ": canary"));
  GLM_RETURN_IF_ERROR(
      RunCanary(ctx, {replica}, tokenizer, reference, options.canary_timeout));
  emit("restarted; canary passed");
  return absl::OkStatus();
}

}  // namespace glm::orchestrate
