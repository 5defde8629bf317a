// `glmctl logs` through the real daemons on loopback: a controller and two agents started by the
// test (not a local cluster), each serving its own in-memory log ring.
//   - `glmctl logs cluster.yaml node-1 --tail 50` prints that agent's lines ("agent started");
//     NODE `controller` prints the controller's.
//   - An unknown node fails (exit 2) naming the known nodes; a dead agent fails (exit 1) naming
//     the node, its address and the fix.
//   - `--follow` prints a line the agent logs after the command started (a preflight the test
//     triggers), and SIGINT ends it with exit 0.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

using std::chrono::seconds;

class LogsClusterTest : public LoopbackClusterTest {
 protected:
  LogsClusterTest() : LoopbackClusterTest("logtest") {}
  void SetUp() override {
    ClusterYaml cluster;
    cluster.nodes = {{"node-1", ""}, {"node-2", ""}};
    WriteClusterYaml(cluster);
    agent_pids_.push_back(StartAgent(0, {"--allow-no-gpu"}));
    agent_pids_.push_back(StartAgent(1, {"--allow-no-gpu"}));
    StartController();
    ASSERT_NO_FATAL_FAILURE(WaitForPorts());
  }
  std::vector<int> agent_pids_;
};

TEST_F(LogsClusterTest, TailOfAnAgentAndOfTheController) {
  CommandResult logs = Glmctl({"logs", yaml_, "node-1", "--tail", "50"}, seconds(30));
  ASSERT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_NE(logs.output.find("agent started node=node-1"), std::string::npos) << logs.output;
  EXPECT_EQ(logs.output.find("node=node-2"), std::string::npos) << "node-1's ring only";
  EXPECT_EQ(logs.output.find('\x1b'), std::string::npos) << "no color codes: " << logs.output;

  CommandResult one = Glmctl({"logs", yaml_, "node-2", "--tail", "1"}, seconds(30));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(std::count(one.output.begin(), one.output.end(), '\n'), 1) << one.output;

  CommandResult controller = Glmctl({"logs", yaml_, "controller"}, seconds(30));
  ASSERT_EQ(controller.exit_code, 0) << controller.output;
  EXPECT_NE(controller.output.find("controller started"), std::string::npos) << controller.output;
}

TEST_F(LogsClusterTest, UnknownNodeAndDeadAgentFailNamingTheFix) {
  CommandResult unknown = Glmctl({"logs", yaml_, "node-9"}, seconds(30));
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  for (const char* want : {"node-9", "node-1", "node-2", "controller"}) {
    EXPECT_NE(unknown.output.find(want), std::string::npos) << want << ": " << unknown.output;
  }
  CommandResult negative = Glmctl({"logs", yaml_, "node-1", "--tail", "-3"}, seconds(30));
  EXPECT_EQ(negative.exit_code, 2) << negative.output;

  KillNow(agent_pids_[1]);
  CommandResult dead = Glmctl({"logs", yaml_, "node-2"}, seconds(30));
  EXPECT_EQ(dead.exit_code, 1) << dead.output;
  for (const std::string& want : {std::string("node-2"), AgentAddress(1), std::string("Fix:")}) {
    EXPECT_NE(dead.output.find(want), std::string::npos) << want << ": " << dead.output;
  }
}

TEST_F(LogsClusterTest, FollowShowsANewLineAndCtrlCEndsItCleanly) {
  const std::string out = dir_->path() + "/follow.out";
  int pid = SpawnBackground({GlmctlBin(), "logs", yaml_, "node-1", "--follow", "--tail", "5"}, out);
  pids_.push_back(pid);  // killed at TearDown if the test fails before it exits
  // The tail arrived: the stream is open and following.
  ASSERT_GE(PollUntil([&] { return ReadFile(out).find("agent started") != std::string::npos; },
                      seconds(20))
                .count(),
            0)
      << ReadFile(out);
  EXPECT_EQ(ReadFile(out).find("preflight node=node-1"), std::string::npos);

  // Something the agent logs now: the controller's preflight runs node-1's checks.
  CommandResult preflight = Glmctl({"preflight", yaml_}, seconds(60));
  EXPECT_NE(preflight.output.find("node-1"), std::string::npos) << preflight.output;
  ASSERT_GE(
      PollUntil([&] { return ReadFile(out).find("preflight node=node-1") != std::string::npos; },
                seconds(20))
          .count(),
      0)
      << ReadFile(out);

  // Ctrl-C: the stream is cancelled and glmctl exits 0.
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = -1;
  auto exited = PollUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, seconds(20));
  ASSERT_GE(exited.count(), 0) << "glmctl logs --follow did not end on SIGINT: " << ReadFile(out);
  pids_.erase(std::remove(pids_.begin(), pids_.end(), pid), pids_.end());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadFile(out);

  // The agent stopped following too: its ring stream ended, and a new tail still works.
  CommandResult again = Glmctl({"logs", yaml_, "node-1", "--tail", "3"}, seconds(30));
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

}  // namespace
}  // namespace glm::testing
