#include "agent/service/agent_service.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/service/node_preflight.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "proto/rpc/status_map.h"

namespace glm::agent {
namespace {

int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

grpc::Status NotImplemented(const std::string& rpc, const std::string& node,
                            const std::string& milestone) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      absl::StrCat(rpc, " on node '", node, "': not implemented in this glm-agent (",
                                   milestone, "); nothing was changed"));
}

// Streams ShardHost progress to the client; maps the final status once.
template <typename Fn>
grpc::Status RunShardOp(grpc::ServerWriter<glm::v1::Progress>* writer, Fn&& fn) {
  absl::Status status = fn([writer](const glm::v1::Progress& p) { writer->Write(p); });
  return rpc::ToGrpc(status);
}

}  // namespace

std::string NewInstanceId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(UnixMillisNow()));
  return absl::StrFormat("%016x", gen());
}

AgentService::AgentService(AgentServiceOptions options, Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      instance_id_(NewInstanceId()),
      start_(clock->Now()),
      start_unix_ms_(UnixMillisNow()),
      publisher_(options_.node, instance_id_, clock),
      shard_(options_.node) {
  glm::v1::HostFacts facts = GatherHostFacts(options_.probe_paths);
  publisher_.Update([&](glm::v1::AgentStatus& s) {
    s.set_mem_available_bytes(facts.mem_available_bytes());
    s.set_shard_state(shard_.state());
  });
}

AgentService::~AgentService() { Shutdown(); }

void AgentService::Shutdown() {
  publisher_.Shutdown();
  gid_stop_.store(true);
  if (gid_thread_.joinable()) gid_thread_.join();
}

void AgentService::StartGidWatchThread() {
  if (gid_thread_.joinable()) return;
  gid_thread_ = std::thread([this] {
    preflight::NetlinkAddressMonitor netlink;
    bool have_netlink = false;
    if (options_.gid_netlink) {
      absl::Status s = netlink.Open();
      have_netlink = s.ok();
      if (!s.ok()) {
        GLM_LOG_WARN("gid watch: no netlink events ({}); periodic re-read only",
                     glm::ToStd(s.message()));
      }
    }
    // Wake at least every 250 ms so short --gid-watch-ms intervals and shutdown are honoured.
    while (!gid_stop_.load()) {
      bool event = false;
      if (have_netlink) {
        event = netlink.WaitForEvents(250);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
      }
      if (gid_stop_.load()) break;
      PollGidWatch(event);
    }
  });
}

bool AgentService::PollGidWatch(bool force) {
  std::shared_ptr<preflight::GidWatcher> watcher;
  {
    std::lock_guard<std::mutex> lock(gid_mu_);
    watcher = gid_watcher_;
  }
  return watcher != nullptr && watcher->Poll(force);
}

void AgentService::ArmGidWatch(const preflight::GidCheckInput& input,
                               const preflight::GidEntry& validated) {
  preflight::GidWatcher::Options wopts;
  wopts.roots = options_.roots;
  wopts.input = input;
  wopts.interval = options_.gid_watch_interval;
  auto watcher = std::make_shared<preflight::GidWatcher>(
      wopts, clock_, [this](const preflight::GidChangeEvent& e) { OnGidChange(e); });
  watcher->Poll(true);  // baseline
  {
    std::lock_guard<std::mutex> lock(gid_mu_);
    gid_watcher_ = watcher;
    gid_validated_ = validated;
  }
  publisher_.Update([&](glm::v1::AgentStatus& s) {
    *s.mutable_gid() = ToProto(validated);
    s.set_degraded(false);
    s.clear_degraded_message();
  });
  GLM_LOG_INFO("gid watch armed node={} entry=\"{}\" interval_ms={}", options_.node,
               validated.Describe(),
               std::chrono::duration_cast<std::chrono::milliseconds>(options_.gid_watch_interval)
                   .count());
}

void AgentService::OnGidChange(const preflight::GidChangeEvent& event) {
  std::optional<preflight::GidEntry> validated;
  {
    std::lock_guard<std::mutex> lock(gid_mu_);
    validated = gid_validated_;
  }
  bool back = event.new_entry.has_value() && validated.has_value() &&
              *event.new_entry == *validated;
  std::string message = event.message;
  if (message.empty()) {
    message = absl::StrCat(
        "gid.index changed on node ", options_.node, ": ",
        event.old_entry ? event.old_entry->Describe() : std::string("(none)"), " -> ",
        event.new_entry ? event.new_entry->Describe() : std::string("(none)"));
  }
  publisher_.Update([&](glm::v1::AgentStatus& s) {
    if (event.new_entry) {
      *s.mutable_gid() = ToProto(*event.new_entry);
    } else {
      s.clear_gid();
    }
    s.set_degraded(!back);
    if (back) {
      s.clear_degraded_message();
    } else {
      s.set_degraded_message(message);
    }
  });
  if (back) {
    GLM_LOG_INFO("gid entry back to the validated one node={}: {}", options_.node, message);
  } else {
    GLM_LOG_WARN("degraded node={}: {}", options_.node, message);
  }
}

grpc::Status AgentService::Info(grpc::ServerContext*, const glm::v1::InfoRequest*,
                                glm::v1::InfoResponse* resp) {
  resp->set_node(options_.node);
  resp->set_version(options_.version);
  resp->set_instance_id(instance_id_);
  resp->set_start_time_unix_ms(start_unix_ms_);
  resp->set_uptime_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_->Now() - start_).count());
  *resp->mutable_host() = GatherHostFacts(options_.probe_paths);
  resp->set_fabric_ip(options_.fabric_ip);
  resp->set_mtu_echo_port(options_.mtu_echo_port);
  resp->set_stage_port(options_.stage_port);
  return grpc::Status::OK;
}

