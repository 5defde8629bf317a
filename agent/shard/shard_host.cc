#include "agent/shard/shard_host.h"

#include "absl/strings/str_cat.h"

namespace glm::agent {

glm::v1::ShardState ShardHost::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

absl::Status ShardHost::NotYet(const char* operation) const {
  return absl::UnimplementedError(absl::StrCat(
      operation, " on node '", node_,
      "': this glm-agent does not host engine shards yet (the engine runtime is not linked in); "
      "nothing was changed. Bring-up stops after planning until the engine milestone lands."));
}

absl::Status ShardHost::Load(const glm::v1::LoadShardRequest&, const ProgressFn&) {
  return NotYet("LoadShard");
}
absl::Status ShardHost::Start(const glm::v1::StartShardRequest&, const ProgressFn&) {
  return NotYet("StartShard");
}
absl::Status ShardHost::Drain(const glm::v1::DrainShardRequest&, const ProgressFn&) {
  return NotYet("DrainShard");
}
absl::Status ShardHost::Stop(const glm::v1::StopShardRequest&, const ProgressFn&) {
  return NotYet("StopShard");
}

}  // namespace glm::agent
