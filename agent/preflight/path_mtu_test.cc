#include "agent/preflight/path_mtu.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::preflight {
namespace {

using ::testing::HasSubstr;

PathMtuOptions Loopback(uint16_t port, int target) {
  PathMtuOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.target_mtu = target;
  o.timeout = std::chrono::milliseconds(100);
  o.attempts = 2;
  return o;
}

TEST(PathMtuTest, LoopbackCarriesJumboFrames) {
  auto responder = UdpEchoResponder::Start("127.0.0.1", 0);
  ASSERT_TRUE(responder.ok()) << responder.status();
  auto result = ProbePathMtu(Loopback((*responder)->port(), 9000));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->largest_ok, 9000);
  EXPECT_TRUE(result->ok());
  EXPECT_EQ(PathMtuCheck("n2", result).status, CheckStatus::kPass);
}

TEST(PathMtuTest, BinarySearchFindsTheNarrowHop) {
  // The responder drops datagrams over 1472 bytes: a 1500-byte path.
  auto responder = UdpEchoResponder::Start("127.0.0.1", 0, 1500 - 28);
  ASSERT_TRUE(responder.ok()) << responder.status();
  auto result = ProbePathMtu(Loopback((*responder)->port(), 9000));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->largest_ok, 1500);
  EXPECT_FALSE(result->ok());
  CheckResult c = PathMtuCheck("n2", result);
  EXPECT_EQ(c.id, "mtu.path");
  EXPECT_EQ(c.status, CheckStatus::kFail);
  EXPECT_THAT(c.message, HasSubstr("at most 1500-byte packets"));
  EXPECT_THAT(c.fix, HasSubstr("raise the MTU to 9000 on every hop"));
}

TEST(PathMtuTest, NoResponderIsAnError) {
  // Bind and drop a responder to get a port nobody listens on.
  uint16_t port;
  {
    auto responder = UdpEchoResponder::Start("127.0.0.1", 0);
    ASSERT_TRUE(responder.ok());
    port = (*responder)->port();
  }
  auto result = ProbePathMtu(Loopback(port, 9000));
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("no reply from 127.0.0.1"));
  EXPECT_EQ(PathMtuCheck("n2", result).status, CheckStatus::kFail);
}

}  // namespace
}  // namespace glm::preflight
