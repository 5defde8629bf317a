#include "agent/service/status_publisher.h"

#include <thread>

#include "gtest/gtest.h"

namespace glm::agent {
namespace {

TEST(StatusPublisherTest, VersionsIncreaseOnEveryUpdate) {
  FakeClock clock;
  StatusPublisher pub("n1", "abc", &clock);
  auto s1 = pub.Snapshot();
  pub.Update([](glm::v1::AgentStatus& s) { s.set_last_error("x"); });
  auto s2 = pub.Snapshot();
  EXPECT_EQ(s1.node(), "n1");
  EXPECT_EQ(s1.instance_id(), "abc");
  EXPECT_GT(s2.version(), s1.version());
  EXPECT_EQ(s2.last_error(), "x");
}

TEST(StatusPublisherTest, WaitReturnsChangeImmediatelyWhenAlreadyNewer) {
  FakeClock clock;
  StatusPublisher pub("n1", "abc", &clock);
  int64_t seen = pub.Snapshot().version();
  pub.Update([](glm::v1::AgentStatus& s) { s.set_tokens_per_second(3); });
  glm::v1::AgentStatus out;
  // Long heartbeat: returns at once because a change is pending, not after the interval.
  ASSERT_TRUE(pub.Wait(seen, std::chrono::hours(1), &out));
  EXPECT_FALSE(out.heartbeat());
  EXPECT_EQ(out.version(), seen + 1);
}

TEST(StatusPublisherTest, HeartbeatRepeatsVersion) {
  FakeClock clock;
  StatusPublisher pub("n1", "abc", &clock);
  int64_t seen = pub.Snapshot().version();
  clock.Advance(std::chrono::seconds(5));
  glm::v1::AgentStatus out;
  ASSERT_TRUE(pub.Wait(seen, std::chrono::milliseconds(0), &out));
  EXPECT_TRUE(out.heartbeat());
  EXPECT_EQ(out.version(), seen);
  EXPECT_EQ(out.uptime_ms(), 5000);
}

TEST(StatusPublisherTest, ShutdownEndsWaiters) {
  FakeClock clock;
  StatusPublisher pub("n1", "abc", &clock);
  std::thread waiter([&] {
    glm::v1::AgentStatus out;
    EXPECT_FALSE(pub.Wait(pub.Snapshot().version(), std::chrono::hours(1), &out));
  });
  pub.Shutdown();
  waiter.join();
}

}  // namespace
}  // namespace glm::agent
