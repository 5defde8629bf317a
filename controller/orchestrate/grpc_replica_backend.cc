#include "controller/orchestrate/grpc_replica_backend.h"

#include <atomic>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace glm::orchestrate {
namespace {

std::string StateName(glm::v1::ReplicaState s) {
  switch (s) {
    case glm::v1::REPLICA_STATE_READY:
      return "ready";
    case glm::v1::REPLICA_STATE_DEGRADED:
      return "degraded";
    case glm::v1::REPLICA_STATE_FAILED:
      return "failed";
    case glm::v1::REPLICA_STATE_DRAINING:
      return "draining";
    case glm::v1::REPLICA_STATE_RESTARTING:
      return "restarting";
    default:
      return "pending";
  }
}

glm::v1::GenerateRequest ToProto(const gateway::GenerateParams& p) {
  glm::v1::GenerateRequest req;
  req.set_request_id(p.request_id);
  for (int32_t id : p.prompt_token_ids) req.add_prompt_token_ids(id);
  req.set_max_tokens(p.max_tokens);
  req.set_temperature(p.temperature);
  req.set_top_p(p.top_p);
  req.set_top_k(p.top_k);
  for (int32_t id : p.stop_token_ids) req.add_stop_token_ids(id);
  if (p.seed) req.set_seed(static_cast<int64_t>(*p.seed));
  req.set_min_tokens(p.min_tokens);
  req.set_ignore_eos(p.ignore_eos);
  if (p.mtp_draft_tokens.has_value()) req.set_mtp_draft_tokens(*p.mtp_draft_tokens);
  if (p.logprobs) {
    req.set_return_logprobs(true);
    req.set_top_logprobs(*p.logprobs);
  }
  return req;
}

// One Agent.Generate stream on the callback API. Owns itself from Start until OnDone (gRPC's
// last callback); the gateway's shared_ptr may keep it longer, for Cancel.
class GenerateReactor final : public grpc::ClientReadReactor<glm::v1::TokenEvent>,
                              public gateway::GenerateCall {
 public:
  GenerateReactor(gateway::GenerateCallbacks callbacks, std::string where)
      : callbacks_(std::move(callbacks)), where_(std::move(where)) {}

  void Start(std::shared_ptr<GenerateReactor> self, std::shared_ptr<grpc::Channel> channel,
             glm::v1::GenerateRequest request) {
    self_ = std::move(self);
    stub_ = glm::v1::Agent::NewStub(std::move(channel));
    request_ = std::move(request);
    stub_->async()->Generate(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }

  void Cancel() override {
    cancelled_.store(true);
    context_.TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is over; OnDone follows
    if (event_.token_ids_size() > 0) {
      tokens_.assign(event_.token_ids().begin(), event_.token_ids().end());
      logprobs_.clear();
      for (const glm::v1::TokenLogprob& lp : event_.logprobs()) {
        gateway::TokenLogprob out;
        out.logprob = lp.logprob();
        for (int i = 0; i < lp.top_ids_size() && i < lp.top_logprobs_size(); ++i) {
          out.top.emplace_back(lp.top_ids(i), lp.top_logprobs(i));
        }
        logprobs_.push_back(std::move(out));
      }
      if (callbacks_.on_tokens) callbacks_.on_tokens(tokens_, logprobs_);
    }
    if (event_.finished()) {
      finished_ = true;
      finish_reason_ = event_.finish_reason();
      prompt_tokens_ = event_.prompt_tokens();
      completion_tokens_ = event_.completion_tokens();
    }
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status result;
    std::string reason = finish_reason_;
    if (finished_) {
      result = absl::OkStatus();
    } else if (cancelled_.load()) {
      reason = "abort";
    } else if (status.ok()) {
      result = absl::InternalError(
          absl::StrCat(where_, ": the stream ended without its final event"));
    } else {
      result = absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                            absl::StrCat(where_, ": ", status.error_message()));
    }
    if (callbacks_.on_done) {
      callbacks_.on_done(result, reason, prompt_tokens_, completion_tokens_);
    }
    callbacks_ = {};
    std::shared_ptr<GenerateReactor> keep = std::move(self_);  // may free this on return
  }

 private:
  gateway::GenerateCallbacks callbacks_;
  const std::string where_;
  std::shared_ptr<GenerateReactor> self_;
  std::unique_ptr<glm::v1::Agent::Stub> stub_;
  grpc::ClientContext context_;
  glm::v1::GenerateRequest request_;
  glm::v1::TokenEvent event_;
  std::vector<int32_t> tokens_;
  std::vector<gateway::TokenLogprob> logprobs_;
  std::atomic<bool> cancelled_{false};
  bool finished_ = false;
  std::string finish_reason_;
  int prompt_tokens_ = 0;
  int completion_tokens_ = 0;
};

// A call that failed before reaching a replica: nothing to cancel.
class FailedCall final : public gateway::GenerateCall {
 public:
  void Cancel() override {}
};

}  // namespace

