// glm.v1.Agent served by glm-agent: identity, preflight, status stream; shard RPCs delegate to
// ShardHost (Load/Start/Drain/Stop, and Generate on the head shard, whose client cancel aborts
// the request); StageNccl/StageWeights run agent/stage (fetching from peers' FetchFile with the
// node's client credentials); FetchFile serves this node's stage root and NCCL library to peers.
// There is deliberately no RPC that runs an arbitrary command on the node.
// Thread-safe (gRPC calls handlers from its thread pool).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/preflight/gid_watcher.h"
#include "agent/preflight/sysfs.h"

#include "agent/service/host_facts.h"
#include "agent/service/status_publisher.h"
#include "agent/shard/shard_host.h"
#include "agent/stage/stage_server.h"
#include "common/clock.h"
#include "common/log_ring.h"
#include "glm/v1/agent.grpc.pb.h"

namespace glm::agent {

struct AgentServiceOptions {
  std::string node;                       // --node
  std::string version;                    // build version
  bool insecure = false;  // serves plaintext gRPC beyond loopback (--insecure): Info reports it
  std::chrono::milliseconds heartbeat{1000};  // default WatchStatus heartbeat interval
  HostProbePaths probe_paths;
  // This node runs the CPU backend: a missing GPU is a warning even when the controller asks for
  // one (--allow-no-gpu; CPU-only test nodes of a non-local cluster).
  bool allow_no_gpu = false;
  // Extra preflight checks (RDMA, GID, MTU, memlock, NCCL from agent/preflight), appended after
  // the host checks. Null: host checks only.
  std::function<std::vector<glm::v1::Check>(const glm::v1::PreflightRequest&)> extra_checks;
  // Where agent/preflight reads the kernel (--sysfs-root/--proc-root/--dev-root; fixture trees
  // in tests).
  preflight::SystemRoots roots;
  // GID watcher: re-read period of the GID table after a preflight resolved an entry
  // (--gid-watch-ms); netlink address/link events force an early re-read when `gid_netlink`.
  Clock::Duration gid_watch_interval = std::chrono::seconds(10);
  bool gid_netlink = true;
  // Fabric services main started (reported by Info so the controller can tell peers).
  std::string fabric_ip;
  int mtu_echo_port = 0;
  int stage_port = 0;
  // When set, Info reports this instead of stage_port (the port is bound after the service is
  // built).
  std::function<int()> stage_port_fn;
  // --model-dir: this node's model directory; StageWeights stages into it instead of the
  // request's model_dir (model.path). Empty: the request's.
  std::string model_dir;
  // The engine shard host (LoadShard/StopShard). The service fills in node, clock, model_dir and
  // on_status (the shard's status goes into AgentStatus.shard); proc_root defaults to
  // probe_paths.proc_root when left at "/proc". Tests inject kernel cache ops and turn the tick
  // thread off.
  ShardHostOptions shard;
  // What FetchFile serves to peers: --stage-root; empty: model_dir; empty too: the model dir of
  // the last StageWeights request (the directory this node staged into).
  std::string stage_root;
  // --nccl-library: this node's NCCL library path instead of cluster.yaml's nccl.library (nodes
  // that install it elsewhere). Empty: the requests' path.
  std::string nccl_library;
  // Client credentials for fetching from peers (the node's cluster certificate under mTLS);
  // null = insecure.
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;
  // At most one byte-progress message per interval per staging stream (plus the final one).
  Clock::Duration stage_progress_interval = std::chrono::milliseconds(250);
  // What Logs serves; null: ProcessLogRing() (the lines this process logged).
  const LogRing* log_ring = nullptr;
  // RestartProcess ends the process through this (main: exit status 75 so that systemd's
  // Restart=on-failure or the local launcher starts a fresh agent). Null: RestartProcess is
  // refused (FAILED_PRECONDITION).
  std::function<void()> request_process_restart;
};

class AgentService final : public glm::v1::Agent::Service {
 public:
  AgentService(AgentServiceOptions options, Clock* clock);

  ~AgentService() override;

  // Ends open WatchStatus streams and the GID watch thread (call before grpc::Server::Shutdown).
  void Shutdown();

  // Starts the background GID watch thread (the daemon; tests call PollGidWatch instead).
  void StartGidWatchThread();
  // Re-reads the GID table when the interval passed (or now when `force`); publishes a change
  // of the resolved entry as degraded. No-op until a preflight resolved an entry. Returns true
  // when it re-read.
  bool PollGidWatch(bool force);
  StatusPublisher& publisher() { return publisher_; }
  const std::string& instance_id() const { return instance_id_; }

