#include "proto/rpc/listen_policy.h"

#include "gtest/gtest.h"

namespace glm::rpc {
namespace {

TEST(ListenPolicy, LoopbackAddresses) {
  for (const char* listen : {"127.0.0.1:47100", "127.3.4.5:0", "localhost:1", "[::1]:47100",
                             "unix:/tmp/agent.sock", "127.0.0.1", "::1"}) {
    EXPECT_TRUE(IsLoopbackListen(listen)) << listen;
  }
  for (const char* listen : {"0.0.0.0:47100", "[::]:1", "10.0.0.11:47100", "192.168.1.2:0",
                             "node1:47100", "128.0.0.1:1", "[::ffff:10.0.0.1]:1", ""}) {
    EXPECT_FALSE(IsLoopbackListen(listen)) << listen;
  }
}

TEST(ListenPolicy, RefusesOnlyPlaintextBeyondLoopbackWithoutOptOut) {
  EXPECT_TRUE(RefuseInsecureListen("0.0.0.0:1", false, false));
  EXPECT_FALSE(RefuseInsecureListen("0.0.0.0:1", true, false));
  EXPECT_FALSE(RefuseInsecureListen("0.0.0.0:1", false, true));
  EXPECT_FALSE(RefuseInsecureListen("127.0.0.1:1", false, false));
}

}  // namespace
}  // namespace glm::rpc
