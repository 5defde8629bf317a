// Hosts this node's engine shard in-process (DESIGN.md §1). The lifecycle is
// None -> Loading -> Loaded -> Running -> Draining -> Stopped (Failed from anywhere).
//
// The engine runtime is not wired in yet: Load/Start/Drain/Stop return UNIMPLEMENTED naming the
// milestone, and the state stays None. The agent service already routes the shard RPCs here, so
// the engine issue replaces these bodies without touching the gRPC layer.
// Thread-safe.
#pragma once

#include <functional>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "glm/v1/agent.pb.h"

namespace glm::agent {

class ShardHost {
 public:
  // Receives progress lines while an operation runs (the gRPC layer streams them).
  using ProgressFn = std::function<void(const glm::v1::Progress&)>;

  explicit ShardHost(std::string node) : node_(std::move(node)) {}

  glm::v1::ShardState state() const;

  absl::Status Load(const glm::v1::LoadShardRequest& req, const ProgressFn& progress);
  absl::Status Start(const glm::v1::StartShardRequest& req, const ProgressFn& progress);
  absl::Status Drain(const glm::v1::DrainShardRequest& req, const ProgressFn& progress);
  absl::Status Stop(const glm::v1::StopShardRequest& req, const ProgressFn& progress);

 private:
  absl::Status NotYet(const char* operation) const;

  const std::string node_;
  mutable std::mutex mu_;
  glm::v1::ShardState state_ = glm::v1::SHARD_STATE_NONE;
};

}  // namespace glm::agent
