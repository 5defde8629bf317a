// The controller's key-value rendezvous for shard groups (the role torch's TCPStore plays): ranks
// Put their addresses under a namespace (one per group and epoch) and Get their peers', waiting
// until they appear. In memory; a controller restart restarts the groups anyway (new epoch).
// Thread-safe. Waits use the injected clock's notion of "now" only for the deadline arithmetic
// and block on a condition variable (woken by Put, Delete, or Shutdown).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace glm::rendezvous {

class RendezvousStore {
 public:
  // Limits that keep a misbehaving client from exhausting controller memory.
  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = 64 * 1024;
  static constexpr size_t kMaxKeysPerNamespace = 4096;
  static constexpr std::chrono::milliseconds kMaxWait = std::chrono::minutes(10);
  // Namespaces, keys and values together (a group's addresses are a few hundred bytes; many
  // epochs of many groups fit), so that Puts into ever new namespaces cannot exhaust memory.
  static constexpr size_t kMaxTotalBytes = size_t{64} << 20;

  // Overwrites an existing key. INVALID_ARGUMENT for empty/oversized names or values,
  // RESOURCE_EXHAUSTED when the namespace or the whole store is full.
  absl::Status Put(const std::string& ns, const std::string& key, std::string value);

  // Returns the value, waiting up to `wait` (capped at kMaxWait) for it to be Put.
  // DEADLINE_EXCEEDED naming the namespace and key when it is not; CANCELLED after Shutdown.
  absl::StatusOr<std::string> Get(const std::string& ns, const std::string& key,
                                  std::chrono::milliseconds wait);

  // Drops a namespace; returns how many keys it had.
  int Delete(const std::string& ns);

  // Wakes every waiter with CANCELLED (controller shutdown).
  void Shutdown();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool shutdown_ = false;
  std::map<std::string, std::map<std::string, std::string>> data_;
  size_t total_bytes_ = 0;  // of data_: namespace names, keys and values
};

}  // namespace glm::rendezvous
