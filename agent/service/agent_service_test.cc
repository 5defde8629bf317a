// The agent service over a real in-process gRPC server on 127.0.0.1, port 0.
#include "agent/service/agent_service.h"

#include "grpcpp/grpcpp.h"
#include "proto/rpc/listen_policy.h"
#include "gtest/gtest.h"

namespace glm::agent {
namespace {

class AgentServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AgentServiceOptions options;
    options.node = "n1";
    options.version = "9.9.9";
    options.heartbeat = std::chrono::milliseconds(50);
    service_ = std::make_unique<AgentService>(options, Clock::Real());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    rpc::LimitRequestSizes(builder);  // as glm-agent's server
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
    stub_ = glm::v1::Agent::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                        grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  static void Bound(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  int port_ = 0;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<glm::v1::Agent::Stub> stub_;
};

TEST_F(AgentServiceTest, InfoNamesNodeVersionAndInstance) {
  grpc::ClientContext ctx;
  Bound(&ctx);
  glm::v1::InfoResponse resp;
  ASSERT_TRUE(stub_->Info(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.node(), "n1");
  EXPECT_EQ(resp.version(), "9.9.9");
  EXPECT_EQ(resp.instance_id(), service_->instance_id());
  EXPECT_GT(resp.start_time_unix_ms(), 0);
  EXPECT_GT(resp.host().cpu_count(), 0);
}

// Hostile input: a request over the daemons' bound ends before any handler runs.
TEST_F(AgentServiceTest, OversizedRequestsAreRefusedBeforeTheHandler) {
  glm::v1::GenerateRequest big;
  big.mutable_prompt_token_ids()->Resize(rpc::kMaxRequestBytes / 4, 1 << 28);  // 5 bytes each
  ASSERT_GT(big.ByteSizeLong(), static_cast<size_t>(rpc::kMaxRequestBytes));
  grpc::ClientContext ctx;
  Bound(&ctx);
  auto reader = stub_->Generate(&ctx, big);
  glm::v1::TokenEvent ev;
  EXPECT_FALSE(reader->Read(&ev));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // A request within the bound reaches the handler (which refuses it: no shard is loaded).
  glm::v1::GenerateRequest small;
  small.add_prompt_token_ids(1);
  grpc::ClientContext ctx2;
  Bound(&ctx2);
  auto reader2 = stub_->Generate(&ctx2, small);
  EXPECT_FALSE(reader2->Read(&ev));
  EXPECT_EQ(reader2->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(AgentServiceTest, PreflightReturnsHostChecksAndExtras) {
  grpc::ClientContext ctx;
  Bound(&ctx);
  glm::v1::PreflightResponse resp;
  ASSERT_TRUE(stub_->Preflight(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.node(), "n1");
  ASSERT_GE(resp.checks_size(), 5);
  EXPECT_EQ(resp.checks(0).id(), "host.cpu.count");
}

TEST_F(AgentServiceTest, RequiredGpuIsCheckedUnlessTheNodeAllowsNone) {
  glm::v1::PreflightRequest req;
  req.set_require_gpu(true);
  auto gpu_status = [&](AgentService* service) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    auto server = builder.BuildAndStart();
    auto stub = glm::v1::Agent::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    Bound(&ctx);
    glm::v1::PreflightResponse resp;
    EXPECT_TRUE(stub->Preflight(&ctx, req, &resp).ok());
    server->Shutdown();
    for (const auto& c : resp.checks())
      if (c.id() == "host.gpu.present") return c.status();
    return glm::v1::CHECK_STATUS_UNSPECIFIED;
  };
  // A fake /dev without GPUs, so the result does not depend on this machine.
  AgentServiceOptions options;
  options.node = "cpu";
  options.probe_paths.dev_root = "/nonexistent-dev";
  options.probe_paths.proc_root = "/nonexistent-proc";
  AgentService strict(options, Clock::Real());
  EXPECT_EQ(gpu_status(&strict), glm::v1::CHECK_STATUS_FAIL);
  options.allow_no_gpu = true;
  AgentService lenient(options, Clock::Real());
  EXPECT_EQ(gpu_status(&lenient), glm::v1::CHECK_STATUS_WARN);
}

TEST_F(AgentServiceTest, ImpossibleRequirementFailsPreflight) {
  grpc::ClientContext ctx;
  Bound(&ctx);
  glm::v1::PreflightRequest req;
  req.set_required_memory_bytes(int64_t{1} << 62);
  glm::v1::PreflightResponse resp;
  ASSERT_TRUE(stub_->Preflight(&ctx, req, &resp).ok());
  EXPECT_FALSE(resp.ok());
}

TEST_F(AgentServiceTest, WatchStatusSendsVersionedStatusAndHeartbeats) {
  grpc::ClientContext ctx;
  Bound(&ctx);
  glm::v1::WatchStatusRequest req;
  req.set_heartbeat_ms(50);
  auto reader = stub_->WatchStatus(&ctx, req);
  glm::v1::AgentStatus first, second, third;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_EQ(first.node(), "n1");
  EXPECT_FALSE(first.heartbeat());
  ASSERT_TRUE(reader->Read(&second));  // a heartbeat, 50 ms later
  EXPECT_TRUE(second.heartbeat());
  EXPECT_EQ(second.version(), first.version());
  service_->publisher().Update([](glm::v1::AgentStatus& s) { s.set_last_error("boom"); });
  do {
    ASSERT_TRUE(reader->Read(&third));
  } while (third.heartbeat());
  EXPECT_GT(third.version(), first.version());
  EXPECT_EQ(third.last_error(), "boom");
  ctx.TryCancel();
}

TEST_F(AgentServiceTest, UnbuiltOperationsAreUnimplementedNotFakeSuccess) {
  {
    grpc::ClientContext ctx;
    Bound(&ctx);
    // Staging is implemented (agent_stage_rpc_test.cc); an empty request is refused, not faked.
    auto reader = stub_->StageWeights(&ctx, {});
    glm::v1::Progress p;
    EXPECT_FALSE(reader->Read(&p));
    auto status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("n1"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    Bound(&ctx);
    // Loading is implemented (agent_shard_rpc_test.cc); a request without a model is refused.
    auto reader = stub_->LoadShard(&ctx, {});
    glm::v1::Progress p;
    EXPECT_FALSE(reader->Read(&p));
    auto status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("n1"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    Bound(&ctx);
    // Starting needs a loaded shard.
    auto reader = stub_->StartShard(&ctx, {});
    glm::v1::Progress p;
    EXPECT_FALSE(reader->Read(&p));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
}

}  // namespace
}  // namespace glm::agent