  grpc::Status Info(grpc::ServerContext* ctx, const glm::v1::InfoRequest* req,
                    glm::v1::InfoResponse* resp) override;
  grpc::Status Preflight(grpc::ServerContext* ctx, const glm::v1::PreflightRequest* req,
                         glm::v1::PreflightResponse* resp) override;
  grpc::Status StageNccl(grpc::ServerContext* ctx, const glm::v1::StageNcclRequest* req,
                         grpc::ServerWriter<glm::v1::Progress>* writer) override;
  grpc::Status StageWeights(grpc::ServerContext* ctx, const glm::v1::StageWeightsRequest* req,
                            grpc::ServerWriter<glm::v1::Progress>* writer) override;
  grpc::Status LoadShard(grpc::ServerContext* ctx, const glm::v1::LoadShardRequest* req,
                         grpc::ServerWriter<glm::v1::Progress>* writer) override;
  grpc::Status StartShard(grpc::ServerContext* ctx, const glm::v1::StartShardRequest* req,
                          grpc::ServerWriter<glm::v1::Progress>* writer) override;
  grpc::Status DrainShard(grpc::ServerContext* ctx, const glm::v1::DrainShardRequest* req,
                          grpc::ServerWriter<glm::v1::Progress>* writer) override;
  grpc::Status StopShard(grpc::ServerContext* ctx, const glm::v1::StopShardRequest* req,
                         grpc::ServerWriter<glm::v1::Progress>* writer) override;
  grpc::Status RestartProcess(grpc::ServerContext* ctx, const glm::v1::RestartProcessRequest* req,
                              glm::v1::RestartProcessResponse* resp) override;
  grpc::Status WatchStatus(grpc::ServerContext* ctx, const glm::v1::WatchStatusRequest* req,
                           grpc::ServerWriter<glm::v1::AgentStatus>* writer) override;
  grpc::Status Generate(grpc::ServerContext* ctx, const glm::v1::GenerateRequest* req,
                        grpc::ServerWriter<glm::v1::TokenEvent>* writer) override;
  grpc::Status FetchFile(grpc::ServerContext* ctx, const glm::v1::FetchFileRequest* req,
                         grpc::ServerWriter<glm::v1::FileChunk>* writer) override;
  // The last lines of this process's log ring, then (follow) new ones until the client cancels
  // or Shutdown(). Serves the ring only: no file, no command.
  grpc::Status Logs(grpc::ServerContext* ctx, const glm::v1::LogsRequest* req,
                    grpc::ServerWriter<glm::v1::LogLine>* writer) override;
  uint64_t bytes_served() const { return files_.bytes_served(); }

 private:
  const AgentServiceOptions options_;
  Clock* const clock_;
  const std::string instance_id_;
  const Clock::TimePoint start_;
  const int64_t start_unix_ms_;
  StatusPublisher publisher_;
  ShardHost shard_;

  // The NCCL library path on this node for a request's path (--nccl-library wins).
  std::string NcclPath(const std::string& requested) const;
  std::string ServedRoot() const;
  std::string ServedNccl() const;
  mutable std::mutex served_mu_;
  std::string staged_root_;   // model dir of the last StageWeights
  std::string known_nccl_;    // NCCL library path of the last Preflight/StageNccl
  stage::FileServer files_;

  // GID watch: armed by a preflight that resolved an entry (the entry bring-up validated).
  void ArmGidWatch(const preflight::GidCheckInput& input, const preflight::GidEntry& validated);
  void OnGidChange(const preflight::GidChangeEvent& event);
  // AgentStatus.gid_fingerprint of the GID table of the HCA port the last preflight checked
  // (preflight::GidTableFingerprint), read now; "" without RDMA or when it cannot be read (logged).
  std::string GidFingerprintNow() const;
  mutable std::mutex gid_mu_;
  std::shared_ptr<preflight::GidWatcher> gid_watcher_;
  std::optional<preflight::GidEntry> gid_validated_;
  std::optional<preflight::GidCheckInput> gid_input_;  // the last preflight's RDMA port, if any
  std::atomic<bool> gid_stop_{false};
  std::thread gid_thread_;
  std::atomic<bool> logs_stop_{false};  // ends following Logs streams (Shutdown)
};

// A random 16-hex-digit id.
std::string NewInstanceId();

// The shard host's options: options.shard with the service's node, clock, model dir and a status
// callback that publishes AgentStatus.shard (and shard_state, last_error) through `publisher`.
ShardHostOptions ShardOptions(const AgentServiceOptions& options, Clock* clock,
                              StatusPublisher* publisher);

}  // namespace glm::agent
