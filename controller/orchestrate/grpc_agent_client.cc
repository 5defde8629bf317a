#include "controller/orchestrate/grpc_agent_client.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "proto/rpc/status_map.h"

namespace glm::orchestrate {
namespace {

void SetDeadline(grpc::ClientContext* ctx, Clock::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout));
}

absl::Status Describe(const grpc::Status& s, const std::string& node, const std::string& address) {
  absl::Status st = rpc::ToAbsl(s);
  return absl::Status(st.code(), absl::StrCat("agent '", node, "' at ", address, ": ",
                                              grpc::StatusCode(s.error_code()) ==
                                                      grpc::StatusCode::UNAVAILABLE
                                                  ? "unavailable ("
                                                  : "(",
                                              s.error_message(), ")"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> GrpcAgentClientFactory::Channel(
    const std::string& address) {
  auto creds = rpc::MakeChannelCredentials(tls_);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  // Reconnect quickly after an agent restart (the default backoff grows to 2 minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, *creds, args);
}

absl::StatusOr<std::shared_ptr<AgentClient>> GrpcAgentClientFactory::Create(
    const NodeEndpoint& node) {
  auto channel = Channel(node.address);
  if (!channel.ok()) return channel.status();
  return std::make_shared<GrpcAgentClient>(node.name, node.address, *channel);
}

GrpcAgentClient::GrpcAgentClient(std::string node, std::string address,
                                 std::shared_ptr<grpc::Channel> channel)
    : node_(std::move(node)),
      address_(std::move(address)),
      stub_(glm::v1::Agent::NewStub(std::move(channel))) {}

absl::StatusOr<glm::v1::InfoResponse> GrpcAgentClient::Info(Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  glm::v1::InfoResponse resp;
  grpc::Status s = stub_->Info(&ctx, {}, &resp);
  if (!s.ok()) return Describe(s, node_, address_);
  return resp;
}

absl::StatusOr<glm::v1::PreflightResponse> GrpcAgentClient::Preflight(
    const glm::v1::PreflightRequest& request, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  glm::v1::PreflightResponse resp;
  grpc::Status s = stub_->Preflight(&ctx, request, &resp);
  if (!s.ok()) return Describe(s, node_, address_);
  return resp;
}

namespace {

template <typename Reader>
absl::Status Drain(Reader reader, grpc::ClientContext* ctx,
                   const AgentClient::ProgressFn& on_progress) {
  (void)ctx;
  glm::v1::Progress p;
  while (reader->Read(&p)) {
    if (on_progress) on_progress(p);
  }
  grpc::Status s = reader->Finish();
  return rpc::ToAbsl(s);
}

}  // namespace

absl::Status GrpcAgentClient::StageNccl(const glm::v1::StageNcclRequest& request,
                                        const ProgressFn& on_progress, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  absl::Status st = Drain(stub_->StageNccl(&ctx, request), &ctx, on_progress);
  if (st.ok()) return st;
  return Describe(rpc::ToGrpc(st), node_, address_);
}

absl::Status GrpcAgentClient::StageWeights(const glm::v1::StageWeightsRequest& request,
                                           const ProgressFn& on_progress,
                                           Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  absl::Status st = Drain(stub_->StageWeights(&ctx, request), &ctx, on_progress);
  if (st.ok()) return st;
  return Describe(rpc::ToGrpc(st), node_, address_);
}

absl::Status GrpcAgentClient::LoadShard(const glm::v1::LoadShardRequest& request,
                                        const ProgressFn& on_progress, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  absl::Status st = Drain(stub_->LoadShard(&ctx, request), &ctx, on_progress);
  if (st.ok()) return st;
  return Describe(rpc::ToGrpc(st), node_, address_);
}

absl::Status GrpcAgentClient::StopShard(const glm::v1::StopShardRequest& request,
                                        const ProgressFn& on_progress, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  absl::Status st = Drain(stub_->StopShard(&ctx, request), &ctx, on_progress);
  if (st.ok()) return st;
  return Describe(rpc::ToGrpc(st), node_, address_);
}

absl::Status GrpcAgentClient::StartShard(const glm::v1::StartShardRequest& request,
                                         const ProgressFn& on_progress, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  absl::Status st = Drain(stub_->StartShard(&ctx, request), &ctx, on_progress);
  if (st.ok()) return st;
  return Describe(rpc::ToGrpc(st), node_, address_);
}

absl::Status GrpcAgentClient::DrainShard(const glm::v1::DrainShardRequest& request,
                                         const ProgressFn& on_progress, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  absl::Status st = Drain(stub_->DrainShard(&ctx, request), &ctx, on_progress);
  if (st.ok()) return st;
  return Describe(rpc::ToGrpc(st), node_, address_);
}

absl::Status GrpcAgentClient::Generate(const glm::v1::GenerateRequest& request,
                                       const TokenFn& on_event, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  auto reader = stub_->Generate(&ctx, request);
  glm::v1::TokenEvent ev;
  while (reader->Read(&ev)) {
    if (on_event) on_event(ev);
  }
  grpc::Status s = reader->Finish();
  if (s.ok()) return absl::OkStatus();
  return Describe(s, node_, address_);
}

absl::StatusOr<glm::v1::RestartProcessResponse> GrpcAgentClient::RestartProcess(
    const glm::v1::RestartProcessRequest& request, Clock::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  glm::v1::RestartProcessResponse resp;
  grpc::Status s = stub_->RestartProcess(&ctx, request, &resp);
  if (!s.ok()) return Describe(s, node_, address_);
  return resp;
}

StatusWatchers::StatusWatchers(GrpcAgentClientFactory* factory, HealthMonitor* monitor,
                               std::chrono::milliseconds heartbeat,
                               std::chrono::milliseconds tick)
    : factory_(factory), monitor_(monitor), heartbeat_(heartbeat), tick_(tick) {}

StatusWatchers::~StatusWatchers() { Stop(); }

bool StatusWatchers::SleepUnlessStopped(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [&] { return stopping_; });
}

void StatusWatchers::Start(const std::vector<NodeEndpoint>& nodes) {
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = false;
  for (const auto& n : nodes) {
    auto w = std::make_unique<Watcher>();
    w->node = n;
    Watcher* raw = w.get();
    watchers_[n.name] = std::move(w);
    raw->thread = std::thread([this, raw] { RunWatcher(raw); });
  }
  ticker_ = std::thread([this] {
    while (SleepUnlessStopped(tick_)) {
      for (const auto& node : monitor_->Tick()) CancelStream(node);
    }
  });
}

void StatusWatchers::Stop() {
  std::map<std::string, std::unique_ptr<Watcher>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    watchers.swap(watchers_);
  }
  cv_.notify_all();
  for (auto& [name, w] : watchers) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      if (w->ctx) w->ctx->TryCancel();
    }
    if (w->thread.joinable()) w->thread.join();
  }
  if (ticker_.joinable()) ticker_.join();
}

