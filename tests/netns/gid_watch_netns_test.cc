// The GID watcher wakes on real netlink address events, not on its timer: the watch loop runs in
// a network namespace the test creates (a veth pair inside it), with a 1-hour re-read period over
// a fixture sysfs tree. The tree changes first and nothing is reported for more than one loop
// period; then an IPv4 address is added to the veth (RTM_NEWADDR) and the change is reported at
// once; the address is removed (RTM_DELADDR) after the tree changes back and that is reported too.
// Skips with the reason when not root or `ip netns` is unavailable.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/preflight/gid_watcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::preflight {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

class GidWatchNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (Sh("command -v ip") != 0) GTEST_SKIP() << "no `ip` command (iproute2)";
    std::string id = std::to_string(getpid());
    ns_ = "glm_gidw_" + id;
    veth_ = "ggw" + id;
    if (Sh("ip netns add " + ns_) != 0) GTEST_SKIP() << "`ip netns add` failed (no CAP_SYS_ADMIN?)";
    created_ = true;
    // The veth exists before the monitor opens and stays down with IPv6 off, so no late event
    // (carrier, IPv6 link-local after DAD) arrives: the only events are the test's.
    Sh("ip netns exec " + ns_ + " sysctl -w net.ipv6.conf.all.disable_ipv6=1 "
       "net.ipv6.conf.default.disable_ipv6=1");
    ASSERT_EQ(Sh("ip -n " + ns_ + " link add " + veth_ + " type veth peer name " + veth_ + "p"), 0);

    root_ = fs::temp_directory_path() / ("glm_gidw_" + id);
    fs::remove_all(root_);
    fs::copy(fs::path(GLM_PREFLIGHT_FIXTURES) / "healthy", root_, fs::copy_options::recursive);
    port_ = root_ / "sys/class/infiniband/rocep1s0f0/ports/1";
  }
  void TearDown() override {
    if (loop_.joinable()) {
      stop_ = true;
      loop_.join();
    }
    if (created_) Sh("ip netns del " + ns_);
    if (!root_.empty()) fs::remove_all(root_);
  }
  void Write(const fs::path& p, const std::string& s) { std::ofstream(p) << s << "\n"; }

  // The fabric address moves from GID index 3 to 5 (what a re-plumbed link does).
  void MoveGidTo5() {
    Write(port_ / "gids/3", "0000:0000:0000:0000:0000:ffff:a9fe:0c07");
    Write(port_ / "gids/5", "0000:0000:0000:0000:0000:ffff:c0a8:6401");
    Write(port_ / "gid_attrs/types/5", "RoCE v2");
    Write(port_ / "gid_attrs/ndevs/5", "enp1s0f0np0");
  }
  void MoveGidBackTo3() {
    Write(port_ / "gids/3", "0000:0000:0000:0000:0000:ffff:c0a8:6401");
    Write(port_ / "gids/5", "0000:0000:0000:0000:0000:0000:0000:0000");
  }

  // Starts RunGidWatchLoop on a thread inside the namespace; returns once its netlink socket is
  // subscribed there.
  void StartLoop(GidWatcher* watcher) {
    std::promise<absl::Status> opened;
    auto ready = opened.get_future();
    loop_ = std::thread([this, watcher, &opened] {
      int fd = open(("/var/run/netns/" + ns_).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        if (fd >= 0) close(fd);
        opened.set_value(absl::InternalError("setns into the test namespace failed"));
        return;
      }
      close(fd);
      NetlinkAddressMonitor monitor;  // Opened in this thread's namespace.
      absl::Status s = monitor.Open();
      opened.set_value(s);
      if (!s.ok()) return;
      RunGidWatchLoop(watcher, &monitor, &stop_);
    });
    absl::Status s = ready.get();
    ASSERT_TRUE(s.ok()) << s;
  }

  std::string ns_, veth_;
  bool created_ = false;
  fs::path root_, port_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GidChangeEvent> events_;
  std::unique_ptr<GidWatcher> watcher_;
  std::atomic<bool> stop_{false};
  std::thread loop_;
};

TEST_F(GidWatchNetnsTest, AddressEventsWakeTheWatcherNotTheTimer) {
  std::mutex& mu = mu_;
  std::condition_variable& cv = cv_;
  std::vector<GidChangeEvent>& events = events_;
  GidWatcher::Options o;
  o.roots = SystemRoots{(root_ / "sys").string(), (root_ / "proc").string(), (root_ / "dev").string()};
  o.input = GidCheckInput{"spark1", "rocep1s0f0", 1, std::nullopt, "192.168.100.1", "enp1s0f0np0"};
  o.interval = std::chrono::hours(1);
  // A member, so the loop thread (stopped in TearDown) never outlives it.
  watcher_ = std::make_unique<GidWatcher>(o, Clock::Real(), [this](const GidChangeEvent& e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  });
  GidWatcher& watcher = *watcher_;
  ASSERT_TRUE(watcher.Poll());  // Baseline.
  ASSERT_TRUE(watcher.current().has_value());
  ASSERT_EQ(watcher.current()->index, 3);
  StartLoop(&watcher);
  ASSERT_FALSE(HasFatalFailure());

  auto wait_for_events = [&](size_t n, milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return events.size() >= n; });
  };

  // The tree changes with no netlink event: the loop wakes every second but the 1-hour period
  // has not passed, so nothing is re-read. More than one loop period, to show it ran.
  MoveGidTo5();
  EXPECT_FALSE(wait_for_events(1, milliseconds(1500))) << "re-read without an event";
  EXPECT_EQ(watcher.current()->index, 3);

  // RTM_NEWADDR in the namespace: re-read at once.
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(Sh("ip -n " + ns_ + " addr add 10.233.0.1/24 dev " + veth_), 0);
  ASSERT_TRUE(wait_for_events(1, seconds(5))) << "no re-read within 5 s of the address event";
  auto added = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_TRUE(events[0].old_entry.has_value() && events[0].new_entry.has_value());
    EXPECT_EQ(events[0].old_entry->index, 3);
    EXPECT_EQ(events[0].new_entry->index, 5);
    EXPECT_THAT(events[0].message, HasSubstr("gid.index changed on node spark1"));
  }

  // RTM_DELADDR after the tree changes back.
  MoveGidBackTo3();
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(Sh("ip -n " + ns_ + " addr del 10.233.0.1/24 dev " + veth_), 0);
  ASSERT_TRUE(wait_for_events(2, seconds(5))) << "no re-read within 5 s of the address removal";
  auto removed = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(events[1].new_entry->index, 3);
  }
  std::cout << "[ measure ] netlink address add -> GID re-read: " << added.count()
            << " ms, remove -> re-read: " << removed.count() << " ms (re-read period 1 h)\n";
}

}  // namespace
}  // namespace glm::preflight
