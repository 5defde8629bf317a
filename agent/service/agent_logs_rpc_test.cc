// Agent.Logs over a real in-process gRPC server on 127.0.0.1, port 0, serving a ring the test
// owns: the tail, the default and the cap, follow (a line logged after the call started arrives),
// client cancel, agent shutdown, and a rotated ring reported as dropped lines.
#include <string>

#include "agent/service/agent_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace glm::agent {
namespace {

class AgentLogsTest : public ::testing::Test {
 protected:
  void Start(LogRingLimits limits = {}) {
    ring_ = std::make_unique<LogRing>(limits);
    AgentServiceOptions options;
    options.node = "n1";
    options.log_ring = ring_.get();
    service_ = std::make_unique<AgentService>(options, Clock::Real());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
    stub_ = glm::v1::Agent::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                        grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (service_) service_->Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  void Log(int first, int last) {
    for (int i = first; i <= last; ++i) ring_->Append("line " + std::to_string(i));
  }
  static void Bound(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }
  // Every line of a non-following stream and its final status.
  grpc::Status ReadAll(const glm::v1::LogsRequest& req, std::vector<glm::v1::LogLine>* lines) {
    grpc::ClientContext ctx;
    Bound(&ctx);
    auto reader = stub_->Logs(&ctx, req);
    glm::v1::LogLine line;
    while (reader->Read(&line)) lines->push_back(line);
    return reader->Finish();
  }

  std::unique_ptr<LogRing> ring_;
  int port_ = 0;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<glm::v1::Agent::Stub> stub_;
};

TEST_F(AgentLogsTest, TailReturnsTheLastLinesInOrder) {
  Start();
  Log(1, 10);
  glm::v1::LogsRequest req;
  req.set_tail_lines(3);
  std::vector<glm::v1::LogLine> lines;
  ASSERT_TRUE(ReadAll(req, &lines).ok());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].seq(), 8);
  EXPECT_EQ(lines[0].text(), "line 8");
  EXPECT_EQ(lines[2].seq(), 10);
  EXPECT_EQ(lines[2].text(), "line 10");
  for (const auto& l : lines) EXPECT_EQ(l.dropped_before(), 0);
}

TEST_F(AgentLogsTest, TailDefaultsTo200AndIsCappedAtTheRing) {
  Start({.max_lines = 250, .max_bytes = 1 << 20});
  Log(1, 400);
  std::vector<glm::v1::LogLine> lines;
  ASSERT_TRUE(ReadAll({}, &lines).ok());
  ASSERT_EQ(lines.size(), 200u);
  EXPECT_EQ(lines.front().seq(), 201);
  lines.clear();
  glm::v1::LogsRequest req;
  req.set_tail_lines(1'000'000);
  ASSERT_TRUE(ReadAll(req, &lines).ok());
  EXPECT_EQ(lines.size(), 250u);
  EXPECT_EQ(lines.back().text(), "line 400");
}

TEST_F(AgentLogsTest, NegativeTailIsRefusedNamingTheNode) {
  Start();
  glm::v1::LogsRequest req;
  req.set_tail_lines(-1);
  std::vector<glm::v1::LogLine> lines;
  grpc::Status s = ReadAll(req, &lines);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("n1"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("tail_lines"), std::string::npos) << s.error_message();
}

TEST_F(AgentLogsTest, FollowDeliversALineLoggedAfterTheCallAndCancelEndsIt) {
  Start();
  Log(1, 2);
  grpc::ClientContext ctx;
  Bound(&ctx);
  glm::v1::LogsRequest req;
  req.set_tail_lines(1);
  req.set_follow(true);
  auto reader = stub_->Logs(&ctx, req);
  glm::v1::LogLine line;
  ASSERT_TRUE(reader->Read(&line));  // the tail: the handler is following from here on
  EXPECT_EQ(line.text(), "line 2");
  ring_->Append("logged while following");
  ASSERT_TRUE(reader->Read(&line));
  EXPECT_EQ(line.seq(), 3);
  EXPECT_EQ(line.text(), "logged while following");
  auto start = std::chrono::steady_clock::now();
  ctx.TryCancel();
  EXPECT_FALSE(reader->Read(&line));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The handler notices within one poll (200 ms); Shutdown in TearDown would hang otherwise.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST_F(AgentLogsTest, AgentShutdownEndsAFollowingStreamCleanly) {
  Start();
  Log(1, 1);
  grpc::ClientContext ctx;
  Bound(&ctx);
  glm::v1::LogsRequest req;
  req.set_follow(true);
  auto reader = stub_->Logs(&ctx, req);
  glm::v1::LogLine line;
  ASSERT_TRUE(reader->Read(&line));
  service_->Shutdown();
  EXPECT_FALSE(reader->Read(&line));
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(AgentLogsTest, RotatedRingReportsDroppedLinesOnTheFirstLine) {
  // 100 lines at most, but only 3 of "line N" (6-7 bytes) fit in 21 bytes.
  Start({.max_lines = 100, .max_bytes = 21});
  Log(1, 12);
  glm::v1::LogsRequest req;
  req.set_tail_lines(10);
  std::vector<glm::v1::LogLine> lines;
  ASSERT_TRUE(ReadAll(req, &lines).ok());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines.front().seq(), 10);
  EXPECT_EQ(lines.front().dropped_before(), 7);  // lines 3..9 were asked for and are gone
  EXPECT_EQ(lines.back().text(), "line 12");
  EXPECT_EQ(lines.back().dropped_before(), 0);
}

}  // namespace
}  // namespace glm::agent