void StatusWatchers::CancelStream(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = watchers_.find(node);
  if (it == watchers_.end()) return;
  std::lock_guard<std::mutex> wlock(it->second->mu);
  if (it->second->ctx) it->second->ctx->TryCancel();
}

void StatusWatchers::RunWatcher(Watcher* w) {
  std::chrono::milliseconds backoff(100);
  auto channel = factory_->Channel(w->node.address);
  if (!channel.ok()) {
    monitor_->OnStreamBroken(w->node.name, std::string(channel.status().message()));
    return;
  }
  auto stub = glm::v1::Agent::NewStub(*channel);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    grpc::ClientContext ctx;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->ctx = &ctx;
    }
    glm::v1::WatchStatusRequest req;
    req.set_heartbeat_ms(heartbeat_.count());
    auto reader = stub->WatchStatus(&ctx, req);
    glm::v1::AgentStatus status;
    bool got_any = false;
    while (reader->Read(&status)) {
      got_any = true;
      backoff = std::chrono::milliseconds(100);
      monitor_->OnStatus(w->node.name, status);
    }
    grpc::Status s = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->ctx = nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    std::string why = s.ok() ? "the agent closed the stream (shutting down?)"
                             : absl::StrCat(s.error_message(), " (code ",
                                            static_cast<int>(s.error_code()), ")");
    if (got_any) GLM_LOG_WARN("status stream ended node={} reason=\"{}\"", w->node.name, why);
    monitor_->OnStreamBroken(w->node.name, absl::StrCat(w->node.address, ": ", why));
    if (!SleepUnlessStopped(backoff)) return;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace glm::orchestrate
