#include "controller/gateway/http/testing/fake_exchange.h"

#include "gtest/gtest.h"

namespace glm::http {
namespace {

TEST(FakeExchangeTest, RecordsTheFirstReplyOnly) {
  FakeExchange exchange(Request{.method = "GET", .target = "/v1/models"});
  exchange.Respond({.status = 200, .body = "first"});
  exchange.Respond({.status = 500, .body = "second"});
  ASSERT_TRUE(exchange.response());
  EXPECT_EQ(exchange.response()->body, "first");
  EXPECT_TRUE(exchange.StartStream(200, {})->closed());
}

TEST(FakeExchangeTest, ClientLeavingClosesTheStreamOnce) {
  FakeExchange exchange;
  int closes = 0;
  auto stream = exchange.StartStream(200, {{"X-Id", "1"}});
  stream->OnClose([&] { ++closes; });
  EXPECT_TRUE(stream->Send("data: a\n\n"));
  exchange.CloseClient();
  exchange.CloseClient();
  EXPECT_EQ(closes, 1);
  EXPECT_FALSE(stream->Send("data: b\n\n"));
  EXPECT_EQ(exchange.stream()->joined(), "data: a\n\n");
  EXPECT_EQ(exchange.stream_headers().size(), 1u);
}

TEST(FakeExchangeTest, FinishedStreamNeverRunsOnClose) {
  FakeExchange exchange;
  bool closed = false;
  exchange.OnClose([&] { closed = true; });
  auto stream = exchange.StartStream(200, {});
  stream->Finish();
  exchange.CloseClient();
  EXPECT_FALSE(closed);
  EXPECT_TRUE(exchange.stream()->finished());
}

TEST(FakeExchangeTest, OnCloseAfterTheClientLeftRunsAtOnce) {
  FakeExchange exchange;
  exchange.CloseClient();
  bool closed = false;
  exchange.OnClose([&] { closed = true; });
  EXPECT_TRUE(closed);
  EXPECT_TRUE(exchange.client_gone());
}

}  // namespace
}  // namespace glm::http
