#include "controller/cli/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace glm::cli {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using SteadyTime = std::chrono::steady_clock::time_point;

constexpr char kUsage[] =
    "usage: glmctl supervise --name NAME --pid-file FILE [--log FILE] [--first-delay-ms N] "
    "[--max-delay-ms N] [--stable-after-ms N] [--start-limit-burst N] "
    "[--start-limit-interval-ms N] [--stop-grace-ms N] -- PROGRAM [ARGS...]";

int64_t Ms(milliseconds d) { return d.count(); }

// "2025-01-02T03:04:05.678 I glmctl supervise: " in local time, the daemons' log-line shape.
std::string Prefix() {
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  auto millis = std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[96];
  std::snprintf(out, sizeof(out), "%s.%03d I glmctl supervise: ", buf, static_cast<int>(millis));
  return out;
}

// Appends whole lines to the log with one write(2) each (O_APPEND keeps them whole between the
// child's own writes).
class EventLog {
 public:
  explicit EventLog(int fd) : fd_(fd) {}
  void Line(const std::string& text) const {
    std::string line = absl::StrCat(Prefix(), text, "\n");
    (void)!::write(fd_, line.data(), line.size());
  }

 private:
  int fd_;
};

// Writes `pid` to `path` through a rename, so a reader never sees a half-written file.
void WritePidFile(const std::string& path, pid_t pid) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << pid << "\n";
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

// Removes the pid file when it still names `pid` (a newer supervisor may own it by now).
void RemovePidFile(const std::string& path, pid_t pid) {
  std::ifstream in(path);
  int named = 0;
  if (in >> named && named != pid) return;
  std::error_code ec;
  fs::remove(path, ec);
}

// Forks and execs the child. Everything the child needs is prepared before fork.
pid_t SpawnChild(const std::vector<char*>& argv, int log_fd) {
  const pid_t supervisor = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The child: dies with the supervisor, writes to the log, holds none of the supervisor's fds.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != supervisor) ::_exit(1);  // the supervisor died before prctl
  if (log_fd >= 0) {
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
  }
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execv(argv[0], argv.data());
  dprintf(STDERR_FILENO, "glmctl supervise: exec %s failed: %s\n", argv[0], strerror(errno));
  ::_exit(127);
}

// The next signal of `set` (all blocked), or 0 once `deadline` passed (never, without one).
int WaitSignal(const sigset_t& set, std::optional<SteadyTime> deadline) {
  for (;;) {
    int sig;
    if (!deadline) {
      sig = ::sigwaitinfo(&set, nullptr);
    } else {
      auto left = *deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds(0)) return 0;
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      sig = ::sigtimedwait(&set, nullptr, &ts);
    }
    if (sig > 0) return sig;
    if (errno == EAGAIN) return 0;
    // EINTR: a signal outside `set` was handled; wait again.
  }
}

bool IsStopSignal(int sig) { return sig == SIGTERM || sig == SIGINT; }

// SIGTERM to the child, SIGKILL after `grace`; reaps it. Other signals meanwhile are dropped:
// the supervisor is stopping anyway.
void StopChild(const sigset_t& set, pid_t child, milliseconds grace, const std::string& who,
               const EventLog& log) {
  ::kill(child, SIGTERM);
  const SteadyTime deadline = std::chrono::steady_clock::now() + grace;
  int status = 0;
  for (;;) {
    if (::waitpid(child, &status, WNOHANG) == child) {
      log.Line(absl::StrCat(who, " stopped: ", DescribeWaitStatus(status)));
      return;
    }
    if (WaitSignal(set, deadline) == 0) break;
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  log.Line(absl::StrCat(who, " did not exit within ", Ms(grace), " ms of SIGTERM; killed"));
}

absl::Status ParseMs(const std::string& flag, const std::string& value, milliseconds* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "glmctl supervise: ", flag, " '", value, "' is not a number of milliseconds >= 0\n",
        kUsage));
  }
  *out = milliseconds(v);
  return absl::OkStatus();
}

}  // namespace

std::string DescribeWaitStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  if (WIFEXITED(status)) {
    return WEXITSTATUS(status) == 0 ? "exited cleanly (status 0)"
                                    : absl::StrCat("exited with status ", WEXITSTATUS(status));
  }
  return absl::StrCat("ended with wait status ", status);
}

RestartBackoff::Decision RestartBackoff::OnFailure(Clock::TimePoint started,
                                                   Clock::TimePoint failed) {
  Decision d;
  if (failed - started >= policy_.stable_after) consecutive_ = 0;
  while (!recent_.empty() && failed - recent_.front() >= policy_.start_limit_interval) {
    recent_.pop_front();
  }
  if (static_cast<int>(recent_.size()) >= policy_.start_limit_burst) {
    d.give_up = true;
    d.restart = restarts_;
    return d;
  }
  milliseconds delay = policy_.first_delay;
  for (int i = 0; i < consecutive_ && delay < policy_.max_delay; ++i) delay *= 2;
  d.delay = std::min(delay, policy_.max_delay);
  ++consecutive_;
  recent_.push_back(failed);
  d.restart = ++restarts_;
  return d;
}

