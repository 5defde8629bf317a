#include "controller/rendezvous/rendezvous_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace glm::rendezvous {
namespace {

absl::Status CheckName(const std::string& what, const std::string& name) {
  if (name.empty() || name.size() > RendezvousStore::kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous ", what, " must be 1..",
                                                   RendezvousStore::kMaxKeyBytes,
                                                   " bytes, got ", name.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RendezvousStore::Put(const std::string& ns, const std::string& key,
                                  std::string value) {
  if (auto s = CheckName("namespace", ns); !s.ok()) return s;
  if (auto s = CheckName("key", key); !s.ok()) return s;
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous value for ", ns, "/", key, " is ",
                                                   value.size(), " bytes; the limit is ",
                                                   kMaxValueBytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto space_it = data_.find(ns);
    const bool new_space = space_it == data_.end();
    size_t replaced = 0;  // bytes of the entry this Put overwrites
    if (!new_space) {
      auto kt = space_it->second.find(key);
      if (kt != space_it->second.end()) replaced = key.size() + kt->second.size();
      if (space_it->second.size() >= kMaxKeysPerNamespace && kt == space_it->second.end()) {
        return absl::ResourceExhaustedError(absl::StrCat("rendezvous namespace '", ns, "' has ",
                                                         space_it->second.size(),
                                                         " keys (the limit)"));
      }
    }
    const size_t added = (new_space ? ns.size() : 0) + key.size() + value.size();
    if (total_bytes_ - replaced + added > kMaxTotalBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rendezvous store is full: ", total_bytes_, " bytes held, the limit is ",
          kMaxTotalBytes, "; ", ns, "/", key, " (", added,
          " bytes) was not stored. Fix: the shard groups delete their namespace once formed; "
          "restart glm-controller if a client keeps filling it"));
    }
    total_bytes_ = total_bytes_ - replaced + added;
    data_[ns][key] = std::move(value);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& ns, const std::string& key,
                                                 std::chrono::milliseconds wait) {
  if (auto s = CheckName("namespace", ns); !s.ok()) return s;
  if (auto s = CheckName("key", key); !s.ok()) return s;
  wait = std::clamp(wait, std::chrono::milliseconds(0), kMaxWait);
  std::unique_lock<std::mutex> lock(mu_);
  const std::string* found = nullptr;
  auto lookup = [&] {
    auto it = data_.find(ns);
    if (it == data_.end()) return false;
    auto kt = it->second.find(key);
    if (kt == it->second.end()) return false;
    found = &kt->second;
    return true;
  };
  cv_.wait_for(lock, wait, [&] { return shutdown_ || lookup(); });
  if (found) return *found;
  if (shutdown_) return absl::CancelledError("the controller is shutting down");
  return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", key, "' in namespace '", ns,
                                                  "' was not published within ", wait.count(),
                                                  " ms: a peer of the group has not started"));
}

int RendezvousStore::Delete(const std::string& ns) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(ns);
  if (it == data_.end()) return 0;
  int n = static_cast<int>(it->second.size());
  size_t bytes = ns.size();
  for (const auto& [key, value] : it->second) bytes += key.size() + value.size();
  total_bytes_ -= bytes;
  data_.erase(it);
  return n;
}

void RendezvousStore::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

}  // namespace glm::rendezvous
