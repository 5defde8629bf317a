// `glmctl supervise`: keeps one child process (a local cluster's glm-agent) running, the way
// systemd's Restart=on-failure does on real nodes.
//
//   glmctl supervise --name agent-node-2 --pid-file RUN/agent-node-2.pid --log RUN/agent-node-2.log
//       -- /path/glm-agent serve --listen ... --node node-2
//
// The child runs with stdout/stderr appended to --log, stdin and everything else inherited from
// the supervisor (which holds no fds of its own beyond its stdio and the log), in the
// supervisor's session. The pid file names the current child; it is rewritten (atomically) on
// every start and removed when supervision ends. When the supervisor dies the child gets SIGTERM
// (PR_SET_PDEATHSIG), so a child never outlives its supervisor unnoticed.
//
// Exit of the child:
//   - status 0: supervision ends, the supervisor exits 0 (a clean exit is not a failure);
//   - killed by a signal or non-zero status: restarted after a delay that starts at
//     `first_delay` and doubles up to `max_delay` (reset after a run of `stable_after`), unless
//     `start_limit_burst` restarts already happened within `start_limit_interval`: then the
//     supervisor logs why and exits 1.
// SIGTERM or SIGINT to the supervisor: SIGTERM to the child, SIGKILL after `stop_grace`, exit 0.
// SIGHUP is forwarded to the child. One line per event goes to the log:
//   2025-01-02T03:04:05.678 I glmctl supervise: agent-node-2 (pid 123) killed by signal 9
//   (Killed); restarting in 200 ms (restart 1)
// An agent that exits 75 (restart requested by `glmctl restart --processes`) is restarted like
// any other failure: after the current delay, counted against the start limit.
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace glm::cli {

struct SupervisorPolicy {
  std::chrono::milliseconds first_delay{200};
  std::chrono::milliseconds max_delay{5000};
  std::chrono::milliseconds stable_after{10000};  // a run this long resets the delay
  int start_limit_burst = 10;                      // restarts allowed per interval
  std::chrono::milliseconds start_limit_interval{60000};
  std::chrono::milliseconds stop_grace{5000};      // SIGTERM -> SIGKILL of the child
};

// The restart decision, apart from processes so tests drive it with explicit times. Not
// thread-safe.
class RestartBackoff {
 public:
  explicit RestartBackoff(const SupervisorPolicy& policy) : policy_(policy) {}

  struct Decision {
    bool give_up = false;
    std::chrono::milliseconds delay{0};  // before the restart; 0 when giving up
    int restart = 0;                     // 1 for the first restart of this supervisor
  };
  // A child that ran from `started` failed at `failed`.
  Decision OnFailure(Clock::TimePoint started, Clock::TimePoint failed);

  int restarts() const { return restarts_; }

 private:
  const SupervisorPolicy policy_;
  int restarts_ = 0;
  int consecutive_ = 0;                   // failures since the last stable run
  std::deque<Clock::TimePoint> recent_;  // restarts within the start-limit interval
};

struct SuperviseOptions {
  std::string name;      // "agent-node-2": names the child in log lines
  std::string pid_file;  // the current child's pid
  std::string log_file;  // the child's stdout/stderr and the supervisor's lines; "" = stderr
  std::vector<std::string> argv;  // the child's command line; argv[0] is an absolute path
  SupervisorPolicy policy;
};

// Parses `glmctl supervise`'s arguments (those after "supervise"):
//   --name N --pid-file F [--log F] [--first-delay-ms N] [--max-delay-ms N] [--stable-after-ms N]
//   [--start-limit-burst N] [--start-limit-interval-ms N] [--stop-grace-ms N] -- PROGRAM ARGS...
// The error names the bad argument and shows the usage.
absl::StatusOr<SuperviseOptions> ParseSuperviseArgs(const std::vector<std::string>& args);

// Runs the supervisor in this process until supervision ends; returns the exit code (0 after a
// clean child exit or a stop signal, 1 when the start limit was hit or the child could not be
// forked). Blocks SIGCHLD, SIGTERM, SIGINT and SIGHUP: call it from a single-threaded process.
int RunSupervisor(const SuperviseOptions& options);

// main() of `glmctl supervise` (hidden: `glmctl up` starts it): parses, then RunSupervisor.
// Exit code 2 on bad arguments.
int SuperviseMain(int argc, char** argv);

// "killed by signal 9", "exited with status 3", "exited cleanly (status 0)" for a wait status.
std::string DescribeWaitStatus(int status);

}  // namespace glm::cli
