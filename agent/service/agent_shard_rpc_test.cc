// LoadShard / StopShard / StartShard through the agent's gRPC service (in-process server on
// 127.0.0.1:0) on the tiny-dense fixture, and the shard fields of AgentStatus.
#include <filesystem>
#include <fstream>

#include "agent/preflight/gid.h"
#include "agent/service/agent_service.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace glm::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class AgentShardRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    proc_ = fs::path(::testing::TempDir()) / ("agent_shard_proc_" + std::to_string(::getpid()));
    fs::remove_all(proc_);
    fs::create_directories(proc_ / "sys/vm/drop_caches");  // a directory: drops are refused
    std::ofstream(proc_ / "meminfo") << "MemTotal: 25000000 kB\nMemAvailable: 20000000 kB\n"
                                        "Cached: 1000000 kB\n";
    AgentServiceOptions options;
    options.node = "n1";
    options.version = "9.9.9";
    options.heartbeat = std::chrono::milliseconds(50);
    options.probe_paths.proc_root = proc_.string();
    // RDMA as the preflight sees it (used by the tests that run a fabric preflight).
    const std::string fixture = std::string(GLM_PREFLIGHT_FIXTURES) + "/healthy";
    options.roots = {fixture + "/sys", fixture + "/proc", fixture + "/dev"};
    options.gid_netlink = false;
    options.shard.tick_thread = false;
    options.shard.num_threads = 1;
    options.shard.tick_interval = std::chrono::milliseconds(0);  // tick after every tensor
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
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    fs::remove_all(proc_);
  }

  // Runs a streaming shard RPC; returns its progress and final status.
  template <typename Call>
  grpc::Status Stream(Call call, std::vector<glm::v1::Progress>* lines) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = call(&ctx);
    glm::v1::Progress p;
    while (reader->Read(&p)) lines->push_back(p);
    return reader->Finish();
  }

  grpc::Status Load(const glm::v1::LoadShardRequest& req, std::vector<glm::v1::Progress>* lines) {
    return Stream([&](grpc::ClientContext* c) { return stub_->LoadShard(c, req); }, lines);
  }

  static glm::v1::LoadShardRequest Request() {
    glm::v1::LoadShardRequest r;
    r.set_model_dir(GLM_TINY_DENSE);
    r.set_layer_begin(0);
    r.set_layer_end(3);
    r.set_tp_size(1);
    r.set_kv_cache_bytes(4 << 20);
    r.mutable_page_cache()->set_policy("adaptive");
    r.mutable_page_cache()->set_min_available_bytes(int64_t{1} << 40);  // always "low": drop
    return r;
  }

  fs::path proc_;
  int port_ = 0;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<glm::v1::Agent::Stub> stub_;
};

TEST_F(AgentShardRpcTest, LoadStreamsProgressAndStatusCarriesTheShard) {
  std::vector<glm::v1::Progress> lines;
  grpc::Status s = Load(Request(), &lines);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_GE(lines.size(), 3u);
  EXPECT_GT(lines.front().total_bytes(), 0);
  EXPECT_TRUE(lines.back().done());
  ASSERT_TRUE(lines.back().has_shard());
  EXPECT_EQ(lines.back().shard().state(), glm::v1::SHARD_STATE_LOADED);
  EXPECT_THAT(lines.back().message(), AllOf(HasSubstr("loaded layers 0-2"),
                                            HasSubstr("drop_caches not permitted")));

  glm::v1::AgentStatus st = service_->publisher().Snapshot();
  EXPECT_EQ(st.shard_state(), glm::v1::SHARD_STATE_LOADED);
  const glm::v1::ShardStatus& shard = st.shard();
  EXPECT_EQ(shard.state(), glm::v1::SHARD_STATE_LOADED);
  EXPECT_EQ(shard.model_dir(), GLM_TINY_DENSE);
  EXPECT_EQ(shard.bytes_loaded(), shard.bytes_total());
  EXPECT_GT(shard.bytes_loaded(), 0);
  EXPECT_GE(shard.load_time_ms(), 0);
  EXPECT_FALSE(shard.tp_replicated());
  EXPECT_EQ(shard.tp_size(), 1);
  EXPECT_GT(shard.kv_cache_bytes(), 0);
  EXPECT_EQ(shard.page_cache().policy(), "adaptive");
  EXPECT_EQ(shard.page_cache().fadvise_ranges(), shard.tensors_loaded());
  // The fake proc root refuses drop_caches: said once, the load carried on.
  EXPECT_TRUE(shard.page_cache().drop_not_permitted());
  EXPECT_THAT(shard.page_cache().drop_not_permitted_message(), HasSubstr("drop_caches"));
  EXPECT_EQ(shard.page_cache().drop_caches_count(), 0);

  // The same request again is a no-op; a different one needs a stop first.
  lines.clear();
  ASSERT_TRUE(Load(Request(), &lines).ok());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0].message(), HasSubstr("already loaded"));
  glm::v1::LoadShardRequest other = Request();
  other.set_layer_end(2);
  lines.clear();
  grpc::Status refused = Load(other, &lines);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), AllOf(HasSubstr("n1"), HasSubstr("Stop")));

  // Generate before Start: the shard is not Running.
  {
    grpc::ClientContext c;
    glm::v1::GenerateRequest g;
    g.add_prompt_token_ids(1);
    auto reader = stub_->Generate(&c, g);
    glm::v1::TokenEvent e;
    EXPECT_FALSE(reader->Read(&e));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), AllOf(HasSubstr("n1"), HasSubstr("not Running")));
  }
  // Start (a single-rank replica needs no rendezvous) makes it Running.
  lines.clear();
  glm::v1::StartShardRequest start;
  grpc::Status started =
      Stream([&](grpc::ClientContext* c) { return stub_->StartShard(c, start); }, &lines);
  ASSERT_TRUE(started.ok()) << started.error_message();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().shard().state(), glm::v1::SHARD_STATE_RUNNING);
  // No preflight configured RDMA on this node: no GID table to fingerprint.
  EXPECT_EQ(service_->publisher().Snapshot().gid_fingerprint(), "");
  // Generate streams token events; the last one finishes with the reason and counts.
  {
    grpc::ClientContext c;
    glm::v1::GenerateRequest g;
    for (int id : {3, 17, 42, 5}) g.add_prompt_token_ids(id);
    g.set_max_tokens(5);
    auto reader = stub_->Generate(&c, g);
    glm::v1::TokenEvent e;
    int tokens = 0;
    glm::v1::TokenEvent last;
    while (reader->Read(&e)) {
      tokens += e.token_ids_size();
      last = e;
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(tokens, 5);
    EXPECT_TRUE(last.finished());
    EXPECT_EQ(last.finish_reason(), "length");
    EXPECT_EQ(last.completion_tokens(), 5);
    EXPECT_EQ(last.prompt_tokens(), 4);
  }
  // Drain: nothing in flight, bounded wait returns at once.
  lines.clear();
  glm::v1::DrainShardRequest drain;
  drain.set_timeout_ms(2000);
  ASSERT_TRUE(
      Stream([&](grpc::ClientContext* c) { return stub_->DrainShard(c, drain); }, &lines).ok());
  EXPECT_THAT(lines.back().message(), HasSubstr("drained"));

  // Stop frees it; status follows.
  lines.clear();
  glm::v1::StopShardRequest stop;
  ASSERT_TRUE(
      Stream([&](grpc::ClientContext* c) { return stub_->StopShard(c, stop); }, &lines).ok());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0].message(), HasSubstr("stopped: freed layers [0, 3)"));
  EXPECT_EQ(lines[0].shard().state(), glm::v1::SHARD_STATE_STOPPED);
  st = service_->publisher().Snapshot();
  EXPECT_EQ(st.shard_state(), glm::v1::SHARD_STATE_STOPPED);
  EXPECT_EQ(st.shard().kv_cache_bytes(), 0);
}

