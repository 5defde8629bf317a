// Health monitor with a FakeClock: no sleeps, timeouts fired by advancing the clock.
#include "controller/orchestrate/health_monitor.h"

#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

using std::chrono::milliseconds;

glm::v1::AgentStatus Msg(const std::string& instance, int64_t version, bool heartbeat = false) {
  glm::v1::AgentStatus s;
  s.set_instance_id(instance);
  s.set_version(version);
  s.set_heartbeat(heartbeat);
  return s;
}

class HealthMonitorTest : public ::testing::Test {
 protected:
  HealthMonitorTest() : state_(&clock_), monitor_(&clock_, &state_) {
    ClusterTopology t;
    t.cluster_name = "c";
    t.nodes = {{"n1", "127.0.0.1:1"}, {"n2", "127.0.0.1:2"}};
    state_.Reset(t);
    state_.SetReplicas({{"n1", "n2"}});
  }
  void ArmBoth() {
    for (const char* n : {"n1", "n2"}) {
      state_.SetNodeState(n, glm::v1::NODE_STATE_READY);
      monitor_.Arm(n);
    }
  }
  glm::v1::ReplicaState Replica() { return state_.Snapshot().replicas(0).state(); }

  FakeClock clock_;
  ClusterState state_;
  HealthMonitor monitor_;
};

TEST_F(HealthMonitorTest, HeartbeatsKeepANodeReady) {
  ArmBoth();
  for (int i = 0; i < 10; ++i) {
    monitor_.OnStatus("n1", Msg("a", 1, true));
    monitor_.OnStatus("n2", Msg("b", 1, true));
    clock_.Advance(milliseconds(1000));
    EXPECT_TRUE(monitor_.Tick().empty());
  }
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_READY);
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_READY);
}

TEST_F(HealthMonitorTest, SilenceOverThreeSecondsMakesUnreachableAndFailsTheReplica) {
  ArmBoth();
  monitor_.OnStatus("n1", Msg("a", 1));
  monitor_.OnStatus("n2", Msg("b", 1));
  clock_.Advance(milliseconds(3000));
  monitor_.OnStatus("n2", Msg("b", 1, true));
  EXPECT_TRUE(monitor_.Tick().empty());  // exactly 3 s is still alive
  clock_.Advance(milliseconds(1));
  auto timed_out = monitor_.Tick();
  ASSERT_EQ(timed_out, std::vector<std::string>{"n1"});
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_UNREACHABLE);
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_READY);
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_FAILED);
  auto snap = state_.Snapshot();
  EXPECT_NE(snap.nodes(0).last_error().find("no heartbeat for 3.0 s"), std::string::npos)
      << snap.nodes(0).last_error();
  EXPECT_TRUE(monitor_.Tick().empty());  // reported once
}

TEST_F(HealthMonitorTest, BrokenStreamIsImmediatelyUnreachableAndRecoversOnNewInstance) {
  ArmBoth();
  monitor_.OnStatus("n1", Msg("a", 5));
  monitor_.OnStreamBroken("n1", "127.0.0.1:1: connection reset");
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_UNREACHABLE);
  EXPECT_NE(state_.Snapshot().nodes(0).last_error().find("connection reset"), std::string::npos);
  EXPECT_FALSE(monitor_.alive("n1"));
  // The agent restarts: a new instance starts its versions again at 1.
  clock_.Advance(milliseconds(10000));
  EXPECT_TRUE(monitor_.OnStatus("n1", Msg("a2", 1)));
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_READY);
  EXPECT_EQ(state_.Snapshot().nodes(0).last_error(), "");
  EXPECT_EQ(state_.Snapshot().nodes(0).instance_id(), "a2");
}

TEST_F(HealthMonitorTest, StaleVersionsOfTheSameInstanceAreDropped) {
  ArmBoth();
  EXPECT_TRUE(monitor_.OnStatus("n1", Msg("a", 7)));
  EXPECT_FALSE(monitor_.OnStatus("n1", Msg("a", 6)));
  EXPECT_TRUE(monitor_.OnStatus("n1", Msg("a", 7, true)));  // heartbeat repeats the version
  EXPECT_EQ(state_.Snapshot().nodes(0).status_version(), 7);
}

TEST_F(HealthMonitorTest, ArmingGivesTheWatcherOneTimeoutToConnect) {
  ArmBoth();
  clock_.Advance(milliseconds(2999));
  EXPECT_TRUE(monitor_.Tick().empty());
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_READY);
  clock_.Advance(milliseconds(2));
  EXPECT_EQ(monitor_.Tick().size(), 2u);
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_UNREACHABLE);
}

