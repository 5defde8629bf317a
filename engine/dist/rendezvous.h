// How the ranks of a group find each other before a Communicator exists: a key-value store all
// ranks reach (the controller's rendezvous service in production, InProcessRendezvous in tests).
// Keys are scoped by the caller (one prefix per group and epoch), so a restarted group never
// reads a stale address.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glm::engine {

// Implementations are thread-safe.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Stores `value` (bytes) under `key`, overwriting.
  virtual absl::Status Put(const std::string& key, std::string value) = 0;
  // Returns the value, waiting up to `wait` for it to be Put; DEADLINE_EXCEEDED naming the key
  // when it is not.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          std::chrono::milliseconds wait) = 0;
};

}  // namespace glm::engine
