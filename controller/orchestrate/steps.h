// The bring-up steps Validate, Connect, Preflight, Plan (StageStep is in stage_step.h). Later
// milestones add LoadShardsStep (kLoad), CanaryStep (kCanary) and GatewayStep (kGateway) beside
// these and list them in the controller service.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/orchestrate/agent_client.h"
#include "controller/orchestrate/bring_up.h"
#include "controller/orchestrate/bring_up_context.h"
#include "glm/v1/controller.pb.h"

namespace glm::orchestrate {

// Re-reads and validates cluster.yaml (the desired state) and resets the cluster view to it.
class ValidateStep : public BringUpStep {
 public:
  using Loader = std::function<absl::StatusOr<ClusterTopology>()>;
  explicit ValidateStep(Loader loader) : loader_(std::move(loader)) {}
  Phase phase() const override { return Phase::kValidate; }
  absl::Status Run(BringUpContext& ctx) override;

 private:
  Loader loader_;
};

struct RetryPolicy {
  int max_attempts = 8;
  Clock::Duration initial_backoff = std::chrono::milliseconds(100);
  Clock::Duration max_backoff = std::chrono::seconds(2);
  Clock::Duration call_timeout = std::chrono::seconds(2);
};

// Waits for a duration (real: std::this_thread::sleep_for; tests: advance a FakeClock).
using Sleeper = std::function<void(Clock::Duration)>;

// Connects to every agent in parallel: Info with bounded exponential backoff; checks the agent
// is the node cluster.yaml says it is.
class ConnectStep : public BringUpStep {
 public:
  ConnectStep(AgentClientFactory* factory, RetryPolicy policy, Sleeper sleeper)
      : factory_(factory), policy_(policy), sleeper_(std::move(sleeper)) {}
  Phase phase() const override { return Phase::kConnect; }
  absl::Status Run(BringUpContext& ctx) override;

 private:
  absl::Status ConnectOne(BringUpContext& ctx, const NodeEndpoint& node);

  AgentClientFactory* const factory_;
  const RetryPolicy policy_;
  const Sleeper sleeper_;
};

// Runs preflight on every node in parallel; any failed check stops bring-up with the node, the
// check id, the evidence and the fix. Warnings are reported and do not stop it.
// The nodes' NCCL answers go through ApplyNcclStaging (nccl_source.h): a library that is missing
// where another node holds the pinned build is a warning (Stage installs it), and the plan it
// returns is left in BringUpContext::nccl_plan for the Stage phase.
class PreflightStep : public BringUpStep {
 public:
  explicit PreflightStep(Clock::Duration timeout = std::chrono::seconds(60),
                         NcclSourceProvider nccl_source = nullptr)
      : timeout_(timeout), nccl_source_(std::move(nccl_source)) {}
  Phase phase() const override { return Phase::kPreflight; }
  absl::Status Run(BringUpContext& ctx) override;

 private:
  const Clock::Duration timeout_;
  NcclSourceProvider nccl_source_;
};

// Plans ranks and replicas from the spec and model; refuses plans that do not fit.
class PlanStep : public BringUpStep {
 public:
  struct Outcome {
    std::vector<std::vector<std::string>> replicas;  // node names per replica
    std::string summary;                             // one line for the CLI
  };
  using Planner = std::function<absl::StatusOr<Outcome>(const ClusterTopology&)>;
  explicit PlanStep(Planner planner) : planner_(std::move(planner)) {}
  Phase phase() const override { return Phase::kPlan; }
  absl::Status Run(BringUpContext& ctx) override;

 private:
  Planner planner_;
};

// The Preflight request for `node`: plan needs, its fabric settings from cluster.yaml, and every
// other node with a fabric IP as an mtu.path peer (echo port from that agent's Info; 0 when
// unknown).
glm::v1::PreflightRequest BuildPreflightRequest(
    const ClusterTopology& topology, const NodeEndpoint& node,
    const std::map<std::string, glm::v1::InfoResponse>& infos);

// Empty when every node that resolved a GID entry resolved the same index; otherwise one line
// naming which nodes use which index (NCCL_IB_GID_INDEX is one value in most recipes).
std::string GidDisagreement(const std::vector<std::pair<std::string, glm::v1::GidEntry>>& gids);

// One line for a resolved entry: "index 3 ::ffff:192.168.100.1 (RoCE v2, rocep1s0f0 port 1,
// enp1s0f0np0)".
std::string DescribeGid(const glm::v1::GidEntry& gid);

// `glmctl preflight`: connects to every agent (bounded retries), runs Preflight on all of them in
// parallel and reports every check and resolved GID side by side. Changes no cluster state.
glm::v1::ClusterPreflightResponse RunClusterPreflight(const ClusterTopology& topology,
                                                      AgentClientFactory* factory,
                                                      const RetryPolicy& policy,
                                                      const Sleeper& sleeper,
                                                      Clock::Duration timeout,
                                                      const NcclSourceProvider& nccl_source = nullptr);

// For steps that act on every connected node (Stage, Load): runs fn(node, client, fail) for every
// node in parallel; fail(msg) marks the node Failed (NodeEvent with msg as its error) and records
// msg. A node without a connection fails with "node N: not connected; <what> skipped". Returns OK,
// or FailedPrecondition with the failure lines sorted.
using NodeFailFn = std::function<void(const std::string&)>;
absl::Status ForEachConnectedNode(
    BringUpContext& ctx, const std::string& what,
    const std::function<void(const NodeEndpoint&, AgentClient&, const NodeFailFn&)>& fn);

// Runs `fn` for every element on its own thread and waits for all (nodes are few: 4-8).
template <typename T, typename Fn>
void ParallelFor(const std::vector<T>& items, Fn&& fn) {
  std::vector<std::thread> threads;
  threads.reserve(items.size());
  for (const auto& item : items) threads.emplace_back([&fn, &item] { fn(item); });
  for (auto& t : threads) t.join();
}
}  // namespace glm::orchestrate