// A preflight that checked an RDMA port: the shard's start records the fingerprint of that
// port's GID table in the status (AgentStatus.gid_fingerprint); Stop clears it.
TEST_F(AgentShardRpcTest, StartRecordsTheGidTableFingerprintOfThePreflightedPort) {
  glm::v1::PreflightRequest pre;
  pre.set_fabric_ip("192.168.100.1");
  pre.set_hca("rocep1s0f0");
  pre.set_hca_port(1);
  pre.set_gid_index_auto(true);
  pre.set_netdev("enp1s0f0np0");
  grpc::ServerContext ctx;
  glm::v1::PreflightResponse resp;
  ASSERT_TRUE(service_->Preflight(&ctx, &pre, &resp).ok());
  ASSERT_TRUE(resp.has_gid());
  EXPECT_EQ(service_->publisher().Snapshot().gid_fingerprint(), "");  // not started yet

  std::vector<glm::v1::Progress> lines;
  ASSERT_TRUE(Load(Request(), &lines).ok());
  glm::v1::StartShardRequest start;
  grpc::Status started =
      Stream([&](grpc::ClientContext* c) { return stub_->StartShard(c, start); }, &lines);
  ASSERT_TRUE(started.ok()) << started.error_message();
  const std::string fixture = std::string(GLM_PREFLIGHT_FIXTURES) + "/healthy";
  auto table = preflight::ReadGidTable({fixture + "/sys", fixture + "/proc", fixture + "/dev"},
                                       "rocep1s0f0", 1);
  ASSERT_TRUE(table.ok()) << table.status();
  const std::string want = preflight::GidTableFingerprint(*table);
  EXPECT_THAT(want, ::testing::StartsWith("xxh64:"));
  EXPECT_EQ(service_->publisher().Snapshot().gid_fingerprint(), want);

  glm::v1::StopShardRequest stop;
  ASSERT_TRUE(
      Stream([&](grpc::ClientContext* c) { return stub_->StopShard(c, stop); }, &lines).ok());
  EXPECT_EQ(service_->publisher().Snapshot().gid_fingerprint(), "");
}

TEST_F(AgentShardRpcTest, FailedLoadIsInvalidArgumentNamingNodeAndSetsLastError) {
  std::vector<glm::v1::Progress> lines;
  glm::v1::LoadShardRequest r = Request();
  r.set_model_dir((proc_ / "no-such-model").string());
  grpc::Status s = Load(r, &lines);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("node 'n1'"), HasSubstr("no-such-model"),
                                       HasSubstr("Fix:")));
  glm::v1::AgentStatus st = service_->publisher().Snapshot();
  EXPECT_EQ(st.shard_state(), glm::v1::SHARD_STATE_FAILED);
  EXPECT_EQ(st.shard().last_error(), s.error_message());
  EXPECT_EQ(st.last_error(), s.error_message());
}

}  // namespace
}  // namespace glm::agent
