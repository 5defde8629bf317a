// Watches the resolved GID entry after bring-up. On Spark clusters the right index drifts after
// reboots and link events (MiaAI-Lab/...#10, #11, #16); a change under a running NCCL
// communicator breaks the next QP setup, so the agent reports it as a Degraded event naming the
// old and new entries. Driven by a periodic re-read (injected clock) and, when available,
// netlink address/link events that force an early re-read.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "agent/preflight/gid.h"
#include "common/clock.h"

namespace glm::preflight {

struct GidChangeEvent {
  std::string node;
  std::optional<GidEntry> old_entry;  // nullopt: nothing was resolved before.
  std::optional<GidEntry> new_entry;  // nullopt: the right entry disappeared.
  std::string message;                // "gid.index changed on node n1: <old> → <new>; fix ..."
};

// Thread-safe: Poll may be called from a timer thread while current() is read elsewhere.
// The callback runs on the thread that calls Poll, without the watcher's lock held.
class GidWatcher {
 public:
  struct Options {
    SystemRoots roots;
    GidCheckInput input;
    Clock::Duration interval = std::chrono::seconds(10);
  };
  using Callback = std::function<void(const GidChangeEvent&)>;

  GidWatcher(Options options, Clock* clock, Callback on_change);

  // Re-reads the GID table when `interval` has passed since the last read, or now when `force`.
  // The first call only records the baseline. Returns true when it re-read.
  bool Poll(bool force = false);

  std::optional<GidEntry> current() const;

 private:
  Options options_;
  Clock* clock_;
  Callback on_change_;
  mutable std::mutex mu_;
  bool have_baseline_ = false;
  Clock::TimePoint last_read_{};
  std::optional<GidEntry> current_;
};

// A NETLINK_ROUTE socket subscribed to link and IPv4/IPv6 address changes. Non-blocking.
class NetlinkAddressMonitor {
 public:
  NetlinkAddressMonitor() = default;
  ~NetlinkAddressMonitor();
  NetlinkAddressMonitor(const NetlinkAddressMonitor&) = delete;
  NetlinkAddressMonitor& operator=(const NetlinkAddressMonitor&) = delete;

  absl::Status Open();
  // Waits up to `timeout_ms` for events; drains them. True when at least one arrived.
  bool WaitForEvents(int timeout_ms);
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Runs `watcher` until `stop` becomes true: waits on netlink (when open) up to 1 s at a time and
// calls Poll(force = an event arrived). For the agent's background thread.
void RunGidWatchLoop(GidWatcher* watcher, NetlinkAddressMonitor* netlink, const std::atomic<bool>* stop);

}  // namespace glm::preflight
