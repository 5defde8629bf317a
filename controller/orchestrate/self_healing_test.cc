// Self-healing's pieces: the restart budget's sliding window, which replicas a reconcile pass
// restarts (all agents alive, not serving, not already being restarted, budget left), the
// cluster's health derived from its replicas and the controller's replica modes.
#include "controller/orchestrate/self_healing.h"

#include "controller/orchestrate/cluster_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(RestartBudgetTest, SlidingWindow) {
  FakeClock clock;
  RestartBudget budget(2, std::chrono::seconds(60));
  EXPECT_TRUE(budget.Allows(0, clock.Now()));
  budget.Record(0, clock.Now());
  clock.Advance(std::chrono::seconds(10));
  budget.Record(0, clock.Now());
  EXPECT_FALSE(budget.Allows(0, clock.Now()));
  EXPECT_TRUE(budget.Allows(1, clock.Now()));  // per replica
  EXPECT_EQ(budget.Count(0, clock.Now()), 2);
  clock.Advance(std::chrono::seconds(50));     // the first leaves the window
  EXPECT_EQ(budget.Count(0, clock.Now()), 1);
  EXPECT_TRUE(budget.Allows(0, clock.Now()));
  budget.Reset(0);
  EXPECT_EQ(budget.Count(0, clock.Now()), 0);
  RestartBudget none(0, std::chrono::seconds(60));
  EXPECT_FALSE(none.Allows(0, clock.Now()));
}

class HealTest : public ::testing::Test {
 protected:
  HealTest() : state_(&clock_) {
    ClusterTopology t;
    t.cluster_name = "t";
    for (int i = 0; i < 4; ++i) {
      NodeEndpoint n;
      n.name = "n" + std::to_string(i);
      n.replica = i / 2;
      t.nodes.push_back(n);
    }
    state_.Reset(t);
    state_.SetReplicas({{"n0", "n1"}, {"n2", "n3"}});
    state_.SetPhase(glm::v1::BRING_UP_PHASE_READY);
    for (int i = 0; i < 4; ++i) SetNode(i, glm::v1::NODE_STATE_READY, glm::v1::SHARD_STATE_RUNNING);
  }
  void SetNode(int i, glm::v1::NodeState node, glm::v1::ShardState shard) {
    state_.SetNodeState("n" + std::to_string(i), node);
    glm::v1::ShardStatus s;
    s.set_state(shard);
    state_.SetNodeShard("n" + std::to_string(i), s);
  }
  std::vector<int> Heal(std::function<bool(int)> may = nullptr) {
    return ReplicasToHeal(
        state_.Snapshot(), [this](const std::string& n) { return dead_ != n; },
        may ? may : [](int) { return true; });
  }

  FakeClock clock_;
  ClusterState state_;
  std::string dead_;
};

TEST_F(HealTest, WaitsForEveryAgentThenRestartsTheBrokenGroupOnly) {
  EXPECT_THAT(Heal(), IsEmpty());
  std::string why;
  EXPECT_EQ(state_.Health(&why), glm::v1::CLUSTER_HEALTH_READY);

  // n1's agent dies: its node is Unreachable, n0's shard failed with the group.
  dead_ = "n1";
  SetNode(1, glm::v1::NODE_STATE_UNREACHABLE, glm::v1::SHARD_STATE_UNSPECIFIED);
  SetNode(0, glm::v1::NODE_STATE_READY, glm::v1::SHARD_STATE_FAILED);
  EXPECT_THAT(Heal(), IsEmpty());  // not every agent answers yet
  EXPECT_EQ(state_.Health(&why), glm::v1::CLUSTER_HEALTH_DEGRADED);
  EXPECT_THAT(why, HasSubstr("replica 0 is failed"));

  // It comes back without a shard (Degraded): the group is restarted.
  dead_.clear();
  SetNode(1, glm::v1::NODE_STATE_DEGRADED, glm::v1::SHARD_STATE_UNSPECIFIED);
  EXPECT_THAT(Heal(), ElementsAre(0));
  EXPECT_THAT(Heal([](int r) { return r != 0; }), IsEmpty());  // budget exhausted

  // While the controller restarts it, nothing else does.
  state_.SetReplicaMode(0, ReplicaMode::kRestarting, "self-healing: reloading");
  EXPECT_THAT(Heal(), IsEmpty());
  glm::v1::ClusterStatus snap = state_.Snapshot();
  EXPECT_EQ(snap.replicas(0).state(), glm::v1::REPLICA_STATE_RESTARTING);
  EXPECT_EQ(snap.replicas(0).message(), "self-healing: reloading");
}

TEST_F(HealTest, DegradedWithRunningShardsIsLeftAlone) {
  SetNode(2, glm::v1::NODE_STATE_DEGRADED, glm::v1::SHARD_STATE_RUNNING);  // GID entry moved
  EXPECT_THAT(Heal(), IsEmpty());
  // A replica the controller holds (a restart failed its canary) is retried while allowed.
  state_.SetReplicaMode(1, ReplicaMode::kHeld, "canary failed");
  EXPECT_THAT(Heal(), ElementsAre(1));
}

TEST_F(HealTest, ClusterHealthFollowsReplicasAndModes) {
  std::string why;
  state_.SetReplicaMode(0, ReplicaMode::kDraining, "rolling restart: draining");
  EXPECT_EQ(state_.Health(&why), glm::v1::CLUSTER_HEALTH_DEGRADED);
  EXPECT_THAT(why, HasSubstr("replica 0 is draining: rolling restart: draining"));
  std::string healthy_why;
  EXPECT_FALSE(state_.Healthy(&healthy_why));
  state_.SetReplicaMode(1, ReplicaMode::kHeld, "restart budget exhausted");
  EXPECT_EQ(state_.Health(&why), glm::v1::CLUSTER_HEALTH_FAILED);
  state_.SetReplicaMode(0, ReplicaMode::kServe);
  state_.SetReplicaMode(1, ReplicaMode::kServe);
  EXPECT_EQ(state_.Health(&why), glm::v1::CLUSTER_HEALTH_READY);
  state_.SetPhase(glm::v1::BRING_UP_PHASE_LOAD);
  EXPECT_EQ(state_.Health(&why), glm::v1::CLUSTER_HEALTH_PENDING);
  state_.SetPhase(glm::v1::BRING_UP_PHASE_FAILED, "canary failed");
  EXPECT_EQ(state_.Health(&why), glm::v1::CLUSTER_HEALTH_FAILED);
  EXPECT_THAT(why, HasSubstr("canary failed"));
}

}  // namespace
}  // namespace glm::orchestrate
