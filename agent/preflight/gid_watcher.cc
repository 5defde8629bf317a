#include "agent/preflight/gid_watcher.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace glm::preflight {

GidWatcher::GidWatcher(Options options, Clock* clock, Callback on_change)
    : options_(std::move(options)), clock_(clock), on_change_(std::move(on_change)) {}

bool GidWatcher::Poll(bool force) {
  std::optional<GidChangeEvent> event;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Clock::TimePoint now = clock_->Now();
    if (have_baseline_ && !force && now - last_read_ < options_.interval) return false;
    last_read_ = now;
    std::optional<GidEntry> resolved;
    absl::StatusOr<std::vector<GidEntry>> table =
        ReadGidTable(options_.roots, options_.input.hca, options_.input.port);
    if (table.ok()) {
      if (options_.input.gid_index.has_value()) {
        // A fixed index: watch that index, and whether it still is the right entry.
        std::optional<GidEntry> right =
            ResolveGidIndex(*table, options_.input.fabric_ip, options_.input.netdev);
        if (right.has_value() && right->index == *options_.input.gid_index) resolved = right;
      } else {
        resolved = ResolveGidIndex(*table, options_.input.fabric_ip, options_.input.netdev);
      }
    }
    if (!have_baseline_) {
      have_baseline_ = true;
      current_ = resolved;
      return true;
    }
    if (resolved != current_) {
      GidChangeEvent e;
      e.node = options_.input.node;
      e.old_entry = current_;
      e.new_entry = resolved;
      e.message = absl::StrCat(
          "gid.index changed on node ", e.node, ": ",
          current_.has_value() ? current_->Describe() : std::string("(none)"), " → ",
          resolved.has_value() ? resolved->Describe()
                               : absl::StrCat("(no RoCE v2 entry with ", options_.input.fabric_ip,
                                              " on ", options_.input.netdev, ")"),
          "; NCCL connections set up from now on need the new index: restart the shard group");
      current_ = resolved;
      event = std::move(e);
    }
  }
  if (event.has_value() && on_change_) on_change_(*event);
  return true;
}

std::optional<GidEntry> GidWatcher::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

NetlinkAddressMonitor::~NetlinkAddressMonitor() {
  if (fd_ >= 0) close(fd_);
}

absl::Status NetlinkAddressMonitor::Open() {
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("netlink socket: ", std::strerror(errno)));
  sockaddr_nl addr{};
  addr.nl_family = AF_NETLINK;
  addr.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("netlink bind: ", std::strerror(err)));
  }
  fd_ = fd;
  return absl::OkStatus();
}

bool NetlinkAddressMonitor::WaitForEvents(int timeout_ms) {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  bool any = false;
  char buf[8192];
  while (recv(fd_, buf, sizeof(buf), 0) > 0) any = true;
  return any;
}

void RunGidWatchLoop(GidWatcher* watcher, NetlinkAddressMonitor* netlink,
                     const std::atomic<bool>* stop) {
  while (!stop->load()) {
    bool event = false;
    if (netlink != nullptr && netlink->fd() >= 0) {
      event = netlink->WaitForEvents(1000);
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    watcher->Poll(event);
  }
}

}  // namespace glm::preflight
