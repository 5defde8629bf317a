// ForwardLogs: the controller's own ring, an unknown node, an unreachable agent, and a followed
// stream forwarded from an in-process agent on 127.0.0.1:0 whose end sees the caller's cancel.
#include "controller/orchestrate/logs_forward.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

using std::chrono::milliseconds;

// An agent that serves only Logs, from a ring the test owns, and records when a stream ends.
class LogsOnlyAgent final : public glm::v1::Agent::Service {
 public:
  grpc::Status Logs(grpc::ServerContext* ctx, const glm::v1::LogsRequest* req,
                    grpc::ServerWriter<glm::v1::LogLine>* writer) override {
    StreamLogRing(
        ring, {.tail_lines = req->tail_lines(), .follow = req->follow(), .poll = milliseconds(20)},
        [writer](const LogRing::Line& line, int64_t dropped) {
          glm::v1::LogLine out;
          out.set_seq(line.seq);
          out.set_text(line.text);
          out.set_dropped_before(dropped);
          return writer->Write(out);
        },
        [ctx] { return ctx->IsCancelled(); });
    {
      std::lock_guard<std::mutex> lock(mu);
      ++ended;
    }
    cv.notify_all();
    return grpc::Status::OK;
  }
  bool WaitEnded(int n, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return ended >= n; });
  }

  LogRing ring;
  std::mutex mu;
  std::condition_variable cv;
  int ended = 0;
};

class LogsForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&agent_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
    cluster_.set_cluster_name("demo");
    auto* n1 = cluster_.add_nodes();
    n1->set_name("node-1");
    n1->set_address("127.0.0.1:" + std::to_string(port_));
    auto* n2 = cluster_.add_nodes();
    n2->set_name("node-2");
    n2->set_address("127.0.0.1:1");  // nothing listens on a privileged port here
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  grpc::Status Forward(
      const glm::v1::ClusterLogsRequest& req,
      const std::function<bool()>& cancelled = [] { return false; }) {
    return ForwardLogs(req, cluster_, channels_, own_, cancelled,
                       [&](const glm::v1::LogLine& line) {
                         std::lock_guard<std::mutex> lock(mu_);
                         lines_.push_back(line);
                         cv_.notify_all();
                         return true;
                       },
                       {.connect_timeout = milliseconds(300), .poll = milliseconds(20)});
  }
  bool WaitLines(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return lines_.size() >= n; });
  }

  int port_ = 0;
  LogsOnlyAgent agent_;
  std::unique_ptr<grpc::Server> server_;
  glm::v1::ClusterStatus cluster_;
  GrpcAgentClientFactory channels_{rpc::TlsFiles{}};
  LogRing own_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<glm::v1::LogLine> lines_;
};

TEST_F(LogsForwardTest, ControllerServesItsOwnRing) {
  own_.Append("controller started");
  own_.Append("second");
  glm::v1::ClusterLogsRequest req;
  req.set_node("controller");
  req.set_tail_lines(1);
  ASSERT_TRUE(Forward(req).ok());
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0].text(), "second");
  EXPECT_EQ(lines_[0].seq(), 2);
  EXPECT_EQ(agent_.ended, 0);
}

TEST_F(LogsForwardTest, UnknownNodeIsNotFoundNamingTheKnownOnes) {
  glm::v1::ClusterLogsRequest req;
  req.set_node("node-9");
  grpc::Status s = Forward(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  for (const char* want : {"node-9", "demo", "controller", "node-1", "node-2", "Fix"}) {
    EXPECT_NE(s.error_message().find(want), std::string::npos) << want << ": " << s.error_message();
  }
}

TEST_F(LogsForwardTest, NegativeTailIsInvalid) {
  glm::v1::ClusterLogsRequest req;
  req.set_node("node-1");
  req.set_tail_lines(-3);
  EXPECT_EQ(Forward(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(LogsForwardTest, UnreachableAgentIsUnavailableNamingNodeAddressAndFix) {
  glm::v1::ClusterLogsRequest req;
  req.set_node("node-2");
  grpc::Status s = Forward(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  for (const char* want : {"node-2", "127.0.0.1:1", "Fix", "glm-agent"}) {
    EXPECT_NE(s.error_message().find(want), std::string::npos) << want << ": " << s.error_message();
  }
}

TEST_F(LogsForwardTest, TailIsForwardedFromTheAgent) {
  for (int i = 1; i <= 5; ++i) agent_.ring.Append("agent line " + std::to_string(i));
  glm::v1::ClusterLogsRequest req;
  req.set_node("node-1");
  req.set_tail_lines(2);
  ASSERT_TRUE(Forward(req).ok());
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_EQ(lines_[0].text(), "agent line 4");
  EXPECT_EQ(lines_[1].seq(), 5);
}

TEST_F(LogsForwardTest, FollowForwardsNewLinesAndTheCallersCancelEndsTheAgentStream) {
  agent_.ring.Append("agent started");
  glm::v1::ClusterLogsRequest req;
  req.set_node("node-1");
  req.set_follow(true);
  std::atomic<bool> cancelled{false};
  grpc::Status result;
  std::thread call([&] { result = Forward(req, [&] { return cancelled.load(); }); });
  ASSERT_TRUE(WaitLines(1));  // the tail arrived: the agent is following
  agent_.ring.Append("preflight node=node-1");
  ASSERT_TRUE(WaitLines(2));
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(lines_[1].text(), "preflight node=node-1");
  }
  cancelled.store(true);
  call.join();
  EXPECT_EQ(result.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(agent_.WaitEnded(1, std::chrono::seconds(20))) << "the agent kept following";
}

}  // namespace
}  // namespace glm::orchestrate
