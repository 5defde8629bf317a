#include "agent/preflight/gid_watcher.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::preflight {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class GidWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) / ("gid_watch_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::copy(fs::path(GLM_PREFLIGHT_FIXTURES) / "healthy", root_, fs::copy_options::recursive);
    port_ = root_ / "sys/class/infiniband/rocep1s0f0/ports/1";
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const fs::path& p, const std::string& s) { std::ofstream(p) << s << "\n"; }

  GidWatcher::Options Opts(std::optional<int> index) {
    GidWatcher::Options o;
    o.roots = SystemRoots{(root_ / "sys").string(), (root_ / "proc").string(), (root_ / "dev").string()};
    o.input = GidCheckInput{"spark1", "rocep1s0f0", 1, index, "192.168.100.1", "enp1s0f0np0"};
    o.interval = std::chrono::seconds(10);
    return o;
  }

  fs::path root_, port_;
};

TEST_F(GidWatcherTest, ReportsMoveOfResolvedEntryAfterInterval) {
  FakeClock clock;
  std::vector<GidChangeEvent> events;
  GidWatcher w(Opts(std::nullopt), &clock, [&](const GidChangeEvent& e) { events.push_back(e); });
  EXPECT_TRUE(w.Poll());
  ASSERT_TRUE(w.current().has_value());
  EXPECT_EQ(w.current()->index, 3);

  // Link event: the address comes back at index 5, index 3 becomes link-local.
  Write(port_ / "gids/3", "0000:0000:0000:0000:0000:ffff:a9fe:0c07");
  Write(port_ / "gids/5", "0000:0000:0000:0000:0000:ffff:c0a8:6401");
  Write(port_ / "gid_attrs/types/5", "RoCE v2");
  Write(port_ / "gid_attrs/ndevs/5", "enp1s0f0np0");

  clock.Advance(std::chrono::seconds(9));
  EXPECT_FALSE(w.Poll());  // not yet due
  EXPECT_TRUE(events.empty());
  clock.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(w.Poll());
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].old_entry.has_value());
  ASSERT_TRUE(events[0].new_entry.has_value());
  EXPECT_EQ(events[0].old_entry->index, 3);
  EXPECT_EQ(events[0].new_entry->index, 5);
  EXPECT_THAT(events[0].message, HasSubstr("gid.index changed on node spark1: rocep1s0f0 port 1 index 3"));
  EXPECT_THAT(events[0].message, HasSubstr("→ rocep1s0f0 port 1 index 5 gid ::ffff:192.168.100.1"));

  // No change → no new event.
  clock.Advance(std::chrono::seconds(10));
  EXPECT_TRUE(w.Poll());
  EXPECT_EQ(events.size(), 1u);
}

TEST_F(GidWatcherTest, FixedIndexLosingItsAddressIsReportedOnForcedPoll) {
  FakeClock clock;
  std::vector<GidChangeEvent> events;
  GidWatcher w(Opts(3), &clock, [&](const GidChangeEvent& e) { events.push_back(e); });
  w.Poll();
  ASSERT_TRUE(w.current().has_value());
  Write(port_ / "gids/3", "0000:0000:0000:0000:0000:0000:0000:0000");
  Write(port_ / "gids/2", "0000:0000:0000:0000:0000:0000:0000:0000");
  EXPECT_TRUE(w.Poll(/*force=*/true));  // a netlink event forces the re-read
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].new_entry.has_value());
  EXPECT_THAT(events[0].message, HasSubstr("(no RoCE v2 entry with 192.168.100.1 on enp1s0f0np0)"));
  EXPECT_FALSE(w.current().has_value());
}

TEST(NetlinkAddressMonitorTest, OpensAndTimesOutQuietly) {
  NetlinkAddressMonitor m;
  absl::Status s = m.Open();
  if (!s.ok()) GTEST_SKIP() << "netlink unavailable here: " << s;
  EXPECT_GE(m.fd(), 0);
  (void)m.WaitForEvents(0);  // drains whatever is pending; must not block.
}

}  // namespace
}  // namespace glm::preflight
