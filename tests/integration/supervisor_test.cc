// `glmctl supervise` (controller/cli/supervisor.h) around dummy children: kill -9 restarts the
// child with a new pid and rewrites the pid file, a clean exit ends supervision, SIGTERM stops
// child and supervisor (SIGKILL after the grace), the start limit makes it give up and say why.
// Then a local cluster: `glmctl up` runs every agent under a supervisor, a kill -9'd agent's
// port is served by a new pid within 10 s, `glmctl down` leaves no agent or supervisor behind.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The open fds of a process: fd number -> what it points at.
std::map<int, std::string> OpenFds(int pid) {
  std::map<int, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), ec)) {
    std::error_code link_ec;
    out[std::atoi(e.path().filename().c_str())] = fs::read_symlink(e.path(), link_ec).string();
  }
  return out;
}

std::string Exe(int pid) {
  std::error_code ec;
  return fs::read_symlink(absl::StrCat("/proc/", pid, "/exe"), ec).string();
}

class SupervisorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const int child = ChildPid();
    if (supervisor_ > 0) KillNow(supervisor_);
    if (ProcessAlive(child)) KillNow(child);
    if (HasFailure()) {
      std::cerr << "==== " << log_ << "\n" << ReadFile(log_) << "==== supervisor stdout/stderr\n"
                << ReadFile(dir_.path() + "/supervisor.out");
    }
  }

  // Starts `glmctl supervise <flags> -- <child>` as this test's child.
  void Start(const std::vector<std::string>& flags, const std::vector<std::string>& child) {
    std::vector<std::string> argv = {GlmctlBin(), "supervise", "--name",   "dummy",
                                     "--pid-file", pid_file_,  "--log",    log_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    argv.insert(argv.end(), child.begin(), child.end());
    supervisor_ = SpawnBackground(argv, dir_.path() + "/supervisor.out");
    ASSERT_GT(supervisor_, 0);
  }

  // The pid the supervisor recorded; 0 when there is no pid file.
  int ChildPid() const { return std::atoi(ReadFile(pid_file_).c_str()); }

  // Waits for a live child running `exe_suffix` other than `old`; returns its pid or 0.
  int WaitChild(int old, const std::string& exe_suffix, milliseconds timeout = seconds(5)) {
    int pid = 0;
    PollUntil(
        [&] {
          pid = ChildPid();
          const std::string exe = Exe(pid);
          return pid > 0 && pid != old && ProcessAlive(pid) && exe.size() >= exe_suffix.size() &&
                 exe.compare(exe.size() - exe_suffix.size(), exe_suffix.size(), exe_suffix) == 0;
        },
        timeout, milliseconds(10));
    return pid > 0 && pid != old && ProcessAlive(pid) ? pid : 0;
  }

  // Reaps the supervisor (our child) within `timeout`; its wait status, or -1 if still running.
  int WaitExit(milliseconds timeout) {
    int status = -1;
    PollUntil(
        [&] {
          int s = 0;
          if (::waitpid(supervisor_, &s, WNOHANG) != supervisor_) return false;
          status = s;
          supervisor_ = 0;
          return true;
        },
        timeout, milliseconds(10));
    return status;
  }

  TempDir dir_{"glm-supervise"};
  const std::string pid_file_ = dir_.path() + "/dummy.pid";
  const std::string log_ = dir_.path() + "/dummy.log";
  int supervisor_ = 0;
};

TEST_F(SupervisorTest, KillNineRestartsTheChildWithANewPidAndBacksOff) {
  Start({"--first-delay-ms", "50"}, {"/bin/sleep", "600"});
  const int first = WaitChild(0, "sleep");
  ASSERT_GT(first, 0) << "no child within 5 s";
  // The child's stdio is the log; it holds nothing else of the supervisor's.
  std::map<int, std::string> fds = OpenFds(first);
  EXPECT_EQ(fds.size(), 3u);
  EXPECT_EQ(fds[1], log_);
  EXPECT_EQ(fds[2], log_);

  ASSERT_EQ(::kill(first, SIGKILL), 0);
  const int second = WaitChild(first, "sleep");
  ASSERT_GT(second, 0) << "not restarted within 5 s";
  EXPECT_TRUE(ProcessAlive(supervisor_));
  std::string log = ReadFile(log_);
  EXPECT_TRUE(Contains(log, absl::StrCat("dummy (pid ", first, ") killed by signal 9")));
  EXPECT_TRUE(Contains(log, "restarting in 50 ms (restart 1)")) << log;

  // A second failure waits twice as long.
  ASSERT_EQ(::kill(second, SIGKILL), 0);
  ASSERT_GT(WaitChild(second, "sleep"), 0) << "not restarted within 5 s";
  log = ReadFile(log_);
  EXPECT_TRUE(Contains(log, absl::StrCat("dummy (pid ", second, ") killed by signal 9")));
  EXPECT_TRUE(Contains(log, "restarting in 100 ms (restart 2)")) << log;
}

