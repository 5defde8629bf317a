// A Rendezvous in one process's memory, for ranks running as threads (tests, single-node runs).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "engine/dist/rendezvous.h"

namespace glm::engine {

// Thread-safe. Get blocks on a condition variable until Put or the wait runs out.
class InProcessRendezvous : public Rendezvous {
 public:
  absl::Status Put(const std::string& key, std::string value) override;
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds wait) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace glm::engine
