#include "agent/service/agent_service.h"

#include <algorithm>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/preflight/gid.h"
#include "agent/service/node_preflight.h"
#include "agent/shard/progress.h"
#include "agent/stage/nccl_stage.h"
#include "agent/stage/weight_stager.h"
#include "cluster/manifest/manifest.h"
#include "common/human_bytes.h"
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

// Streams ShardHost progress to the client; maps the final status once.
template <typename Fn>
grpc::Status RunShardOp(grpc::ServerWriter<glm::v1::Progress>* writer, Fn&& fn) {
  absl::Status status = fn([writer](const glm::v1::Progress& p) { writer->Write(p); });
  return rpc::ToGrpc(status);
}

}  // namespace

ShardHostOptions ShardOptions(const AgentServiceOptions& options, Clock* clock,
                              StatusPublisher* publisher) {
  ShardHostOptions o = options.shard;
  o.node = options.node;
  o.clock = clock;
  o.model_dir = options.model_dir;
  if (o.proc_root == "/proc") o.proc_root = options.probe_paths.proc_root;
  // The controller's rendezvous is reached with the node's client identity, like its peers.
  if (o.rendezvous_credentials == nullptr) o.rendezvous_credentials = options.peer_credentials;
  o.on_status = [publisher](const glm::v1::ShardStatus& shard) {
    publisher->Update([&](glm::v1::AgentStatus& s) {
      *s.mutable_shard() = shard;
      s.set_shard_state(shard.state());
      s.set_kv_cache_usage(shard.kv_cache_usage());
      s.set_tokens_per_second(shard.tokens_per_second());
      if (!shard.last_error().empty()) s.set_last_error(shard.last_error());
    });
  };
  return o;
}

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
      shard_(ShardOptions(options_, clock, &publisher_)),
      files_(stage::FileServer::Options{[this] { return ServedRoot(); },
                                        [this] { return ServedNccl(); }}) {
  glm::v1::HostFacts facts = GatherHostFacts(options_.probe_paths);
  publisher_.Update([&](glm::v1::AgentStatus& s) {
    s.set_mem_available_bytes(facts.mem_available_bytes());
    s.set_shard_state(shard_.state());
  });
}

AgentService::~AgentService() { Shutdown(); }

void AgentService::Shutdown() {
  publisher_.Shutdown();
  logs_stop_.store(true);
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
  resp->set_stage_port(options_.stage_port_fn ? options_.stage_port_fn() : options_.stage_port);
  resp->set_insecure(options_.insecure);
  return grpc::Status::OK;
}

std::string AgentService::NcclPath(const std::string& requested) const {
  if (requested.empty()) return "";  // the cluster pins no NCCL library
  return options_.nccl_library.empty() ? requested : options_.nccl_library;
}

std::string AgentService::ServedRoot() const {
  if (!options_.stage_root.empty()) return options_.stage_root;
  if (!options_.model_dir.empty()) return options_.model_dir;
  std::lock_guard<std::mutex> lock(served_mu_);
  return staged_root_;
}

std::string AgentService::ServedNccl() const {
  if (!options_.nccl_library.empty()) return options_.nccl_library;
  std::lock_guard<std::mutex> lock(served_mu_);
  return known_nccl_;
}

grpc::Status AgentService::FetchFile(grpc::ServerContext* ctx, const glm::v1::FetchFileRequest* req,
                                     grpc::ServerWriter<glm::v1::FileChunk>* writer) {
  return files_.FetchFile(ctx, req, writer);
}

