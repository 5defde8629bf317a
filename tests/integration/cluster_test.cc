// A local 4-node cluster on loopback, all real processes: `glmctl up` starts glm-controller and
// four glm-agents (ports picked at run time), reaches Ready; kill -9 of an agent takes the replica
// out of service within 3 s, and the launcher and self-healing bring it back with no command;
// `glmctl down` stops all.
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

  // kill -9 one agent: its replica leaves service within 3 s (the group breaks, health fails).
  int pid = AgentPid("node-2");
  ASSERT_GT(pid, 1);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  auto detected = PollUntil(
      [&] {
        nlohmann::json s = StatusJson();
        if (s.is_null()) return false;
        status = s;
        return s["replicas"][0]["state"] != "Ready";
      },
      seconds(3));
  ASSERT_GE(detected.count(), 0) << "replica 0 still Ready 3 s after kill -9: " << status.dump(2);
  std::cout << "[ measure ] kill -9 -> replica out of service in glmctl status: "
            << detected.count() << " ms\n";

  // No command: the launcher restarts the agent (a new pid), the controller's self-healing
  // reloads the replica's shards, runs the canary and re-admits it.
  auto healed = PollUntil(
      [&] {
        nlohmann::json s = StatusJson();
        if (s.is_null()) return false;
        status = s;
        return s["replicas"][0]["state"] == "Ready";
      },
      seconds(60));
  ASSERT_GE(healed.count(), 0) << status.dump(2);
  std::cout << "[ measure ] replica out of service -> healed: " << healed.count() << " ms\n";
  EXPECT_NE(AgentPid("node-2"), pid);
  EXPECT_EQ(status["replicas"][0]["auto_restarts"], 1) << status.dump(2);
  EXPECT_EQ(Glmctl({"health", yaml_}, seconds(10)).exit_code, 0);
  CommandResult reup = Glmctl({"up", yaml_}, seconds(60));
  EXPECT_EQ(reup.exit_code, 0) << reup.output;
  EXPECT_NE(reup.output.find("already up"), std::string::npos) << reup.output;

  // Down stops the controller, the agents glmctl started and their supervisors.
  std::vector<int> pids;
  for (int i : {1, 2, 3, 4}) pids.push_back(AgentPid(absl::StrCat("node-", i)));
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
  // The planner's MTP acceptance: a number in [0, 1], or "measured" from a running cluster.
  CommandResult wrong = Glmctl({"plan", yaml_, "--mtp-acceptance", "1.5"}, seconds(10));
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_NE(wrong.output.find("'1.5' is neither a number in [0, 1] nor 'measured'"),
            std::string::npos)
      << wrong.output;
  CommandResult measured = Glmctl({"plan", yaml_, "--mtp-acceptance", "measured"}, seconds(10));
  EXPECT_NE(measured.exit_code, 0) << measured.output;
  EXPECT_NE(measured.output.find("--mtp-acceptance measured: cannot read the cluster's status"),
            std::string::npos)
      << measured.output;
}

}  // namespace
}  // namespace glm::testing
