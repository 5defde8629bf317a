// A local 4-node cluster on loopback, all real processes: `glmctl up` starts glm-controller and
// four glm-agents (ports picked at run time), reaches Ready; kill -9 of an agent shows as
// Unreachable within 3 s; restarting it brings the node back to Ready; `glmctl down` stops all.
#include <signal.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

using std::chrono::seconds;

class LocalClusterTest : public LoopbackClusterTest {
 protected:
  LocalClusterTest() : LoopbackClusterTest("itest") {}
  void SetUp() override {
    ClusterYaml cluster;
    cluster.local = true;
    cluster.parallel_lines = "  tensor: 4\n  pipeline: 1\n  replicas: 1\n";
    for (int i = 1; i <= 4; ++i) cluster.nodes.push_back({absl::StrCat("node-", i), ""});
    WriteClusterYaml(cluster);
  }

  int AgentPid(const std::string& node) const { return RunDirPid("agent-" + node); }
};

TEST_F(LocalClusterTest, UpKillRestartDown) {
  // Bring-up.
  CommandResult up = Glmctl({"up", yaml_}, seconds(90));
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("is up"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("[Preflight] node-3"), std::string::npos) << up.output;
  // The Stage phase: every node verified the shared model directory, NCCL was not configured.
  for (int i = 1; i <= 4; ++i) {
    EXPECT_NE(up.output.find(absl::StrCat("[Stage] node-", i, ": ")), std::string::npos)
        << up.output;
  }
  EXPECT_NE(up.output.find("present and verified"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("names no NCCL library; skipped"), std::string::npos) << up.output;
  EXPECT_EQ(up.output.find("\x1b["), std::string::npos) << "not a TTY: plain lines only";

  CommandResult health = Glmctl({"health", yaml_}, seconds(10));
  EXPECT_EQ(health.exit_code, 0) << health.output;

  // Idempotent: a second `up` is a no-op that says so.
  CommandResult again = Glmctl({"up", yaml_}, seconds(30));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("already up"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("started "), std::string::npos) << again.output;

  nlohmann::json status;
  ASSERT_EQ(NodeState("node-1", &status), "Ready");
  EXPECT_EQ(status["phase"], "Ready");
  ASSERT_EQ(status["nodes"].size(), 4u);
  for (const auto& n : status["nodes"]) {
    EXPECT_EQ(n["state"], "Ready") << n.dump();
    EXPECT_EQ(n["version"], "0.1.0") << n.dump();
    EXPECT_GE(n["uptime_ms"].get<int64_t>(), 0);
  }
  ASSERT_EQ(status["replicas"].size(), 1u);
  EXPECT_EQ(status["replicas"][0]["state"], "Ready");

  // kill -9 one agent: Unreachable within 3 s.
  int pid = AgentPid("node-2");
  ASSERT_GT(pid, 1);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  auto detected = PollUntil([&] { return NodeState("node-2", &status) == "Unreachable"; },
                            seconds(3));
  ASSERT_GE(detected.count(), 0) << "node-2 not Unreachable within 3 s: " << status.dump(2);
  std::cout << "[ measure ] kill -9 -> Unreachable in glmctl status: " << detected.count()
            << " ms\n";
  EXPECT_EQ(status["replicas"][0]["state"], "Failed");
  for (const auto& n : status["nodes"]) {
    if (n["name"] == "node-2") {
      EXPECT_FALSE(n["last_error"].get<std::string>().empty());
    }
  }
  CommandResult sick = Glmctl({"health", yaml_}, seconds(10));
  EXPECT_EQ(sick.exit_code, 1) << sick.output;
  EXPECT_NE(sick.output.find("node-2"), std::string::npos) << sick.output;

  // Restart the agent by hand (same command line): the controller reconnects on its own.
  int restarted = SpawnBackground(
      {AgentBin(), "serve", "--listen", AgentAddress(1), "--node", "node-2"},
      run_dir_ + "/agent-node-2.log");
  pids_.push_back(restarted);
  // It is alive again but holds no shard: Degraded, naming the shard and the fix.
  auto reconnected =
      PollUntil([&] { return NodeState("node-2", &status) == "Degraded"; }, seconds(15));
  ASSERT_GE(reconnected.count(), 0) << status.dump(2);
  std::cout << "[ measure ] agent restart -> Degraded (no shard): " << reconnected.count()
            << " ms\n";
  for (const auto& n : status["nodes"]) {
    if (n["name"] == "node-2") {
      EXPECT_NE(n["last_error"].get<std::string>().find("glmctl up"), std::string::npos) << n;
    }
  }
  CommandResult degraded = Glmctl({"health", yaml_}, seconds(10));
  EXPECT_NE(degraded.exit_code, 0) << degraded.output;
  // `glmctl up` reloads it (the other shards are already loaded) and the cluster is Ready.
  CommandResult reup = Glmctl({"up", yaml_}, seconds(60));
  EXPECT_EQ(reup.exit_code, 0) << reup.output;
  auto recovered = PollUntil([&] { return NodeState("node-2", &status) == "Ready"; }, seconds(15));
  ASSERT_GE(recovered.count(), 0) << status.dump(2);
  EXPECT_EQ(status["replicas"][0]["state"], "Ready");
  EXPECT_EQ(Glmctl({"health", yaml_}, seconds(10)).exit_code, 0);

  // Down stops the controller and the agents glmctl started.
  KillNow(restarted);  // ours, not in the run dir's pid file
  pids_.clear();
  std::vector<int> pids;
  for (int i : {1, 3, 4}) pids.push_back(AgentPid(absl::StrCat("node-", i)));
  pids.push_back(RunDirPid("controller"));
  CommandResult down = Glmctl({"down", yaml_}, seconds(30));
  EXPECT_EQ(down.exit_code, 0) << down.output;
  for (int p : pids) {
    EXPECT_GE(PollUntil([&] { return !ProcessAlive(p); }, seconds(10)).count(), 0) << p;
  }
  CommandResult after = Glmctl({"status", yaml_}, seconds(10));
  EXPECT_EQ(after.exit_code, 3) << after.output;
}

TEST_F(LocalClusterTest, ValidateAndUnreachableControllerErrors) {
  CommandResult v = Glmctl({"validate", yaml_}, seconds(10));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  WriteFile(dir_->path() + "/bad.yaml", "name: x\nnodez: []\n");
  CommandResult bad = Glmctl({"validate", dir_->path() + "/bad.yaml"}, seconds(10));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("bad.yaml:2"), std::string::npos) << bad.output;
  CommandResult status = Glmctl({"status", yaml_}, seconds(10));
  EXPECT_EQ(status.exit_code, 3) << status.output;
  EXPECT_NE(status.output.find(absl::StrCat("127.0.0.1:", ports_[0])), std::string::npos)
      << status.output;
}

}  // namespace
}  // namespace glm::testing
