// Bring-up steps against fake agents; backoff waits advance a FakeClock instead of sleeping.
#include "controller/orchestrate/steps.h"

#include "controller/orchestrate/testing/fake_agent_client.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

using std::chrono::milliseconds;

class StepsTest : public ::testing::Test {
 protected:
  StepsTest() : state_(&clock_), ctx_(&state_, [this](const glm::v1::UpEvent& e) {
                  events_.push_back(e);
                }) {
    ctx_.topology.cluster_name = "t";
    ctx_.topology.config_path = "t.yaml";
    ctx_.topology.nodes = {{"n1", "127.0.0.1:1"}, {"n2", "127.0.0.1:2"}};
    for (const auto& n : ctx_.topology.nodes) factory_.Add(n.name);
    state_.Reset(ctx_.topology);
  }
  Sleeper FakeSleep() {
    return [this](Clock::Duration d) {
      std::lock_guard<std::mutex> lock(sleep_mu_);
      slept_ += d;
      clock_.Advance(d);
    };
  }

  FakeClock clock_;
  ClusterState state_;
  std::vector<glm::v1::UpEvent> events_;
  BringUpContext ctx_;
  FakeAgentClientFactory factory_;
  std::mutex sleep_mu_;
  Clock::Duration slept_{0};
};

TEST_F(StepsTest, ConnectRetriesWithExponentialBackoff) {
  factory_.agents["n2"]->info_failures = 3;
  ConnectStep step(&factory_, RetryPolicy{.max_attempts = 5}, FakeSleep());
  ASSERT_TRUE(step.Run(ctx_).ok());
  EXPECT_EQ(factory_.agents["n2"]->CallCount("Info"), 4);
  EXPECT_EQ(slept_, milliseconds(100 + 200 + 400));
  EXPECT_EQ(ctx_.agents.size(), 2u);
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_CONNECTED);
}

TEST_F(StepsTest, ConnectGivesUpBoundedAndNamesNodeAndAddress) {
  factory_.agents["n2"]->info_failures = 100;
  ConnectStep step(&factory_,
                   RetryPolicy{.max_attempts = 6, .max_backoff = milliseconds(300)}, FakeSleep());
  absl::Status s = step.Run(ctx_);
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(factory_.agents["n2"]->CallCount("Info"), 6);
  EXPECT_EQ(slept_, milliseconds(100 + 200 + 300 + 300 + 300));  // capped backoff
  EXPECT_NE(s.message().find("node 'n2' at 127.0.0.1:2"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("glm-agent serve --listen 127.0.0.1:2 --node n2"),
            absl::string_view::npos);
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_FAILED);
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_CONNECTED);
}

TEST_F(StepsTest, ConnectRefusesAnAgentThatIsAnotherNode) {
  factory_.agents["n1"]->reported_node = "n7";
  ConnectStep step(&factory_, RetryPolicy{}, FakeSleep());
  absl::Status s = step.Run(ctx_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("'n7'"), absl::string_view::npos) << s;
}

glm::v1::Check MakeCheck(const std::string& id, glm::v1::CheckStatus status) {
  glm::v1::Check c;
  c.set_id(id);
  c.set_status(status);
  c.set_message(id + " message");
  c.set_evidence(id + " evidence");
  if (status != glm::v1::CHECK_STATUS_PASS) c.set_fix(id + " fix");
  return c;
}

