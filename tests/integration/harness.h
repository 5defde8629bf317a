// Helpers for multi-process tests: free loopback ports, running commands with a bounded wait,
// temp dirs, and polling `glmctl status --json` with a deadline. Every wait here is bounded.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace glm::testing {

struct CommandResult {
  int exit_code = -1;     // -1: killed at the timeout
  std::string output;     // stdout and stderr, interleaved
  bool timed_out = false;
};

// Runs argv[0] (absolute path) with extra environment variables; kills it after `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env,
                         std::chrono::milliseconds timeout);

// Starts argv in the background (own process group, output to `log_file`); returns its pid.
int SpawnBackground(const std::vector<std::string>& argv, const std::string& log_file);

// SIGKILL and reap (bounded); for pids this test started or read from its own run dir.
void KillNow(int pid);
// True while `pid` exists and is not a zombie.
bool ProcessAlive(int pid);

// `n` distinct TCP ports that were free on `host` a moment ago.
std::vector<int> FreePorts(int n, const std::string& host = "127.0.0.1");

// True when something accepts TCP connections on 127.0.0.1:port.
bool LoopbackPortOpen(int port);

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& text);
std::string ReadFile(const std::string& path);

// Polls `probe` every `interval` until it returns true or `timeout` passes. Returns the time it
// took, or nullopt-like negative duration on timeout.
std::chrono::milliseconds PollUntil(const std::function<bool()>& probe,
                                    std::chrono::milliseconds timeout,
                                    std::chrono::milliseconds interval =
                                        std::chrono::milliseconds(50));

// Paths of the built binaries (compile definitions from CMake).
std::string GlmctlBin();
std::string AgentBin();
std::string ControllerBin();
std::string SourceDir();

}  // namespace glm::testing