absl::StatusOr<SuperviseOptions> ParseSuperviseArgs(const std::vector<std::string>& args) {
  SuperviseOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string flag = args[i];
    if (flag == "--") {
      ++i;
      break;
    }
    std::string value;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("glmctl supervise: ", flag, " needs a value\n", kUsage));
    }
    SupervisorPolicy& p = o.policy;
    absl::Status s;
    if (flag == "--name") {
      o.name = value;
    } else if (flag == "--pid-file") {
      o.pid_file = value;
    } else if (flag == "--log") {
      o.log_file = value;
    } else if (flag == "--first-delay-ms") {
      s = ParseMs(flag, value, &p.first_delay);
    } else if (flag == "--max-delay-ms") {
      s = ParseMs(flag, value, &p.max_delay);
    } else if (flag == "--stable-after-ms") {
      s = ParseMs(flag, value, &p.stable_after);
    } else if (flag == "--start-limit-interval-ms") {
      s = ParseMs(flag, value, &p.start_limit_interval);
    } else if (flag == "--stop-grace-ms") {
      s = ParseMs(flag, value, &p.stop_grace);
    } else if (flag == "--start-limit-burst") {
      if (!absl::SimpleAtoi(value, &p.start_limit_burst) || p.start_limit_burst < 0) {
        s = absl::InvalidArgumentError(absl::StrCat(
            "glmctl supervise: --start-limit-burst '", value, "' is not a count >= 0\n", kUsage));
      }
    } else {
      s = absl::InvalidArgumentError(
          absl::StrCat("glmctl supervise: unknown argument '", flag, "'\n", kUsage));
    }
    if (!s.ok()) return s;
  }
  o.argv.assign(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())), args.end());
  if (o.name.empty() || o.pid_file.empty() || o.argv.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "glmctl supervise: --name, --pid-file and a program after -- are required\n", kUsage));
  }
  return o;
}

int RunSupervisor(const SuperviseOptions& o) {
  // The log fd is >= 3 and close-on-exec: the child gets it only as its stdout/stderr.
  int log_fd = -1;
  if (!o.log_file.empty()) {
    log_fd = ::open(o.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      std::cerr << "glmctl supervise: cannot open log " << o.log_file << ": " << strerror(errno)
                << "\n";
      return 1;
    }
  }
  int event_fd = ::fcntl(log_fd >= 0 ? log_fd : STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  if (log_fd >= 0) ::close(log_fd);
  log_fd = o.log_file.empty() ? -1 : event_fd;
  const EventLog log(event_fd);

  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) {
    ::signal(sig, SIG_DFL);  // an inherited SIG_IGN would drop them instead of queueing
    sigaddset(&set, sig);
  }
  ::sigprocmask(SIG_BLOCK, &set, nullptr);

  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  Clock* clock = Clock::Real();
  RestartBackoff backoff(o.policy);
  log.Line(absl::StrCat("supervising ", o.name, " (supervisor pid ", ::getpid(),
                        "): restart on failure, start limit ", o.policy.start_limit_burst,
                        " per ", Ms(o.policy.start_limit_interval) / 1000.0, " s: ",
                        absl::StrJoin(o.argv, " ")));
  for (;;) {
    const pid_t child = SpawnChild(argv, log_fd);
    if (child < 0) {
      log.Line(absl::StrCat("cannot fork ", o.name, ": ", strerror(errno), "; giving up"));
      return 1;
    }
    WritePidFile(o.pid_file, child);
    const Clock::TimePoint started = clock->Now();
    const std::string who = absl::StrCat(o.name, " (pid ", child, ")");

    int status = 0;
    for (;;) {
      const int sig = WaitSignal(set, std::nullopt);
      if (sig == SIGHUP) {
        ::kill(child, SIGHUP);
      } else if (IsStopSignal(sig)) {
        log.Line(absl::StrCat("signal ", sig, " (", strsignal(sig), "): stopping ", who));
        StopChild(set, child, o.policy.stop_grace, who, log);
        RemovePidFile(o.pid_file, child);
        return 0;
      } else if (::waitpid(child, &status, WNOHANG) == child) {
        break;
      }
    }

    const std::string what = absl::StrCat(who, " ", DescribeWaitStatus(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      log.Line(absl::StrCat(what, "; not restarting (a clean exit ends supervision)"));
      RemovePidFile(o.pid_file, child);
      return 0;
    }
    const RestartBackoff::Decision d = backoff.OnFailure(started, clock->Now());
    if (d.give_up) {
      log.Line(absl::StrCat(
          what, "; giving up: start limit reached (", o.policy.start_limit_burst,
          " restarts within ", Ms(o.policy.start_limit_interval) / 1000.0,
          " s). Fix the cause (see the lines above), then run `glmctl up` to start it again"));
      RemovePidFile(o.pid_file, child);
      return 1;
    }
    log.Line(absl::StrCat(what, "; restarting in ", Ms(d.delay), " ms (restart ", d.restart, ")"));
    const SteadyTime deadline = std::chrono::steady_clock::now() + d.delay;
    for (;;) {
      const int sig = WaitSignal(set, deadline);
      if (sig == 0) break;
      if (IsStopSignal(sig)) {
        log.Line(absl::StrCat("signal ", sig, " (", strsignal(sig), ") while waiting to restart ",
                              o.name, "; not restarting"));
        RemovePidFile(o.pid_file, child);
        return 0;
      }
    }
  }
}

int SuperviseMain(int argc, char** argv) {
  absl::StatusOr<SuperviseOptions> options =
      ParseSuperviseArgs(std::vector<std::string>(argv, argv + argc));
  if (!options.ok()) {
    std::cerr << options.status().message() << "\n";
    return 2;
  }
  return RunSupervisor(*options);
}

}  // namespace glm::cli
