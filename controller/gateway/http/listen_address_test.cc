#include "controller/gateway/http/listen_address.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::http {
namespace {

using ::testing::HasSubstr;

TEST(ListenAddressTest, ParsesTheAcceptedForms) {
  auto v4 = ParseListenAddress("127.0.0.1:8000");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 8000);

  auto v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);

  auto any = ParseListenAddress(":65535");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->host, "0.0.0.0");
  EXPECT_EQ(any->port, 65535);

  auto named = ParseListenAddress("localhost:80");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->host, "localhost");
}

TEST(ListenAddressTest, RejectsWithTheFix) {
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:8x", "::1:80",
                          "[::1]", "[::1]80", "[]:80", "host:-1", ""}) {
    auto parsed = ParseListenAddress(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("host:port")) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(std::string("'") + bad + "'"));
  }
}

}  // namespace
}  // namespace glm::http
