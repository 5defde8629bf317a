#include "controller/orchestrate/testing/fake_agent_client.h"

#include <algorithm>

namespace glm::orchestrate {

absl::StatusOr<glm::v1::InfoResponse> FakeAgentClient::Info(Clock::Duration) {
  int info_calls = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("Info");
    info_calls = static_cast<int>(std::count(calls_.begin(), calls_.end(), "Info"));
  }
  if (info_calls <= info_failures) return absl::UnavailableError("connection refused");
  glm::v1::InfoResponse r;
  r.set_node(reported_node.empty() ? node : reported_node);
  r.set_version("0.1.0");
  r.set_instance_id("i-" + node);
  r.set_mtu_echo_port(mtu_echo_port);
  return r;
}

absl::StatusOr<glm::v1::PreflightResponse> FakeAgentClient::Preflight(
    const glm::v1::PreflightRequest& request, Clock::Duration) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("Preflight");
    last_preflight_ = request;
  }
  glm::v1::PreflightResponse r;
  r.set_node(node);
  if (gid) *r.mutable_gid() = *gid;
  bool ok = true;
  for (const glm::v1::Check& c : checks) {
    ok = ok && c.status() != glm::v1::CHECK_STATUS_FAIL;
    *r.add_checks() = c;
  }
  r.set_ok(ok);
  return r;
}

absl::Status FakeAgentClient::StageNccl(const glm::v1::StageNcclRequest& request,
                                        const ProgressFn& on_progress, Clock::Duration) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_stage_nccl_ = request;
  }
  return Play("StageNccl", stage_nccl, on_progress);
}

absl::Status FakeAgentClient::StageWeights(const glm::v1::StageWeightsRequest& request,
                                           const ProgressFn& on_progress, Clock::Duration) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_stage_weights_ = request;
  }
  return Play("StageWeights", stage_weights, on_progress);
}

absl::Status FakeAgentClient::LoadShard(const glm::v1::LoadShardRequest& request,
                                        const ProgressFn& on_progress, Clock::Duration) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_load_shard_ = request;
  }
  return Play("LoadShard", load_shard, on_progress);
}

absl::Status FakeAgentClient::StopShard(const glm::v1::StopShardRequest&,
                                        const ProgressFn& on_progress, Clock::Duration) {
  return Play("StopShard", stop_shard, on_progress);
}

absl::Status FakeAgentClient::StartShard(const glm::v1::StartShardRequest&,
                                         const ProgressFn& on_progress, Clock::Duration) {
  return Play("StartShard", start_shard, on_progress);
}

absl::Status FakeAgentClient::DrainShard(const glm::v1::DrainShardRequest&,
                                         const ProgressFn& on_progress, Clock::Duration) {
  return Play("DrainShard", drain_shard, on_progress);
}

absl::Status FakeAgentClient::Generate(const glm::v1::GenerateRequest& request,
                                       const TokenFn& on_event, Clock::Duration) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("Generate");
    last_generate_ = request;
  }
  if (!generate_status.ok()) return generate_status;
  std::vector<glm::v1::TokenEvent> events;
  if (generate_reply) {
    events = generate_reply(request);
  } else {
    glm::v1::TokenEvent ev;
    ev.add_token_ids(request.prompt_token_ids_size() > 0 ? request.prompt_token_ids(0) : 0);
    ev.set_finished(true);
    ev.set_finish_reason("length");
    events.push_back(ev);
  }
  for (const auto& ev : events) {
    if (on_event) on_event(ev);
  }
  return absl::OkStatus();
}

absl::StatusOr<glm::v1::RestartProcessResponse> FakeAgentClient::RestartProcess(
    const glm::v1::RestartProcessRequest&, Clock::Duration) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("RestartProcess");
  }
  if (!restart_process_status.ok()) return restart_process_status;
  glm::v1::RestartProcessResponse r;
  r.set_instance_id("i-" + node);
  return r;
}

glm::v1::GenerateRequest FakeAgentClient::last_generate() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_generate_;
}

absl::Status FakeAgentClient::Play(const char* method, const StreamReply& reply,
                                   const ProgressFn& on_progress) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(method);
  }
  for (const glm::v1::Progress& p : reply.progress) on_progress(p);
  return reply.status;
}

std::vector<std::string> FakeAgentClient::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

int FakeAgentClient::CallCount(std::string_view method) const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count(calls_.begin(), calls_.end(), method));
}

glm::v1::PreflightRequest FakeAgentClient::last_preflight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_preflight_;
}

glm::v1::StageNcclRequest FakeAgentClient::last_stage_nccl() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_stage_nccl_;
}

glm::v1::StageWeightsRequest FakeAgentClient::last_stage_weights() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_stage_weights_;
}

glm::v1::LoadShardRequest FakeAgentClient::last_load_shard() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_load_shard_;
}

std::shared_ptr<FakeAgentClient> FakeAgentClientFactory::Add(const std::string& node) {
  auto agent = std::make_shared<FakeAgentClient>(node);
  agents[node] = agent;
  return agent;
}

absl::StatusOr<std::shared_ptr<AgentClient>> FakeAgentClientFactory::Create(
    const NodeEndpoint& node) {
  auto it = agents.find(node.name);
  if (it == agents.end()) {
    return absl::UnavailableError("agent '" + node.name + "' is unreachable");
  }
  return std::shared_ptr<AgentClient>(it->second);
}

glm::v1::Progress BytesProgress(const std::string& step, const std::string& message,
                                int64_t done_bytes, int64_t total_bytes) {
  glm::v1::Progress p;
  p.set_step(step);
  p.set_message(message);
  p.set_done_bytes(done_bytes);
  p.set_total_bytes(total_bytes);
  return p;
}

}  // namespace glm::orchestrate
