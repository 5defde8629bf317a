#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace glm::testing {
namespace {

namespace fs = std::filesystem;

std::vector<char*> CArgv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env,
                         std::chrono::milliseconds timeout) {
  CommandResult result;
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return result;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    auto cargv = CArgv(argv);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r <= 0) continue;
    ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!result.timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

int SpawnBackground(const std::vector<std::string>& argv, const std::string& log_file) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    int log = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(log, 1);
    ::dup2(log, 2);
    for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    auto cargv = CArgv(argv);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  return pid;
}

bool ProcessAlive(int pid) {
  if (pid <= 0) return false;
  int status = 0;
  // Reap it if it is our child and has exited.
  if (::waitpid(pid, &status, WNOHANG) == pid) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

void KillNow(int pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  PollUntil([&] { return !ProcessAlive(pid); }, std::chrono::seconds(5));
}

bool LoopbackPortOpen(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

std::vector<int> FreePorts(int n, const std::string& host) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    addr.sin_port = 0;
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ports.push_back(ntohs(addr.sin_port));
    fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

TempDir::TempDir(const std::string& prefix) {
  std::random_device rd;
  path_ = (fs::temp_directory_path() /
           (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd() % 100000)))
              .string();
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::chrono::milliseconds PollUntil(const std::function<bool()>& probe,
                                    std::chrono::milliseconds timeout,
                                    std::chrono::milliseconds interval) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    if (probe()) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
    }
    if (std::chrono::steady_clock::now() - start > timeout) return std::chrono::milliseconds(-1);
    std::this_thread::sleep_for(interval);
  }
}

std::string GlmctlBin() { return GLM_TEST_GLMCTL; }
std::string AgentBin() { return GLM_TEST_AGENT; }
std::string ControllerBin() { return GLM_TEST_CONTROLLER; }
std::string SourceDir() {
  const char* d = std::getenv("GLM_SOURCE_DIR");
  return d ? d : GLM_TEST_SOURCE_DIR;
}

}  // namespace glm::testing
