#include "agent/service/agent_service.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
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

grpc::Status AgentService::Info(grpc::ServerContext*, const glm::v1::InfoRequest*,
                                glm::v1::InfoResponse* resp) {
  resp->set_node(options_.node);
  resp->set_version(options_.version);
  resp->set_instance_id(instance_id_);
  resp->set_start_time_unix_ms(start_unix_ms_);
  resp->set_uptime_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_->Now() - start_).count());
  *resp->mutable_host() = GatherHostFacts(options_.probe_paths);
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
  GLM_LOG_INFO("preflight node={} checks={} warn={} fail={}", options_.node, resp->checks_size(),
               warn, fail);
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
