#include "controller/cli/supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include "gtest/gtest.h"

namespace glm::cli {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RestartBackoffTest, DelayDoublesUpToTheCapAndResetsAfterAStableRun) {
  SupervisorPolicy policy;  // 200 ms doubling to 5 s, stable after 10 s, 10 per 60 s
  policy.start_limit_burst = 100;
  RestartBackoff backoff(policy);
  FakeClock clock;
  std::vector<int64_t> delays;
  for (int i = 0; i < 7; ++i) {
    Clock::TimePoint started = clock.Now();
    clock.Advance(milliseconds(100));
    RestartBackoff::Decision d = backoff.OnFailure(started, clock.Now());
    ASSERT_FALSE(d.give_up);
    EXPECT_EQ(d.restart, i + 1);
    delays.push_back(d.delay.count());
    clock.Advance(d.delay);
  }
  EXPECT_EQ(delays, (std::vector<int64_t>{200, 400, 800, 1600, 3200, 5000, 5000}));

  // A run of 10 s counts as stable: the next failure waits the first delay again.
  Clock::TimePoint started = clock.Now();
  clock.Advance(seconds(10));
  RestartBackoff::Decision d = backoff.OnFailure(started, clock.Now());
  EXPECT_EQ(d.delay, milliseconds(200));
  EXPECT_EQ(d.restart, 8);
  EXPECT_EQ(backoff.restarts(), 8);
}

TEST(RestartBackoffTest, GivesUpAfterTheBurstWithinTheInterval) {
  SupervisorPolicy policy;
  policy.start_limit_burst = 3;
  policy.start_limit_interval = seconds(60);
  RestartBackoff backoff(policy);
  FakeClock clock;
  for (int i = 0; i < 3; ++i) {
    Clock::TimePoint started = clock.Now();
    clock.Advance(seconds(1));
    ASSERT_FALSE(backoff.OnFailure(started, clock.Now()).give_up) << i;
  }
  Clock::TimePoint started = clock.Now();
  clock.Advance(seconds(1));
  RestartBackoff::Decision d = backoff.OnFailure(started, clock.Now());
  EXPECT_TRUE(d.give_up);
  EXPECT_EQ(d.restart, 3);
  EXPECT_EQ(d.delay, milliseconds(0));
}

TEST(RestartBackoffTest, FailuresOlderThanTheIntervalDoNotCount) {
  SupervisorPolicy policy;
  policy.start_limit_burst = 2;
  policy.start_limit_interval = seconds(60);
  RestartBackoff backoff(policy);
  FakeClock clock;
  // Two failures, then one every 31 s: at most two restarts are ever within 60 s.
  for (int i = 0; i < 6; ++i) {
    Clock::TimePoint started = clock.Now();
    clock.Advance(seconds(31));
    EXPECT_FALSE(backoff.OnFailure(started, clock.Now()).give_up) << i;
  }
  EXPECT_EQ(backoff.restarts(), 6);
}

TEST(RestartBackoffTest, ABurstOfZeroNeverRestarts) {
  SupervisorPolicy policy;
  policy.start_limit_burst = 0;
  RestartBackoff backoff(policy);
  FakeClock clock;
  EXPECT_TRUE(backoff.OnFailure(clock.Now(), clock.Now()).give_up);
}

TEST(SuperviseArgsTest, ParsesFlagsAndTheCommandAfterTheSeparator) {
  auto o = ParseSuperviseArgs({"--name", "agent-node-2", "--pid-file", "/run/a.pid",
                               "--log=/run/a.log", "--first-delay-ms", "10", "--max-delay-ms",
                               "40", "--start-limit-burst", "3", "--start-limit-interval-ms",
                               "1000", "--stop-grace-ms", "250", "--stable-after-ms", "500", "--",
                               "/bin/agent", "serve", "--listen", "127.0.0.1:1"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->name, "agent-node-2");
  EXPECT_EQ(o->pid_file, "/run/a.pid");
  EXPECT_EQ(o->log_file, "/run/a.log");
  EXPECT_EQ(o->policy.first_delay, milliseconds(10));
  EXPECT_EQ(o->policy.max_delay, milliseconds(40));
  EXPECT_EQ(o->policy.start_limit_burst, 3);
  EXPECT_EQ(o->policy.start_limit_interval, milliseconds(1000));
  EXPECT_EQ(o->policy.stop_grace, milliseconds(250));
  EXPECT_EQ(o->policy.stable_after, milliseconds(500));
  // Flags of the child stay the child's.
  EXPECT_EQ(o->argv, (std::vector<std::string>{"/bin/agent", "serve", "--listen", "127.0.0.1:1"}));
}

TEST(SuperviseArgsTest, ErrorsNameTheArgument) {
  auto no_command = ParseSuperviseArgs({"--name", "a", "--pid-file", "p"});
  ASSERT_FALSE(no_command.ok());
  EXPECT_NE(no_command.status().message().find("after --"), std::string::npos);
  auto unknown = ParseSuperviseArgs({"--nme", "a", "--", "/bin/true"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'--nme'"), std::string::npos);
  auto bad_ms = ParseSuperviseArgs({"--name", "a", "--pid-file", "p", "--first-delay-ms", "soon",
                                    "--", "/bin/true"});
  ASSERT_FALSE(bad_ms.ok());
  EXPECT_NE(bad_ms.status().message().find("--first-delay-ms 'soon'"), std::string::npos);
  auto missing_value = ParseSuperviseArgs({"--name"});
  ASSERT_FALSE(missing_value.ok());
  EXPECT_NE(missing_value.status().message().find("--name needs a value"), std::string::npos);
}

TEST(DescribeWaitStatusTest, SignalsAndExitCodes) {
  EXPECT_EQ(DescribeWaitStatus(SIGKILL).rfind("killed by signal 9", 0), 0u);
  EXPECT_EQ(DescribeWaitStatus(3 << 8), "exited with status 3");
  EXPECT_EQ(DescribeWaitStatus(0), "exited cleanly (status 0)");
}

}  // namespace
}  // namespace glm::cli
