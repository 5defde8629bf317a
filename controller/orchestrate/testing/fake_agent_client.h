// A scripted AgentClient (and a factory handing them out by node name) for controller tests.
//
// A test sets what a node answers before the calls (the public fields below; not synchronised
// with the calls) and reads what was asked after them (calls(), the last_* requests). Info and
// Preflight answer from their fields; each streaming RPC plays its StreamReply: every progress
// message in order to `on_progress`, then the reply's status. Thread-safe while bring-up steps
// call it from their per-node threads.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "controller/orchestrate/agent_client.h"

namespace glm::orchestrate {

class FakeAgentClient : public AgentClient {
 public:
  // What one streaming RPC sends back.
  struct StreamReply {
    std::vector<glm::v1::Progress> progress;
    absl::Status status;
  };

  explicit FakeAgentClient(std::string node_name) : node(std::move(node_name)) {}

  // Info: fails with UNAVAILABLE ("connection refused") for the first `info_failures` calls,
  // then reports `reported_node` (empty: `node`), version 0.1.0 and `mtu_echo_port`.
  std::string node;
  int info_failures = 0;
  std::string reported_node;
  int mtu_echo_port = 0;
  // Preflight: these checks (ok unless one FAILs) and, when set, the resolved GID entry.
  std::vector<glm::v1::Check> checks;
  std::optional<glm::v1::GidEntry> gid;
  // The streams; by default OK with no progress.
  StreamReply stage_nccl;
  StreamReply stage_weights;
  StreamReply load_shard;
  StreamReply stop_shard;
  StreamReply start_shard;
  StreamReply drain_shard;
  // Generate: answers with `generate_reply` (a function of the request, so tests can script a
  // model; null: one event with the prompt's first id and finish_reason "length"), or fails
  // with `generate_status` when it is not OK.
  std::function<std::vector<glm::v1::TokenEvent>(const glm::v1::GenerateRequest&)> generate_reply;
  absl::Status generate_status;
  // RestartProcess: OK with instance "i-<node>" unless this is not OK.
  absl::Status restart_process_status;

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

  // The RPCs received, in order, by method name ("Info", "StageWeights", ...).
  std::vector<std::string> calls() const;
  int CallCount(std::string_view method) const;
  // The last request of each kind (default-constructed before the first).
  glm::v1::PreflightRequest last_preflight() const;
  glm::v1::StageNcclRequest last_stage_nccl() const;
  glm::v1::StageWeightsRequest last_stage_weights() const;
  glm::v1::LoadShardRequest last_load_shard() const;
  glm::v1::GenerateRequest last_generate() const;

 private:
  absl::Status Play(const char* method, const StreamReply& reply, const ProgressFn& on_progress);

  mutable std::mutex mu_;
  std::vector<std::string> calls_;
  glm::v1::PreflightRequest last_preflight_;
  glm::v1::StageNcclRequest last_stage_nccl_;
  glm::v1::StageWeightsRequest last_stage_weights_;
  glm::v1::LoadShardRequest last_load_shard_;
  glm::v1::GenerateRequest last_generate_;
};

// Hands out `agents[node.name]`; a node without an entry is UNAVAILABLE "agent '<node>' is
// unreachable". Fill `agents` before the calls.
class FakeAgentClientFactory : public AgentClientFactory {
 public:
  // Adds (or replaces) the fake for `node` and returns it.
  std::shared_ptr<FakeAgentClient> Add(const std::string& node);
  absl::StatusOr<std::shared_ptr<AgentClient>> Create(const NodeEndpoint& node) override;

  std::map<std::string, std::shared_ptr<FakeAgentClient>> agents;
};

// A Progress message with byte counts, as staging and loading send them.
glm::v1::Progress BytesProgress(const std::string& step, const std::string& message,
                                int64_t done_bytes, int64_t total_bytes);

}  // namespace glm::orchestrate