TEST_F(StepsTest, PreflightFailureNamesNodeCheckEvidenceAndFix) {
  ConnectStep(&factory_, RetryPolicy{}, FakeSleep()).Run(ctx_).IgnoreError();
  factory_.agents["n1"]->checks = {MakeCheck("host.cpu.count", glm::v1::CHECK_STATUS_PASS),
                                   MakeCheck("host.gpu.present", glm::v1::CHECK_STATUS_WARN)};
  factory_.agents["n2"]->checks = {MakeCheck("host.memory.available", glm::v1::CHECK_STATUS_FAIL)};
  absl::Status s = PreflightStep().Run(ctx_);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  std::string m(s.message());
  EXPECT_NE(m.find("node 'n2'"), std::string::npos) << m;
  EXPECT_NE(m.find("host.memory.available"), std::string::npos);
  EXPECT_NE(m.find("host.memory.available evidence"), std::string::npos);
  EXPECT_NE(m.find("host.memory.available fix"), std::string::npos);
  EXPECT_EQ(m.find("n1"), std::string::npos) << "warnings do not fail: " << m;
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_FAILED);
  bool saw_checks = false;
  for (auto& e : events_) saw_checks |= (e.node() == "n1" && e.checks_size() == 2);
  EXPECT_TRUE(saw_checks);
}

TEST_F(StepsTest, PreflightPassesWithWarnings) {
  ConnectStep(&factory_, RetryPolicy{}, FakeSleep()).Run(ctx_).IgnoreError();
  factory_.agents["n1"]->checks = {MakeCheck("host.gpu.present", glm::v1::CHECK_STATUS_WARN)};
  EXPECT_TRUE(PreflightStep().Run(ctx_).ok());
}

glm::v1::GidEntry Gid(int index) {
  glm::v1::GidEntry g;
  g.set_hca("rocep1s0f0");
  g.set_port(1);
  g.set_index(index);
  g.set_gid("::ffff:192.168.100.1");
  g.set_type("RoCE v2");
  g.set_netdev("enp1s0f0np0");
  return g;
}

TEST_F(StepsTest, PreflightSendsFabricSettingsAndPeersEchoPorts) {
  ctx_.topology.fabric_mtu = 9000;
  ctx_.topology.nccl_library = "/opt/nccl/libnccl.so.2";
  ctx_.topology.nccl_expected_version = "2.30.4";
  ctx_.topology.nodes[0].fabric_ip = "192.168.100.1";
  ctx_.topology.nodes[0].hca = "rocep1s0f0";
  ctx_.topology.nodes[0].netdev = "enp1s0f0np0";
  ctx_.topology.nodes[0].gid_index = 3;
  ctx_.topology.nodes[1].fabric_ip = "192.168.100.2";
  factory_.agents["n2"]->mtu_echo_port = 47190;
  ConnectStep(&factory_, RetryPolicy{}, FakeSleep()).Run(ctx_).IgnoreError();
  ASSERT_TRUE(PreflightStep().Run(ctx_).ok());
  const glm::v1::PreflightRequest r1 = factory_.agents["n1"]->last_preflight();
  EXPECT_EQ(r1.fabric_ip(), "192.168.100.1");
  EXPECT_EQ(r1.hca(), "rocep1s0f0");
  EXPECT_EQ(r1.netdev(), "enp1s0f0np0");
  EXPECT_FALSE(r1.gid_index_auto());
  EXPECT_EQ(r1.gid_index(), 3);
  EXPECT_EQ(r1.fabric_mtu(), 9000);
  EXPECT_EQ(r1.nccl_library(), "/opt/nccl/libnccl.so.2");
  EXPECT_EQ(r1.nccl_expected_version(), "2.30.4");
  ASSERT_EQ(r1.mtu_peers_size(), 1);
  EXPECT_EQ(r1.mtu_peers(0).node(), "n2");
  EXPECT_EQ(r1.mtu_peers(0).fabric_ip(), "192.168.100.2");
  EXPECT_EQ(r1.mtu_peers(0).port(), 47190);
  const glm::v1::PreflightRequest r2 = factory_.agents["n2"]->last_preflight();
  EXPECT_TRUE(r2.gid_index_auto());
  ASSERT_EQ(r2.mtu_peers_size(), 1);
  EXPECT_EQ(r2.mtu_peers(0).port(), 0) << "n1's agent serves no echo responder";
}