grpc::Status AgentService::Preflight(grpc::ServerContext*, const glm::v1::PreflightRequest* req_in,
                                     glm::v1::PreflightResponse* resp) {
  // hca and netdev become path components under sysfs (class/infiniband/<hca>, net/<netdev>).
  for (const auto& [field, name] : {std::pair<const char*, const std::string*>{"hca", &req_in->hca()},
                                    {"netdev", &req_in->netdev()}}) {
    if (name->find('/') != std::string::npos || *name == "." || *name == "..") {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("preflight on node '", options_.node, "': PreflightRequest.", field, " '",
                       *name, "' is not a device name (it holds '/' or is '.' or '..'). Fix: set "
                       "nodes[].", field, " in cluster.yaml to a name as `ls /sys/class/",
                       std::string(field) == "hca" ? "infiniband" : "net", "` lists it"));
    }
  }
  glm::v1::PreflightRequest effective = *req_in;
  effective.set_nccl_library(NcclPath(req_in->nccl_library()));
  const glm::v1::PreflightRequest* req = &effective;
  if (!req->nccl_library().empty()) {
    std::lock_guard<std::mutex> lock(served_mu_);
    known_nccl_ = req->nccl_library();
  }
  HostRequirements host_req;
  host_req.model_dir = options_.model_dir.empty() ? req->model_dir() : options_.model_dir;
  host_req.required_disk_bytes = req->required_disk_bytes();
  host_req.required_memory_bytes = req->required_memory_bytes();
  host_req.require_gpu = req->require_gpu() && !options_.allow_no_gpu;
  std::vector<glm::v1::Check> checks = RunHostChecks(host_req, options_.probe_paths);
  NodePreflightOutcome node =
      RunAgentNodePreflight(options_.node, *req, options_.roots, host_req.require_gpu);
  for (auto& c : node.checks) checks.push_back(std::move(c));
  if (node.nccl) *resp->mutable_nccl() = *node.nccl;
  {
    std::lock_guard<std::mutex> lock(gid_mu_);
    gid_input_ = node.gid_input;
  }
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

namespace {

std::vector<stage::PeerAddress> ToPeers(
    const google::protobuf::RepeatedPtrField<glm::v1::StagePeer>& peers) {
  std::vector<stage::PeerAddress> out;
  for (const auto& p : peers) {
    if (p.host().empty() || p.port() <= 0 || p.port() > 65535) continue;
    out.push_back({p.node(), p.host(), static_cast<uint16_t>(p.port()), p.tls_name()});
  }
  return out;
}

grpc::Status StageError(const std::string& rpc, const std::string& node,
                        const absl::Status& status) {
  return rpc::ToGrpc(absl::Status(
      status.code(), absl::StrCat(rpc, " on node '", node, "': ", status.message())));
}

}  // namespace

