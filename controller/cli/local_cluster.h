// Local clusters (`local: true`): glmctl runs glm-controller and one glm-agent per node on this
// machine as daemons (own session, stdio to log files), recorded in a run directory:
//   <yaml dir>/.glmctl/<cluster>/            (or $XDG_RUNTIME_DIR/glmctl/<cluster> when the YAML's
//     controller.pid  controller.log          directory is not writable)
//     agent-<node>.pid  agent-<node>.log
// A pid file counts only while its process is alive and is the binary it names (so a recycled
// pid is never signalled).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/orchestrate/topology.h"

namespace glm::cli {

struct Binaries {
  std::string controller;  // absolute path of glm-controller
  std::string agent;       // absolute path of glm-agent
};

// Finds glm-controller and glm-agent: $GLM_BIN_DIR, then the directory of this executable, then
// $PATH. The error says where it looked and how to build them.
absl::StatusOr<Binaries> FindBinaries();

// One daemon glmctl manages.
struct Daemon {
  std::string name;      // "controller" or "agent-<node>"
  std::string pid_file;
  std::string log_file;
  std::string binary;
  std::vector<std::string> args;  // argv[1..]
  std::string listen;             // host:port it serves
};

class LocalCluster {
 public:
  // Chooses (and creates) the run directory for this cluster.
  static absl::StatusOr<LocalCluster> Open(const orchestrate::ClusterTopology& topology);

  const std::string& run_dir() const { return run_dir_; }

  // The controller and agents of `topology`, with their command lines.
  std::vector<Daemon> Daemons(const orchestrate::ClusterTopology& topology,
                              const Binaries& binaries) const;

  // Pid of the daemon if its pid file names a live process running `binary`; 0 otherwise.
  static int RunningPid(const Daemon& daemon);

  // Starts the daemon in the background (double fork, setsid, stdio to its log, all other fds
  // closed) and writes its pid file. Returns the pid.
  static absl::StatusOr<int> Start(const Daemon& daemon);
  // True when something accepts TCP connections at daemon.listen (e.g. an agent restarted by
  // hand, which glmctl's pid file does not know about).
  static bool Served(const Daemon& daemon);

  // SIGTERM, then SIGKILL after `grace`; removes the pid file. Returns a line describing what
  // happened, or "" when it was not running.
  static std::string Stop(const Daemon& daemon, std::chrono::milliseconds grace);

 private:
  explicit LocalCluster(std::string run_dir) : run_dir_(std::move(run_dir)) {}
  std::string run_dir_;
};

// host:port to dial for a listen address: 0.0.0.0 / [::] become loopback.
std::string DialAddress(const std::string& listen);

}  // namespace glm::cli