TEST_F(StepsTest, PreflightRecordsGidAndWarnsWhenNodesDisagree) {
  factory_.agents["n1"]->gid = Gid(3);
  factory_.agents["n2"]->gid = Gid(4);
  ConnectStep(&factory_, RetryPolicy{}, FakeSleep()).Run(ctx_).IgnoreError();
  ASSERT_TRUE(PreflightStep().Run(ctx_).ok());
  auto snap = state_.Snapshot();
  EXPECT_EQ(snap.nodes(0).gid().index(), 3);
  EXPECT_EQ(snap.nodes(1).gid().index(), 4);
  bool warned = false;
  for (auto& e : events_) {
    if (e.message().find("different GID indices") != std::string::npos) {
      warned = true;
      EXPECT_NE(e.message().find("index 3 on n1"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("index 4 on n2"), std::string::npos) << e.message();
    }
  }
  EXPECT_TRUE(warned);
  EXPECT_EQ(GidDisagreement({{"a", Gid(3)}, {"b", Gid(3)}}), "");
}

TEST_F(StepsTest, ClusterPreflightReportsEveryNodeAndUnreachableOnes) {
  factory_.agents["n1"]->gid = Gid(3);
  factory_.agents["n2"]->info_failures = 100;
  factory_.agents["n1"]->checks = {MakeCheck("gid.index", glm::v1::CHECK_STATUS_PASS)};
  glm::v1::ClusterPreflightResponse r = RunClusterPreflight(
      ctx_.topology, &factory_, RetryPolicy{.max_attempts = 2}, FakeSleep(), std::chrono::seconds(1));
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.nodes_size(), 2);
  EXPECT_TRUE(r.nodes(0).ok());
  EXPECT_EQ(r.nodes(0).gid().index(), 3);
  EXPECT_FALSE(r.nodes(1).ok());
  EXPECT_NE(r.nodes(1).error().find("127.0.0.1:2"), std::string::npos) << r.nodes(1).error();
  EXPECT_EQ(r.gid_warning(), "");
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_PENDING) << "no cluster state change";
}

TEST_F(StepsTest, PlanSetsReplicasAndRejectsUnknownNodes) {
  PlanStep ok([](const ClusterTopology&) -> absl::StatusOr<PlanStep::Outcome> {
    return PlanStep::Outcome{{{"n1", "n2"}}, "TP2"};
  });
  ASSERT_TRUE(ok.Run(ctx_).ok());
  EXPECT_EQ(state_.Snapshot().replicas_size(), 1);
  PlanStep bad([](const ClusterTopology&) -> absl::StatusOr<PlanStep::Outcome> {
    return PlanStep::Outcome{{{"n1", "zz"}}, ""};
  });
  EXPECT_EQ(bad.Run(ctx_).code(), absl::StatusCode::kInternal);
}

TEST_F(StepsTest, ValidateResetsStateAndRejectsEmptyClusters) {
  ValidateStep empty([]() -> absl::StatusOr<ClusterTopology> {
    ClusterTopology t;
    t.config_path = "x.yaml";
    return t;
  });
  EXPECT_EQ(empty.Run(ctx_).code(), absl::StatusCode::kInvalidArgument);
  ValidateStep bad([]() -> absl::StatusOr<ClusterTopology> {
    return absl::InvalidArgumentError("x.yaml:3:5: field `nodes[0].agent`: missing");
  });
  EXPECT_NE(bad.Run(ctx_).message().find("x.yaml:3:5"), absl::string_view::npos);
  ValidateStep good([]() -> absl::StatusOr<ClusterTopology> {
    ClusterTopology t;
    t.cluster_name = "c2";
    t.nodes = {{"m1", "h:1"}};
    return t;
  });
  ASSERT_TRUE(good.Run(ctx_).ok());
  EXPECT_EQ(state_.Snapshot().cluster_name(), "c2");
  EXPECT_EQ(state_.Snapshot().nodes_size(), 1);
}

}  // namespace
}  // namespace glm::orchestrate