grpc::Status AgentService::StageNccl(grpc::ServerContext*, const glm::v1::StageNcclRequest* req,
                                     grpc::ServerWriter<glm::v1::Progress>* writer) {
  const std::string library_path = NcclPath(req->library_path());
  if (library_path.empty()) {
    writer->Write(MakeProgress("skip", "nccl: cluster.yaml names no NCCL library; skipped", 0, 0,
                               true));
    shard_.SetNcclLibrary(nullptr);  // TP over Gloo
    return grpc::Status::OK;
  }
  {
    std::lock_guard<std::mutex> lock(served_mu_);
    known_nccl_ = library_path;
  }
  writer->Write(MakeProgress("verify", absl::StrCat("nccl: checking ", library_path)));
  std::unique_ptr<stage::NcclLibrary> library;
  bool copied = false;
  std::string from;
  if (req->expected_hash().empty() && req->source_path().empty()) {
    // Nothing to compare against: the file in place must load and have the expected version.
    absl::StatusOr<std::unique_ptr<stage::NcclLibrary>> loaded =
        stage::NcclLibrary::Load(library_path, req->expected_version());
    if (!loaded.ok()) return StageError("StageNccl", options_.node, loaded.status());
    library = std::move(*loaded);
  } else {
    stage::NcclStageOptions o;
    o.dest_path = library_path;
    o.expected_version = req->expected_version();
    o.expected_hash = req->expected_hash();
    o.source_path = req->source_path();
    std::vector<stage::PeerAddress> peers = ToPeers(req->peers());
    for (const auto& p : peers) from += (from.empty() ? "" : ", ") + p.name;
    if (o.source_path.empty() && !peers.empty() && !o.expected_hash.empty()) {
      auto on_progress = [writer, library_path](const stage::StageProgress& p) {
        std::string line = absl::StrFormat("nccl: fetching %s %s / %s", library_path,
                                           HumanBytes(p.bytes_done), HumanBytes(p.bytes_total));
        if (p.rate_bytes_per_s > 0) {
          absl::StrAppend(&line, ", ", HumanBytes(static_cast<uint64_t>(p.rate_bytes_per_s)), "/s");
        }
        writer->Write(MakeProgress("fetch", line, static_cast<int64_t>(p.bytes_done),
                                   static_cast<int64_t>(p.bytes_total)));
      };
      o.fetch = stage::FetchFromPeers(
          peers,
          cluster::ManifestFile{req->peer_path(), static_cast<uint64_t>(req->peer_size()),
                              o.expected_hash},
          options_.peer_credentials, on_progress, clock_, options_.stage_progress_interval);
    } else if (o.source_path.empty()) {
      o.fetch = [library_path](const std::string&) {
        return absl::NotFoundError(absl::StrCat(
            library_path, " is missing or differs from the pinned build and no peer holds it"));
      };
    }
    absl::StatusOr<stage::NcclStageResult> staged = stage::StageAndLoadNccl(o);
    if (!staged.ok()) return StageError("StageNccl", options_.node, staged.status());
    copied = staged->copied;
    library = std::move(staged->library);
  }
  std::string line = absl::StrCat(
      "nccl: ", library_path, " ",
      copied ? absl::StrCat("staged from ", from.empty() ? "the source" : from, " and verified")
             : std::string("present and verified"),
      ", version ", library ? library->version() : std::string("?"));
  GLM_LOG_INFO("stage-nccl node={} {}", options_.node, line);
  if (library != nullptr) {
    // The verified library stays loaded for the shard's TP all-reduces (ShardTopology::nccl);
    // the table pointer keeps it alive.
    std::shared_ptr<const stage::NcclLibrary> kept = std::move(library);
    shard_.SetNcclLibrary(std::shared_ptr<const nccl::FunctionTable>(kept, &kept->table()));
  }
  writer->Write(MakeProgress("done", line, 0, 0, true));
  return grpc::Status::OK;
}