TEST_F(SupervisorTest, ACleanExitEndsSupervision) {
  Start({}, {"/bin/sh", "-c", "exit 0"});
  const int status = WaitExit(seconds(5));
  ASSERT_NE(status, -1) << "supervisor still running 5 s after its child exited 0";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string log = ReadFile(log_);
  EXPECT_TRUE(Contains(log, "exited cleanly (status 0); not restarting")) << log;
  EXPECT_FALSE(Contains(log, "restarting in")) << log;
  EXPECT_FALSE(fs::exists(pid_file_));
}

TEST_F(SupervisorTest, SigtermStopsTheChildAndTheSupervisor) {
  Start({}, {"/bin/sleep", "600"});
  const int child = WaitChild(0, "sleep");
  ASSERT_GT(child, 0);
  ASSERT_EQ(::kill(supervisor_, SIGTERM), 0);
  const int status = WaitExit(seconds(5));
  ASSERT_NE(status, -1) << "supervisor still running 5 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(ProcessAlive(child));
  EXPECT_FALSE(fs::exists(pid_file_));
  const std::string log = ReadFile(log_);
  EXPECT_TRUE(Contains(log, absl::StrCat("dummy (pid ", child, ") stopped: killed by signal 15")))
      << log;
  EXPECT_FALSE(Contains(log, "restarting in")) << log;
}

TEST_F(SupervisorTest, AChildIgnoringSigtermIsKilledAfterTheGrace) {
  Start({"--stop-grace-ms", "300"}, {"/bin/sh", "-c", "trap '' TERM; exec /bin/sleep 600"});
  const int child = WaitChild(0, "sleep");  // exec'd: the trap is in place
  ASSERT_GT(child, 0);
  ASSERT_EQ(::kill(supervisor_, SIGTERM), 0);
  const int status = WaitExit(seconds(5));
  ASSERT_NE(status, -1) << "supervisor still running 5 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(ProcessAlive(child));
  const std::string log = ReadFile(log_);
  EXPECT_TRUE(Contains(log, "did not exit within 300 ms of SIGTERM; killed")) << log;
}

TEST_F(SupervisorTest, TheStartLimitMakesItGiveUpAndSayWhy) {
  Start({"--first-delay-ms", "10", "--start-limit-burst", "3", "--start-limit-interval-ms",
         "60000"},
        {"/bin/sh", "-c", "exit 3"});
  const int status = WaitExit(seconds(10));
  ASSERT_NE(status, -1) << "supervisor still running after 10 s of a failing child";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  const std::string log = ReadFile(log_);
  EXPECT_TRUE(Contains(log, "exited with status 3; restarting in 40 ms (restart 3)")) << log;
  EXPECT_TRUE(Contains(log, "exited with status 3; giving up: start limit reached (3 restarts "
                            "within 60 s)"))
      << log;
  EXPECT_FALSE(Contains(log, "(restart 4)")) << log;
  EXPECT_FALSE(fs::exists(pid_file_));
}

TEST_F(SupervisorTest, TheChildDoesNotOutliveAKilledSupervisor) {
  Start({}, {"/bin/sleep", "600"});
  const int child = WaitChild(0, "sleep");
  ASSERT_GT(child, 0);
  ASSERT_EQ(::kill(supervisor_, SIGKILL), 0);
  EXPECT_GE(PollUntil([&] { return !ProcessAlive(child); }, seconds(5)).count(), 0)
      << "child " << child << " survived its supervisor";
}

