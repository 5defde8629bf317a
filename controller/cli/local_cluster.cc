#include "controller/cli/local_cluster.h"

#include <algorithm>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "controller/orchestrate/spec_adapter.h"

namespace glm::cli {
namespace {

namespace fs = std::filesystem;

bool Executable(const fs::path& p) { return ::access(p.c_str(), X_OK) == 0 && fs::is_regular_file(p); }

bool WritableDir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  return !ec && ::access(dir.c_str(), W_OK) == 0;
}

int ReadPid(const std::string& pid_file) {
  std::ifstream in(pid_file);
  int pid = 0;
  if (in >> pid && pid > 1) return pid;
  return 0;
}

// argv[0] of a live process, "" when it is gone or a zombie.
std::string ProcessExe(int pid) {
  std::ifstream stat_file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(stat_file, stat);
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z') return "";
  std::error_code ec;
  fs::path exe = fs::read_symlink(absl::StrCat("/proc/", pid, "/exe"), ec);
  return ec ? "" : exe.string();
}

// The pid in `pid_file` if that process is alive and runs a binary named like `binary`'s file
// name; 0 otherwise.
int LivePid(const std::string& pid_file, const std::string& binary) {
  int pid = ReadPid(pid_file);
  if (pid == 0) return 0;
  std::string exe = ProcessExe(pid);
  if (exe.empty()) return 0;
  // The binary may have been rebuilt (exe shows "(deleted)"); compare by file name.
  if (fs::path(exe).filename().string().rfind(fs::path(binary).filename().string(), 0) != 0) {
    return 0;
  }
  return pid;
}

// argv[1] of a process ("" when unreadable).
std::string ProcessArg1(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
  std::string arg0, arg1;
  std::getline(in, arg0, '\0');
  std::getline(in, arg1, '\0');
  return arg1;
}

// Double fork, setsid, stdio to `log_file`, all other fds closed, exec; writes `pid_file`.
absl::StatusOr<int> StartDetached(const std::string& name, const std::string& pid_file,
                                  const std::string& log_file, const std::string& binary,
                                  const std::vector<std::string>& args) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  pid_t child = ::fork();
  if (child < 0) return absl::InternalError(absl::StrCat("fork failed: ", strerror(errno)));
  if (child == 0) {
    // Intermediate child: new session, fork the daemon, report its pid, exit.
    ::setsid();
    pid_t daemon_pid = ::fork();
    if (daemon_pid != 0) {
      (void)!::write(pipefd[1], &daemon_pid, sizeof(daemon_pid));
      ::_exit(daemon_pid > 0 ? 0 : 1);
    }
    int devnull = ::open("/dev/null", O_RDONLY);
    int log = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (devnull < 0 || log < 0) ::_exit(127);
    ::dup2(devnull, 0);
    ::dup2(log, 1);
    ::dup2(log, 2);
    // Nothing else leaks into the daemon (a caller's pipe must not stay open for its lifetime).
    for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    ::umask(022);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(binary.c_str(), argv.data());
    dprintf(2, "glmctl: exec %s failed: %s\n", binary.c_str(), strerror(errno));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  pid_t daemon_pid = 0;
  ssize_t n = ::read(pipefd[0], &daemon_pid, sizeof(daemon_pid));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (n != sizeof(daemon_pid) || daemon_pid <= 0) {
    return absl::InternalError(absl::StrCat("could not start ", name));
  }
  std::ofstream(pid_file) << daemon_pid << "\n";
  return daemon_pid;
}

bool Alive(int pid) { return !ProcessExe(pid).empty(); }

// Polls (every 20 ms) until `pid` is gone or `timeout` passed; true when gone.
bool WaitGone(int pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Alive(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// SIGTERM, SIGKILL after `grace` (then waits up to 2 s for it to go). Returns "stopped" or
// "killed (...)".
std::string Terminate(int pid, std::chrono::milliseconds grace) {
  ::kill(pid, SIGTERM);
  if (WaitGone(pid, grace)) return "stopped";
  ::kill(pid, SIGKILL);
  WaitGone(pid, std::chrono::seconds(2));
  return absl::StrCat("killed (no exit within ", grace.count(), " ms of SIGTERM)");
}

}  // namespace

std::string DialAddress(const std::string& listen) {
  if (listen.rfind("0.0.0.0:", 0) == 0) return "127.0.0.1:" + listen.substr(8);
  if (listen.rfind("[::]:", 0) == 0) return "[::1]:" + listen.substr(5);
  return listen;
}

absl::StatusOr<Binaries> FindBinaries() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("GLM_BIN_DIR"); env && *env) dirs.emplace_back(env);
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(self.parent_path());
  if (const char* path = std::getenv("PATH")) {
    for (auto part : absl::StrSplit(path, ':', absl::SkipEmpty())) dirs.emplace_back(std::string(part));
  }
  Binaries out;
  out.glmctl.clear();
  // The running glmctl itself, unless it was rebuilt meanwhile ("glmctl (deleted)").
  if (!ec && self.filename() == "glmctl") out.glmctl = self.string();
  for (const auto& d : dirs) {
    if (out.glmctl.empty() && Executable(d / "glmctl")) {
      out.glmctl = fs::absolute(d / "glmctl").string();
    }
    if (out.controller.empty() && Executable(d / "glm-controller")) {
      out.controller = fs::absolute(d / "glm-controller").string();
    }
    if (out.agent.empty() && Executable(d / "glm-agent")) {
      out.agent = fs::absolute(d / "glm-agent").string();
    }
  }
  if (out.controller.empty() || out.agent.empty() || out.glmctl.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "cannot find ", out.controller.empty() ? "glm-controller " : "",
        out.agent.empty() ? "glm-agent " : "", out.glmctl.empty() ? "glmctl " : "",
        "next to glmctl, in $GLM_BIN_DIR or on $PATH: build them (cmake --build build --target "
        "glm-controller glm-agent) or set GLM_BIN_DIR"));
  }
  return out;
}