grpc::Status AgentService::StageWeights(grpc::ServerContext*, const glm::v1::StageWeightsRequest* req,
                                        grpc::ServerWriter<glm::v1::Progress>* writer) {
  const std::string model_dir = options_.model_dir.empty() ? req->model_dir() : options_.model_dir;
  if (model_dir.empty()) {
    return StageError("StageWeights", options_.node,
                      absl::InvalidArgumentError("model_dir is empty; set model.path in cluster.yaml"));
  }
  {
    std::lock_guard<std::mutex> lock(served_mu_);
    staged_root_ = model_dir;
  }
  stage::StageOptions o;
  o.dest_dir = model_dir;
  o.peers = ToPeers(req->peers());
  o.prune = false;  // nodes may share one model directory; never delete another shard's files.
  o.clock = clock_;
  o.credentials = options_.peer_credentials;
  o.progress_interval = options_.stage_progress_interval;
  if (req->manifest_json().empty()) {
    writer->Write(MakeProgress("hash", absl::StrCat("weights: hashing ", model_dir)));
    absl::StatusOr<cluster::Manifest> built = cluster::BuildManifest(model_dir);
    if (!built.ok()) return StageError("StageWeights", options_.node, built.status());
    o.manifest = std::move(*built);
  } else {
    nlohmann::json json = nlohmann::json::parse(req->manifest_json(), nullptr, false);
    if (json.is_discarded()) {
      return StageError("StageWeights", options_.node,
                        absl::InvalidArgumentError("manifest_json is not valid JSON"));
    }
    absl::StatusOr<cluster::Manifest> parsed = cluster::Manifest::FromJson(json);
    if (!parsed.ok()) return StageError("StageWeights", options_.node, parsed.status());
    o.manifest = std::move(*parsed);
  }
  cluster::ShardSpec shard;
  shard.layer_begin = req->layer_begin();
  shard.layer_end = req->layer_end();
  if (shard.layer_end <= 0) {
    shard.layer_begin = 0;
    shard.layer_end = o.manifest.num_hidden_layers > 0 ? o.manifest.num_hidden_layers : 1 << 20;
    shard.first_stage = shard.last_stage = true;
  } else {
    shard.first_stage = req->first_stage();
    shard.last_stage = req->last_stage();
  }
  shard.include_mtp = req->include_mtp();
  o.files = cluster::FilesForShard(o.manifest, shard);
  const uint64_t total = o.manifest.TotalBytes(o.files);
  o.on_progress = [writer](const stage::StageProgress& p) {
    std::string line = absl::StrFormat("weights: %s %s / %s", p.file, HumanBytes(p.bytes_done),
                                       HumanBytes(p.bytes_total));
    if (p.rate_bytes_per_s > 0) {
      absl::StrAppend(&line, absl::StrFormat(", %s/s", HumanBytes(
                                                           static_cast<uint64_t>(p.rate_bytes_per_s))));
    }
    if (p.eta_s >= 0) absl::StrAppend(&line, absl::StrFormat(", ETA %.0fs", p.eta_s));
    writer->Write(MakeProgress("fetch", line, static_cast<int64_t>(p.bytes_done),
                               static_cast<int64_t>(p.bytes_total)));
  };
  writer->Write(MakeProgress(
      "verify",
      absl::StrFormat("weights: verifying %d files (%s) in %s", o.files.size(), HumanBytes(total),
                      model_dir),
      0, static_cast<int64_t>(total)));
  absl::StatusOr<stage::StageReport> report = stage::StageFiles(o);
  if (!report.ok()) return StageError("StageWeights", options_.node, report.status());
  std::string line;
  if (report->fetched.empty()) {
    line = absl::StrFormat("weights: all %d files present and verified (%s)", o.files.size(),
                           HumanBytes(total));
  } else {
    line = absl::StrFormat("weights: %d files verified, %d fetched from peers (%s: %s)",
                           o.files.size(), report->fetched.size(),
                           HumanBytes(report->bytes_fetched), absl::StrJoin(report->fetched, ", "));
  }
  GLM_LOG_INFO("stage-weights node={} {}", options_.node, line);
  writer->Write(MakeProgress("done", line, static_cast<int64_t>(total),
                             static_cast<int64_t>(total), true));
  return grpc::Status::OK;
}

grpc::Status AgentService::LoadShard(grpc::ServerContext*, const glm::v1::LoadShardRequest* req,
                                     grpc::ServerWriter<glm::v1::Progress>* writer) {
  return RunShardOp(writer, [&](auto progress) { return shard_.Load(*req, progress); });
}

std::string AgentService::GidFingerprintNow() const {
  std::optional<preflight::GidCheckInput> input;
  {
    std::lock_guard<std::mutex> lock(gid_mu_);
    input = gid_input_;
  }
  if (!input) return "";  // no RDMA fabric configured for this node
  absl::StatusOr<std::vector<preflight::GidEntry>> table =
      preflight::ReadGidTable(options_.roots, input->hca, input->port);
  if (!table.ok()) {
    GLM_LOG_WARN("gid fingerprint node={}: {}", options_.node,
                 glm::ToStd(table.status().message()));
    return "";
  }
  return preflight::GidTableFingerprint(*std::move(table));
}

