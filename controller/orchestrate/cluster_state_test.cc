#include "controller/orchestrate/cluster_state.h"

#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

class ClusterStateTest : public ::testing::Test {
 protected:
  ClusterStateTest() : state_(&clock_) {
    ClusterTopology t;
    t.cluster_name = "demo";
    t.config_path = "demo.yaml";
    t.nodes = {{"a", "h:1"}, {"b", "h:2"}, {"c", "h:3"}, {"d", "h:4"}};
    state_.Reset(t);
  }
  FakeClock clock_;
  ClusterState state_;
};

TEST_F(ClusterStateTest, FreshStateListsNodesPendingAndIsNotHealthy) {
  auto snap = state_.Snapshot();
  EXPECT_EQ(snap.cluster_name(), "demo");
  ASSERT_EQ(snap.nodes_size(), 4);
  EXPECT_EQ(snap.nodes(2).name(), "c");
  EXPECT_EQ(snap.nodes(2).state(), glm::v1::NODE_STATE_PENDING);
  EXPECT_EQ(snap.nodes(2).last_heartbeat_age_ms(), -1);
  std::string why;
  EXPECT_FALSE(state_.Healthy(&why));
  EXPECT_NE(why.find("IDLE"), std::string::npos) << why;
}

TEST_F(ClusterStateTest, ReplicaStateIsDerivedFromItsNodes) {
  state_.SetReplicas({{"a", "b"}, {"c", "d"}});
  state_.SetPhase(glm::v1::BRING_UP_PHASE_READY);
  for (const char* n : {"a", "b", "c", "d"}) state_.SetNodeState(n, glm::v1::NODE_STATE_READY);
  std::string why;
  EXPECT_TRUE(state_.Healthy(&why)) << why;
  state_.SetNodeState("c", glm::v1::NODE_STATE_UNREACHABLE, "stream broken");
  auto snap = state_.Snapshot();
  EXPECT_EQ(snap.replicas(0).state(), glm::v1::REPLICA_STATE_READY);
  EXPECT_EQ(snap.replicas(1).state(), glm::v1::REPLICA_STATE_FAILED);
  EXPECT_EQ(snap.nodes(2).replica(), 1);
  EXPECT_FALSE(state_.Healthy(&why));
  EXPECT_NE(why.find("replica 1 is FAILED (c UNREACHABLE)"), std::string::npos) << why;
  state_.SetNodeState("c", glm::v1::NODE_STATE_CONNECTED);
  EXPECT_EQ(state_.Snapshot().replicas(1).state(), glm::v1::REPLICA_STATE_PENDING);
}

TEST_F(ClusterStateTest, HeartbeatAgeComesFromTheClock) {
  glm::v1::AgentStatus s;
  s.set_version(3);
  s.set_instance_id("x");
  s.set_gid_fingerprint("xxh64:00112233aabbccdd");
  state_.RecordStatus("a", s);
  clock_.Advance(std::chrono::milliseconds(1500));
  auto snap = state_.Snapshot();
  EXPECT_EQ(snap.nodes(0).last_heartbeat_age_ms(), 1500);
  EXPECT_EQ(snap.nodes(0).status_version(), 3);
  EXPECT_EQ(snap.nodes(0).gid_fingerprint(), "xxh64:00112233aabbccdd");
}

TEST_F(ClusterStateTest, NoReplicasIsNotHealthy) {
  state_.SetPhase(glm::v1::BRING_UP_PHASE_READY);
  std::string why;
  EXPECT_FALSE(state_.Healthy(&why));
  EXPECT_NE(why.find("no replicas"), std::string::npos);
}

}  // namespace
}  // namespace glm::orchestrate