grpc::Status AgentService::Preflight(grpc::ServerContext*, const glm::v1::PreflightRequest* req,
                                     glm::v1::PreflightResponse* resp) {
  HostRequirements host_req;
  host_req.model_dir = req->model_dir();
  host_req.required_disk_bytes = req->required_disk_bytes();
  host_req.required_memory_bytes = req->required_memory_bytes();
  host_req.require_gpu = req->require_gpu() && !options_.allow_no_gpu;
  std::vector<glm::v1::Check> checks = RunHostChecks(host_req, options_.probe_paths);
  NodePreflightOutcome node =
      RunAgentNodePreflight(options_.node, *req, options_.roots, host_req.require_gpu);
  for (auto& c : node.checks) checks.push_back(std::move(c));
  if (node.gid) {
    *resp->mutable_gid() = ToProto(*node.gid);
    if (node.gid_input) ArmGidWatch(*node.gid_input, *node.gid);
  }
  if (options_.extra_checks) {
    for (auto& c : options_.extra_checks(*req)) checks.push_back(std::move(c));
  }
  bool ok = true;
  int warn = 0, fail = 0;
  for (auto& c : checks) {
    if (c.status() == glm::v1::CHECK_STATUS_FAIL) {
      ok = false;
      ++fail;
    } else if (c.status() == glm::v1::CHECK_STATUS_WARN) {
      ++warn;
    }
    *resp->add_checks() = std::move(c);
  }
  resp->set_node(options_.node);
  resp->set_ok(ok);
  GLM_LOG_INFO("preflight node={} checks={} warn={} fail={} gid=\"{}\"", options_.node,
               resp->checks_size(), warn, fail,
               node.gid ? node.gid->Describe() : std::string("-"));
  return grpc::Status::OK;
}

grpc::Status AgentService::StageNccl(grpc::ServerContext*, const glm::v1::StageNcclRequest*,
                                     grpc::ServerWriter<glm::v1::Progress>*) {
  return NotImplemented("StageNccl", options_.node, "NCCL staging arrives with the staging issue");
}

grpc::Status AgentService::StageWeights(grpc::ServerContext*, const glm::v1::StageWeightsRequest*,
                                        grpc::ServerWriter<glm::v1::Progress>*) {
  return NotImplemented("StageWeights", options_.node,
                        "weight staging arrives with the staging issue");
}

grpc::Status AgentService::LoadShard(grpc::ServerContext*, const glm::v1::LoadShardRequest* req,
                                     grpc::ServerWriter<glm::v1::Progress>* writer) {
  return RunShardOp(writer, [&](auto progress) { return shard_.Load(*req, progress); });
}

grpc::Status AgentService::StartShard(grpc::ServerContext*, const glm::v1::StartShardRequest* req,
                                      grpc::ServerWriter<glm::v1::Progress>* writer) {
  return RunShardOp(writer, [&](auto progress) { return shard_.Start(*req, progress); });
}

grpc::Status AgentService::DrainShard(grpc::ServerContext*, const glm::v1::DrainShardRequest* req,
                                      grpc::ServerWriter<glm::v1::Progress>* writer) {
  return RunShardOp(writer, [&](auto progress) { return shard_.Drain(*req, progress); });
}

grpc::Status AgentService::StopShard(grpc::ServerContext*, const glm::v1::StopShardRequest* req,
                                     grpc::ServerWriter<glm::v1::Progress>* writer) {
  return RunShardOp(writer, [&](auto progress) { return shard_.Stop(*req, progress); });
}

grpc::Status AgentService::WatchStatus(grpc::ServerContext* ctx,
                                       const glm::v1::WatchStatusRequest* req,
                                       grpc::ServerWriter<glm::v1::AgentStatus>* writer) {
  auto heartbeat = req->heartbeat_ms() > 0 ? std::chrono::milliseconds(req->heartbeat_ms())
                                           : options_.heartbeat;
  // Bound the interval so a bad request cannot make the controller think we died, or spin us.
  heartbeat = std::clamp(heartbeat, std::chrono::milliseconds(50), std::chrono::milliseconds(60000));
  std::string peer = ctx->peer();
  GLM_LOG_INFO("status stream opened node={} peer={} heartbeat_ms={}", options_.node, peer,
               heartbeat.count());
  glm::v1::AgentStatus status = publisher_.Snapshot();
  if (!writer->Write(status)) return grpc::Status::OK;
  int64_t seen = status.version();
  while (!ctx->IsCancelled()) {
    if (!publisher_.Wait(seen, heartbeat, &status)) break;  // agent shutting down
    if (!writer->Write(status)) break;                      // client went away
    seen = status.version();
  }
  GLM_LOG_INFO("status stream closed node={} peer={}", options_.node, peer);
  return grpc::Status::OK;
}

grpc::Status AgentService::Generate(grpc::ServerContext*, const glm::v1::GenerateRequest*,
                                    grpc::ServerWriter<glm::v1::TokenEvent>*) {
  return NotImplemented("Generate", options_.node,
                        "token generation needs an engine shard, which arrives with the engine "
                        "issue");
}

}  // namespace glm::agent