absl::StatusOr<LocalCluster> LocalCluster::Open(const orchestrate::ClusterTopology& topology) {
  std::vector<fs::path> candidates;
  std::error_code ec;
  fs::path yaml_dir = fs::absolute(topology.config_path, ec).parent_path();
  candidates.push_back(yaml_dir / ".glmctl" / topology.cluster_name);
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) {
    candidates.push_back(fs::path(xdg) / "glmctl" / topology.cluster_name);
  }
  candidates.push_back(fs::temp_directory_path() / absl::StrCat("glmctl-", ::getuid()) /
                       topology.cluster_name);
  for (const auto& c : candidates) {
    if (WritableDir(c)) return LocalCluster(c.string());
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "no writable run directory for cluster '", topology.cluster_name, "' (tried ",
      candidates.front().string(), " and $XDG_RUNTIME_DIR): make the YAML's directory writable"));
}

std::vector<Daemon> LocalCluster::Daemons(const orchestrate::ClusterTopology& topology,
                                          const Binaries& binaries) const {
  std::vector<Daemon> out;
  for (const auto& node : topology.nodes) {
    Daemon d;
    d.name = "agent-" + node.name;
    d.pid_file = run_dir_ + "/" + d.name + ".pid";
    d.log_file = run_dir_ + "/" + d.name + ".log";
    d.binary = binaries.agent;
    d.args = {"serve", "--listen", node.address, "--node", node.name};
    // Every engine shard of the cluster shares this machine's cores.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const size_t per_node = std::max<size_t>(1, cores / std::max<size_t>(1, topology.nodes.size()));
    d.args.insert(d.args.end(), {"--engine-threads", std::to_string(per_node)});
    d.listen = node.address;
    d.supervisor = binaries.glmctl;
    d.supervisor_pid_file = run_dir_ + "/" + d.name + ".supervisor.pid";
    rpc::TlsFiles tls = orchestrate::NodeTlsFiles(topology, node.name);
    if (tls.enabled()) {
      d.args.insert(d.args.end(),
                    {"--tls-ca", tls.ca, "--tls-cert", tls.cert, "--tls-key", tls.key});
    }
    out.push_back(std::move(d));
  }
  Daemon c;
  c.name = "controller";
  c.pid_file = run_dir_ + "/controller.pid";
  c.log_file = run_dir_ + "/controller.log";
  c.binary = binaries.controller;
  std::error_code ec;
  c.args = {"--config", fs::absolute(topology.config_path, ec).string()};
  c.listen = topology.controller_listen;
  out.push_back(std::move(c));
  return out;
}

