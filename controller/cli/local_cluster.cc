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
  for (const auto& d : dirs) {
    if (out.controller.empty() && Executable(d / "glm-controller")) {
      out.controller = fs::absolute(d / "glm-controller").string();
    }
    if (out.agent.empty() && Executable(d / "glm-agent")) {
      out.agent = fs::absolute(d / "glm-agent").string();
    }
  }
  if (out.controller.empty() || out.agent.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "cannot find ", out.controller.empty() ? "glm-controller " : "",
        out.agent.empty() ? "glm-agent " : "",
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
  int pid = ReadPid(daemon.pid_file);
  if (pid == 0) return 0;
  std::string exe = ProcessExe(pid);
  if (exe.empty()) return 0;
  // The binary may have been rebuilt (exe shows "(deleted)"); compare by file name.
  if (fs::path(exe).filename().string().rfind(fs::path(daemon.binary).filename().string(), 0) != 0) {
    return 0;
  }
  return pid;
}

absl::StatusOr<int> LocalCluster::Start(const Daemon& daemon) {
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
    int log = ::open(daemon.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (devnull < 0 || log < 0) ::_exit(127);
    ::dup2(devnull, 0);
    ::dup2(log, 1);
    ::dup2(log, 2);
    // Nothing else leaks into the daemon (a caller's pipe must not stay open for its lifetime).
    for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    ::umask(022);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(daemon.binary.c_str()));
    for (const auto& a : daemon.args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(daemon.binary.c_str(), argv.data());
    dprintf(2, "glmctl: exec %s failed: %s\n", daemon.binary.c_str(), strerror(errno));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  pid_t daemon_pid = 0;
  ssize_t n = ::read(pipefd[0], &daemon_pid, sizeof(daemon_pid));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (n != sizeof(daemon_pid) || daemon_pid <= 0) {
    return absl::InternalError(absl::StrCat("could not start ", daemon.name));
  }
  std::ofstream(daemon.pid_file) << daemon_pid << "\n";
  return daemon_pid;
}

std::string LocalCluster::Stop(const Daemon& daemon, std::chrono::milliseconds grace) {
  int pid = RunningPid(daemon);
  if (pid == 0) {
    std::error_code ec;
    fs::remove(daemon.pid_file, ec);
    return "";
  }
  ::kill(pid, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline && !ProcessExe(pid).empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string how = "stopped";
  if (!ProcessExe(pid).empty()) {
    ::kill(pid, SIGKILL);
    how = absl::StrCat("killed (no exit within ", grace.count(), " ms of SIGTERM)");
  }
  std::error_code ec;
  fs::remove(daemon.pid_file, ec);
  return absl::StrCat(daemon.name, " (pid ", pid, ") ", how);
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