grpc::Status AgentService::StartShard(grpc::ServerContext*, const glm::v1::StartShardRequest* req,
                                      grpc::ServerWriter<glm::v1::Progress>* writer) {
  // The table the shard's group forms over (NCCL takes its GID from it), read as it starts.
  const std::string fingerprint = GidFingerprintNow();
  grpc::Status s =
      RunShardOp(writer, [&](auto progress) { return shard_.Start(*req, progress); });
  if (s.ok()) {
    publisher_.Update([&](glm::v1::AgentStatus& st) { st.set_gid_fingerprint(fingerprint); });
  }
  return s;
}

grpc::Status AgentService::DrainShard(grpc::ServerContext*, const glm::v1::DrainShardRequest* req,
                                      grpc::ServerWriter<glm::v1::Progress>* writer) {
  return RunShardOp(writer, [&](auto progress) { return shard_.Drain(*req, progress); });
}

grpc::Status AgentService::StopShard(grpc::ServerContext*, const glm::v1::StopShardRequest* req,
                                     grpc::ServerWriter<glm::v1::Progress>* writer) {
  grpc::Status s = RunShardOp(writer, [&](auto progress) { return shard_.Stop(*req, progress); });
  if (s.ok()) publisher_.Update([](glm::v1::AgentStatus& st) { st.clear_gid_fingerprint(); });
  return s;
}

grpc::Status AgentService::RestartProcess(grpc::ServerContext*,
                                          const glm::v1::RestartProcessRequest* req,
                                          glm::v1::RestartProcessResponse* resp) {
  if (!options_.request_process_restart) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("agent on node '", options_.node,
                                     "' cannot restart its process here (embedded without a "
                                     "supervisor hook); nothing was changed"));
  }
  // Free the shard first: its engine threads and memory go with a clean stop, not an exit.
  absl::Status stopped = shard_.Stop(glm::v1::StopShardRequest(), nullptr);
  if (!stopped.ok() && stopped.code() != absl::StatusCode::kFailedPrecondition) {
    GLM_LOG_WARN("restart process node={}: stopping the shard: {}", options_.node,
                 glm::ToStd(stopped.message()));
  }
  const auto delay = std::chrono::milliseconds(
      std::clamp<int64_t>(req->delay_ms() > 0 ? req->delay_ms() : 200, 0, 10'000));
  GLM_LOG_INFO("restart process node={} instance={}: exiting in {} ms for the supervisor to "
               "start a fresh agent", options_.node, instance_id_, delay.count());
  resp->set_instance_id(instance_id_);
  std::thread([hook = options_.request_process_restart, delay] {
    std::this_thread::sleep_for(delay);
    hook();
  }).detach();
  return grpc::Status::OK;
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

grpc::Status AgentService::Generate(grpc::ServerContext* ctx, const glm::v1::GenerateRequest* req,
                                    grpc::ServerWriter<glm::v1::TokenEvent>* writer) {
  absl::Status s = shard_.Generate(
      *req, [writer](const glm::v1::TokenEvent& e) { return writer->Write(e); },
      [ctx] { return ctx->IsCancelled(); });
  return rpc::ToGrpc(s);
}

grpc::Status AgentService::Logs(grpc::ServerContext* ctx, const glm::v1::LogsRequest* req,
                                grpc::ServerWriter<glm::v1::LogLine>* writer) {
  if (req->tail_lines() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("logs of node '", options_.node, "': tail_lines ",
                                     req->tail_lines(), " is negative; give 0 (the last ",
                                     kDefaultLogTailLines, " lines) or a positive count"));
  }
  const LogRing& ring = options_.log_ring != nullptr ? *options_.log_ring : ProcessLogRing();
  StreamLogRing(
      ring, {.tail_lines = req->tail_lines(), .follow = req->follow()},
      [writer](const LogRing::Line& line, int64_t dropped_before) {
        glm::v1::LogLine out;
        out.set_seq(line.seq);
        out.set_text(line.text);
        out.set_dropped_before(dropped_before);
        return writer->Write(out);
      },
      [&] { return ctx->IsCancelled() || logs_stop_.load(); });
  return grpc::Status::OK;
}

}  // namespace glm::agent