TEST_F(HealthMonitorTest, UnarmedNodesAreLeftToBringUp) {
  state_.SetNodeState("n1", glm::v1::NODE_STATE_PREFLIGHT);
  monitor_.OnStatus("n1", Msg("a", 1));
  monitor_.OnStreamBroken("n1", "gone");
  clock_.Advance(milliseconds(10000));
  monitor_.Tick();
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_PREFLIGHT);
  // DisarmAll stops driving armed nodes too.
  ArmBoth();
  monitor_.DisarmAll();
  monitor_.OnStreamBroken("n2", "gone");
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_READY);
}

TEST_F(HealthMonitorTest, HeartbeatAfterTimeoutRestoresReady) {
  ArmBoth();
  monitor_.OnStatus("n1", Msg("a", 1));
  clock_.Advance(milliseconds(4000));
  monitor_.Tick();
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_UNREACHABLE);
  monitor_.OnStatus("n1", Msg("a", 1, true));
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_READY);
}

TEST_F(HealthMonitorTest, DegradedStatusMarksTheNodeDegradedWithTheMessage) {
  ArmBoth();
  ASSERT_TRUE(monitor_.OnStatus("n1", Msg("a", 1)));
  ASSERT_TRUE(monitor_.OnStatus("n2", Msg("b", 1)));
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_READY);
  glm::v1::AgentStatus d = Msg("a", 2);
  d.set_degraded(true);
  d.set_degraded_message("gid.index changed on node n1: index 3 -> index 5");
  ASSERT_TRUE(monitor_.OnStatus("n1", d));
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_DEGRADED);
  EXPECT_EQ(state_.Snapshot().nodes(0).last_error(), d.degraded_message());
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_DEGRADED);
  std::string why;
  EXPECT_FALSE(state_.Healthy(&why));
  // Heartbeats repeat the degraded state; a silent node still becomes Unreachable.
  d.set_heartbeat(true);
  ASSERT_TRUE(monitor_.OnStatus("n1", d));
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_DEGRADED);
  // Cleared by the agent: Ready again.
  ASSERT_TRUE(monitor_.OnStatus("n1", Msg("a", 3)));
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_READY);
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_READY);
}

glm::v1::AgentStatus WithShard(glm::v1::AgentStatus s, glm::v1::ShardState state) {
  s.set_shard_state(state);
  s.mutable_shard()->set_state(state);
  return s;
}

TEST_F(HealthMonitorTest, NodeWhoseLoadedShardIsGoneIsDegradedUntilReloaded) {
  for (const char* n : {"n1", "n2"}) {
    state_.SetNodeState(n, glm::v1::NODE_STATE_READY);
    monitor_.Arm(n, /*expect_shard=*/true);
  }
  ASSERT_TRUE(monitor_.OnStatus("n1", WithShard(Msg("a", 1), glm::v1::SHARD_STATE_LOADED)));
  ASSERT_TRUE(monitor_.OnStatus("n2", WithShard(Msg("b", 1), glm::v1::SHARD_STATE_LOADED)));
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_READY);
  // n2's agent restarts: alive, but its new instance holds no shard.
  ASSERT_TRUE(monitor_.OnStatus("n2", WithShard(Msg("c", 1), glm::v1::SHARD_STATE_NONE)));
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_DEGRADED);
  const std::string why = state_.Snapshot().nodes(1).last_error();
  EXPECT_NE(why.find("engine shard is NONE"), std::string::npos) << why;
  EXPECT_NE(why.find("glmctl restart --replica"), std::string::npos) << why;
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_DEGRADED);
  // A failed shard reads the same way; a reload (Loaded) makes the node Ready again.
  ASSERT_TRUE(monitor_.OnStatus("n2", WithShard(Msg("c", 2), glm::v1::SHARD_STATE_FAILED)));
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_DEGRADED);
  ASSERT_TRUE(monitor_.OnStatus("n2", WithShard(Msg("c", 3), glm::v1::SHARD_STATE_LOADED)));
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_READY);
  EXPECT_EQ(Replica(), glm::v1::REPLICA_STATE_READY);
}

TEST_F(HealthMonitorTest, ShardStateIsIgnoredWhenBringUpLoadedNone) {
  ArmBoth();  // expect_shard = false
  ASSERT_TRUE(monitor_.OnStatus("n1", WithShard(Msg("a", 1), glm::v1::SHARD_STATE_NONE)));
  EXPECT_EQ(state_.node_state("n1"), glm::v1::NODE_STATE_READY);
}

}  // namespace
}  // namespace glm::orchestrate