GrpcReplicaBackend::GrpcReplicaBackend(ClusterState* state, GrpcAgentClientFactory* channels,
                                       Clock* clock, ReplicaBackendOptions options)
    : state_(state), channels_(channels), clock_(clock), options_(options) {}

std::vector<gateway::ReplicaInfo> GrpcReplicaBackend::Replicas() {
  const glm::v1::ClusterStatus snap = state_->Snapshot();
  const Clock::TimePoint now = clock_->Now();
  std::vector<gateway::ReplicaInfo> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const glm::v1::ReplicaStatus& r : snap.replicas()) {
    gateway::ReplicaInfo info;
    info.index = r.index();
    info.state = StateName(r.state());
    info.reason = r.message();
    const glm::v1::NodeStatus* head = nullptr;
    for (const glm::v1::NodeStatus& n : snap.nodes()) {
      if (n.replica() == r.index() && n.shard().head() &&
          n.shard().state() == glm::v1::SHARD_STATE_RUNNING) {
        head = &n;
      }
    }
    if (head == nullptr) {
      if (r.state() == glm::v1::REPLICA_STATE_READY) {
        info.state = "pending";
        info.reason = "its head shard (pp 0, tp 0) is not running";
      }
      progress_.erase(r.index());
      out.push_back(std::move(info));
      continue;
    }
    info.kv_cache_usage = head->shard().kv_cache_usage();
    info.requests_in_flight = head->shard().requests_in_flight();
    const glm::v1::ShardStatus& hs = head->shard();
    info.spec.draft_tokens_per_step = hs.mtp_draft_tokens();
    info.spec.drafts = hs.spec_drafts();
    info.spec.draft_tokens = hs.spec_draft_tokens();
    info.spec.accepted_tokens = hs.spec_accepted_tokens();
    info.spec.accepted_per_position.assign(hs.spec_accepted_per_position().begin(),
                                           hs.spec_accepted_per_position().end());
    Progress& p = progress_[r.index()];
    if (head->shard().steps() != p.steps || info.requests_in_flight == 0) {
      p.steps = head->shard().steps();
      p.changed = now;
    }
    const auto age = std::chrono::milliseconds(head->last_heartbeat_age_ms());
    if (r.state() == glm::v1::REPLICA_STATE_READY) {
      if (head->last_heartbeat_age_ms() < 0 || age > options_.stale_after) {
        info.state = "stalled";
        info.reason = absl::StrCat("no status from its head node ", head->name(), " for ",
                                   head->last_heartbeat_age_ms(), " ms");
      } else if (now - p.changed > options_.stall_after) {
        info.state = "stalled";
        info.reason = absl::StrCat(
            "its engine ran no step for ",
            std::chrono::duration_cast<std::chrono::seconds>(now - p.changed).count(),
            " s with ", info.requests_in_flight, " requests in flight (head node ", head->name(),
            ")");
      } else {
        info.ready = true;
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::map<std::string, std::string> GrpcReplicaBackend::NodeStates() {
  std::map<std::string, std::string> out;
  const glm::v1::ClusterStatus snap = state_->Snapshot();
  for (const glm::v1::NodeStatus& n : snap.nodes()) {
    // NODE_STATE_READY -> "ready"
    std::string name = glm::v1::NodeState_Name(n.state());
    if (absl::StartsWith(name, "NODE_STATE_")) name = name.substr(11);
    out[n.name()] = absl::AsciiStrToLower(name);
  }
  return out;
}

absl::StatusOr<GrpcReplicaBackend::Head> GrpcReplicaBackend::FindHead(int replica) {
  const glm::v1::ClusterStatus snap = state_->Snapshot();
  for (const glm::v1::NodeStatus& n : snap.nodes()) {
    if (n.replica() == replica && n.shard().head() &&
        n.shard().state() == glm::v1::SHARD_STATE_RUNNING) {
      return Head{n.name(), n.address()};
    }
  }
  return absl::UnavailableError(
      absl::StrCat("replica ", replica, " has no running head shard; see `glmctl status`"));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> GrpcReplicaBackend::ChannelFor(
    const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channel_cache_.find(address);
  if (it != channel_cache_.end()) return it->second;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = channels_->Channel(address);
  if (!channel.ok()) return channel.status();
  channel_cache_[address] = *channel;
  return *channel;
}

std::shared_ptr<gateway::GenerateCall> GrpcReplicaBackend::Generate(
    int replica, const gateway::GenerateParams& params, gateway::GenerateCallbacks callbacks) {
  absl::StatusOr<Head> head = FindHead(replica);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      head.ok() ? ChannelFor(head->address) : head.status();
  if (!channel.ok()) {
    if (callbacks.on_done) callbacks.on_done(channel.status(), "", 0, 0);
    return std::make_shared<FailedCall>();
  }
  auto reactor = std::make_shared<GenerateReactor>(
      std::move(callbacks), absl::StrCat("replica ", replica, " (head shard on node ", head->node,
                                         " at ", head->address, ")"));
  reactor->Start(reactor, *channel, ToProto(params));
  return reactor;
}

}  // namespace glm::orchestrate
