#include "engine/dist/in_process_rendezvous.h"

#include "absl/strings/str_cat.h"

namespace glm::engine {

absl::Status InProcessRendezvous::Put(const std::string& key, std::string value) {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous Put: empty key");
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = std::move(value);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessRendezvous::Get(const std::string& key,
                                                     std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, wait, [&] { return data_.count(key) > 0; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous key '", key, "' was not published within ", wait.count(),
                     " ms; the rank that publishes it did not start or failed earlier"));
  }
  return data_.at(key);
}

}  // namespace glm::engine