TEST_F(SupervisorTest, BadArgumentsExit2WithTheUsage) {
  CommandResult r = RunCommand({GlmctlBin(), "supervise", "--name", "x", "--", "/bin/true"}, {},
                               seconds(10));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Contains(r.output, "usage: glmctl supervise")) << r.output;
}

class LocalClusterSupervisionTest : public LoopbackClusterTest {
 protected:
  LocalClusterSupervisionTest() : LoopbackClusterTest("supervised") {}
  void SetUp() override {
    ClusterYaml cluster;
    cluster.local = true;
    cluster.parallel_lines = "  tensor: 2\n  pipeline: 1\n  replicas: 1\n";
    cluster.nodes = {{"node-1", ""}, {"node-2", ""}};
    WriteClusterYaml(cluster);
  }
};

TEST_F(LocalClusterSupervisionTest, AKilledAgentIsRestartedAndDownLeavesNothing) {
  CommandResult up = Glmctl({"up", yaml_}, seconds(90));
  ASSERT_EQ(up.exit_code, 0) << up.output;

  const int agent = RunDirPid("agent-node-2");
  const int supervisor = RunDirPid("agent-node-2.supervisor");
  ASSERT_GT(agent, 0);
  ASSERT_GT(supervisor, 0);
  ASSERT_TRUE(ProcessAlive(agent));
  ASSERT_TRUE(ProcessAlive(supervisor));
  EXPECT_TRUE(Contains(Exe(supervisor), "glmctl")) << Exe(supervisor);
  // The supervisor holds no socket (the agent's port is the agent's alone).
  for (const auto& [fd, target] : OpenFds(supervisor)) {
    EXPECT_FALSE(Contains(target, "socket:")) << "supervisor fd " << fd << " -> " << target;
  }

  // `up` again starts nothing: the agents are supervised already.
  CommandResult again = Glmctl({"up", yaml_}, seconds(60));
  EXPECT_FALSE(Contains(again.output, "started ")) << again.output;
  EXPECT_EQ(RunDirPid("agent-node-2"), agent);
  EXPECT_EQ(RunDirPid("agent-node-2.supervisor"), supervisor);

  // kill -9 the agent: a new pid serves its port within 10 s.
  const int port = ports_[2];
  ASSERT_EQ(::kill(agent, SIGKILL), 0);
  int restarted = 0;
  const auto took = PollUntil(
      [&] {
        restarted = RunDirPid("agent-node-2");
        return restarted > 0 && restarted != agent && ProcessAlive(restarted) &&
               LoopbackPortOpen(port);
      },
      seconds(10));
  ASSERT_GE(took.count(), 0) << "port " << port << " not served by a new agent within 10 s (pid "
                             << restarted << ")";
  std::cout << "[ measure ] kill -9 of an agent -> its port served by a new pid: " << took.count()
            << " ms\n";
  EXPECT_TRUE(Contains(Exe(restarted), "glm-agent")) << Exe(restarted);
  EXPECT_EQ(RunDirPid("agent-node-2.supervisor"), supervisor);
  const std::string log = ReadFile(run_dir_ + "/agent-node-2.log");
  EXPECT_TRUE(Contains(log, absl::StrCat("agent-node-2 (pid ", agent,
                                         ") killed by signal 9 (Killed); restarting in 200 ms "
                                         "(restart 1)")))
      << log;

  // down stops supervisors first, then makes sure the agents are gone.
  std::vector<int> pids = {RunDirPid("controller"), restarted, supervisor,
                           RunDirPid("agent-node-1"), RunDirPid("agent-node-1.supervisor")};
  CommandResult down = Glmctl({"down", yaml_}, seconds(60));
  EXPECT_EQ(down.exit_code, 0) << down.output;
  for (int pid : pids) {
    ASSERT_GT(pid, 0);
    EXPECT_GE(PollUntil([&] { return !ProcessAlive(pid); }, seconds(10)).count(), 0)
        << "pid " << pid << " still running after glmctl down:\n"
        << down.output;
  }
  for (const char* file : {"agent-node-2.pid", "agent-node-2.supervisor.pid"}) {
    EXPECT_FALSE(fs::exists(run_dir_ + "/" + file)) << file;
  }
}

}  // namespace
}  // namespace glm::testing
