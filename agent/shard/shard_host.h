// Hosts this node's engine shard in-process (DESIGN.md §1). Lifecycle:
//   None/Stopped/Failed --Load--> Loading --> Loaded (or Failed, with last_error)
//   Loaded --Stop--> Stopped (model and KV cache freed)
//   Running/Draining: not reached yet (Start/Drain answer UNIMPLEMENTED: serving is missing).
//
// Load reads this node's PP stage from the staged model directory: decoder layers
// first_layer..last_layer, the embedding when the stage is first (or holds the MTP layer), the
// final norm and lm_head (and the MTP layer when asked) when it is last. Weights come from
// engine/weights (mmap'd safetensors) through ReleasingWeights into engine/model
// (CreateGlmMoeDsa) on the CPU backend; each tensor's range is dropped from the page cache once
// loaded, and the cluster's page-cache policy (off/periodic/adaptive) runs while loading
// (agent/pagecache). The KV cache gets the plan's per-node bytes.
//
// Tensor parallelism: the engine has no TP sharding yet. With tp_size > 1 every TP rank loads its
// stage's full layers; ShardStatus.tp_replicated says so (and the load's last progress line).
//
// Load of the shard already loaded with an identical request is a no-op; any other request on a
// loaded shard fails (FAILED_PRECONDITION: Stop first). Errors name the node, the file/tensor and
// the fix, and leave the shard Failed with last_error.
//
// Thread-safe: one Load/Stop at a time (a concurrent one fails with FAILED_PRECONDITION);
// status() and state() may be called any time, also while a load runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "agent/pagecache/page_cache_manager.h"
#include "common/clock.h"
#include "engine/dist/nccl_table.h"
#include "engine/engine.h"
#include "glm/v1/agent.pb.h"
#include "grpcpp/security/credentials.h"

namespace glm::engine {
class Backend;
class Model;
}  // namespace glm::engine

namespace glm::agent {

struct ShardHostOptions {
  std::string node;
  Clock* clock = Clock::Real();
  // <proc_root>/meminfo (memory check, adaptive policy) and <proc_root>/sys/vm/drop_caches.
  std::string proc_root = "/proc";
  // The page-cache policy's kernel operations; null = the real ones (sync(2), drop_caches under
  // proc_root). Called once per load.
  std::function<std::unique_ptr<pagecache::KernelCacheOps>()> make_kernel_ops;
  // The policy is evaluated every tick_interval while a load runs: by the load loop whenever
  // `clock` moved that far since the last tick, and (tick_thread) by a thread on a real timer, so
  // a load stuck inside one read still gets its stall drop. Tests turn the thread off and move a
  // FakeClock from on_tensor.
  Clock::Duration tick_interval = std::chrono::seconds(1);
  bool tick_thread = true;
  // Adaptive policy: a load with no progress for this long counts as stalled.
  Clock::Duration stall_timeout = std::chrono::seconds(20);
  int num_threads = 0;  // CPU backend threads; 0 = hardware concurrency
  // Head of a PP replica: micro-batches in flight (EngineOptions::max_steps_in_flight) when the
  // LoadShardRequest leaves it 0; 0 = the replica's pp_size, 1 = one step at a time.
  int max_steps_in_flight = 0;
  // Numeric IP this node binds for its shard group's connections (its fabric IP, else the
  // agent's listen IP; 127.0.0.1 on local clusters).
  std::string group_host = "127.0.0.1";
  // Client credentials for the controller's rendezvous (the node's certificate under mTLS);
  // null = insecure.
  std::shared_ptr<grpc::ChannelCredentials> rendezvous_credentials;
  // How often the running engine's stats are copied into the status (and published).
  std::chrono::milliseconds monitor_interval{500};
  // --model-dir: load from here instead of the request's model_dir (nodes keep their own copy).
  std::string model_dir;
  // Runs after each tensor is read (tests).
  std::function<void(const std::string& tensor)> on_tensor;
  // Called with the new status whenever it changes (state, progress, page-cache actions); the
  // agent publishes it. From the thread doing the work; must not call back into the host.
  std::function<void(const glm::v1::ShardStatus&)> on_status;
};

class ShardHost {
 public:
  // Receives progress lines while an operation runs (the gRPC layer streams them).
  using ProgressFn = std::function<void(const glm::v1::Progress&)>;

  explicit ShardHost(ShardHostOptions options);
  // Node name only: the real clock, /proc, the real kernel operations.
  explicit ShardHost(std::string node);
  ~ShardHost();

  glm::v1::ShardState state() const;
  glm::v1::ShardStatus status() const;

  absl::Status Load(const glm::v1::LoadShardRequest& req, const ProgressFn& progress);
  absl::Status Start(const glm::v1::StartShardRequest& req, const ProgressFn& progress);
  absl::Status Drain(const glm::v1::DrainShardRequest& req, const ProgressFn& progress);
  absl::Status Stop(const glm::v1::StopShardRequest& req, const ProgressFn& progress);

  // One request on the head shard: calls `write` for every event (token ids, with their logprobs
  // when req.return_logprobs; the last one finished) until the stream ends, `write` returns
  // false (the client went away) or `cancelled` returns true; both abort the request.
  // FAILED_PRECONDITION when this shard is not a Running head; INVALID_ARGUMENT naming the field
  // for a bad request (top_logprobs outside [0, 20], ...); an engine failure returns its error
  // (naming the failing rank).
  absl::Status Generate(const glm::v1::GenerateRequest& req,
                        const std::function<bool(const glm::v1::TokenEvent&)>& write,
                        const std::function<bool()>& cancelled);

  // The NCCL library the agent loaded and verified (StageNccl), for the TP all-reduces of the
  // engines started from now on (ShardTopology::nccl: NCCL when every rank of the stage has it
  // and a GPU of its own, engine/pipeline/tp_transport.h). The pointer keeps the library loaded;
  // a running engine keeps the one it started with. Null = none (TP over Gloo). Any thread.
  void SetNcclLibrary(std::shared_ptr<const nccl::FunctionTable> table);

  // The loaded model before Start (null otherwise, and always for a distributed replica's rank).
  // Owned by the host; valid until Start or Stop.
  engine::Model* model() const;

 private:
  struct Loaded;
  void Monitor();
  void StopMonitor();
  absl::Status DoLoad(const glm::v1::LoadShardRequest& req, const ProgressFn& progress);
  absl::Status Fail(const absl::Status& status);
  void Publish();
  void UpdatePageCache(const pagecache::PageCacheManager& pages);

  const ShardHostOptions options_;
  mutable std::mutex mu_;
  bool busy_ = false;                        // a Load or Stop is running
  glm::v1::ShardStatus status_;              // guarded by mu_
  glm::v1::LoadShardRequest loaded_request_; // the request of the loaded shard
  std::unique_ptr<Loaded> loaded_;           // model + backend while Loaded
  engine::EngineOptions engine_options_;     // prepared by Load
  // The running engine; Generate holds a reference while its request runs.
  std::shared_ptr<engine::Engine> engine_;
  std::shared_ptr<const nccl::FunctionTable> nccl_;  // guarded by mu_; SetNcclLibrary
  std::thread monitor_;
  bool monitor_stop_ = false;                // guarded by mu_
  std::condition_variable monitor_cv_;
};

}  // namespace glm::agent