int LocalCluster::RunningPid(const Daemon& daemon) {
  return LivePid(daemon.pid_file, daemon.binary);
}

int LocalCluster::SupervisorPid(const Daemon& daemon) {
  if (daemon.supervisor.empty()) return 0;
  int pid = LivePid(daemon.supervisor_pid_file, daemon.supervisor);
  return pid != 0 && ProcessArg1(pid) == "supervise" ? pid : 0;
}

bool LocalCluster::Running(const Daemon& daemon) {
  return RunningPid(daemon) != 0 || SupervisorPid(daemon) != 0;
}

absl::StatusOr<int> LocalCluster::Start(const Daemon& daemon) {
  if (daemon.supervisor.empty()) {
    return StartDetached(daemon.name, daemon.pid_file, daemon.log_file, daemon.binary,
                         daemon.args);
  }
  std::error_code ec;
  fs::remove(daemon.pid_file, ec);  // so the wait below sees the supervisor's child
  std::vector<std::string> args = {"supervise",  "--name", daemon.name, "--pid-file",
                                   daemon.pid_file, "--log", daemon.log_file, "--",
                                   daemon.binary};
  args.insert(args.end(), daemon.args.begin(), daemon.args.end());
  absl::StatusOr<int> supervisor = StartDetached(
      daemon.name + " supervisor", daemon.supervisor_pid_file, daemon.log_file, daemon.supervisor,
      args);
  if (!supervisor.ok()) return supervisor.status();
  // The supervisor writes the pid file right after its first fork.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    if (int pid = ReadPid(daemon.pid_file); pid != 0) return pid;
    if (!Alive(*supervisor) || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::InternalError(absl::StrCat(
      "the supervisor of ", daemon.name, " (", daemon.supervisor, " supervise, pid ", *supervisor,
      ") did not start it within 5 s; see ", daemon.log_file));
}

std::string LocalCluster::Stop(const Daemon& daemon, std::chrono::milliseconds grace) {
  std::error_code ec;
  // The supervisor first, so nothing restarts the daemon; stopping, it stops the daemon (giving
  // it its own grace of 5 s) and removes the daemon's pid file.
  const int supervisor = SupervisorPid(daemon);
  const int first_pid = RunningPid(daemon);
  std::string supervisor_how;
  if (supervisor != 0) {
    supervisor_how = Terminate(supervisor, grace + std::chrono::seconds(2));
  }
  fs::remove(daemon.supervisor_pid_file, ec);
  // A daemon still alive: the supervisor was killed, or it was never supervised.
  const int pid = RunningPid(daemon);
  std::string how = "stopped";
  if (pid != 0) how = Terminate(pid, grace);
  fs::remove(daemon.pid_file, ec);

  const int shown = pid != 0 ? pid : first_pid;
  if (supervisor == 0) {
    return shown == 0 ? "" : absl::StrCat(daemon.name, " (pid ", shown, ") ", how);
  }
  if (shown == 0) {
    return absl::StrCat(daemon.name, " supervisor (pid ", supervisor, ") ", supervisor_how, " (",
                        daemon.name, " was not running)");
  }
  return absl::StrCat(daemon.name, " (pid ", shown, ", supervisor pid ", supervisor, ") ", how,
                      supervisor_how == "stopped" ? "" : "; supervisor " + supervisor_how);
}

bool LocalCluster::Served(const Daemon& daemon) {
  // Local clusters listen on IPv4 literals ("127.0.0.1:47101"); anything else is not probed.
  size_t colon = daemon.listen.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = daemon.listen.substr(0, colon);
  int port = std::atoi(daemon.listen.c_str() + colon + 1);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (port <= 0 || port > 65535 || ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      addr.sin_addr.s_addr == htonl(INADDR_ANY)) {
    return false;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool open = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return open;
}

}  // namespace glm::cli
