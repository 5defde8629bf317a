// Local clusters (`local: true`): glmctl runs glm-controller and one glm-agent per node on this
// machine as daemons (own session, stdio to log files), recorded in a run directory:
//   <yaml dir>/.glmctl/<cluster>/            (or $XDG_RUNTIME_DIR/glmctl/<cluster> when the YAML's
//     controller.pid  controller.log          directory is not writable)
//     agent-<node>.pid                        the current glm-agent of the node
//     agent-<node>.supervisor.pid             its `glmctl supervise` (supervisor.h)
//     agent-<node>.log                        the agent's output and its supervisor's events
// Each agent runs under a supervisor that restarts it when it fails (killed, non-zero exit), as
// systemd's Restart=on-failure does on real nodes: 200 ms doubling to 5 s between restarts, at
// most 10 restarts per 60 s, then the supervisor gives up and logs why. The controller is not
// supervised. A pid file counts only while its process is alive and is the binary it names (so
// a recycled pid is never signalled).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/orchestrate/topology.h"

namespace glm::cli {

struct Binaries {
  std::string controller;         // absolute path of glm-controller
  std::string agent;              // absolute path of glm-agent
  std::string glmctl = "glmctl";  // absolute path of glmctl (runs `glmctl supervise`)
};

// Finds glm-controller and glm-agent: $GLM_BIN_DIR, then the directory of this executable, then
// $PATH; glmctl is this executable when it is glmctl, else found the same way. The error says
// where it looked and how to build them.
absl::StatusOr<Binaries> FindBinaries();

// One daemon glmctl manages.
struct Daemon {
  std::string name;      // "controller" or "agent-<node>"
  std::string pid_file;
  std::string log_file;
  std::string binary;
  std::vector<std::string> args;  // argv[1..]
  std::string listen;             // host:port it serves
  // Set for agents: the daemon runs under `<supervisor> supervise ... -- binary args`, whose pid
  // is in supervisor_pid_file; pid_file names the current child.
  std::string supervisor;           // absolute path of glmctl; "" = not supervised
  std::string supervisor_pid_file;  // agent-<node>.supervisor.pid
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
  // Pid of the daemon's supervisor if its pid file names a live `glmctl supervise`; 0 otherwise
  // (and for unsupervised daemons).
  static int SupervisorPid(const Daemon& daemon);
  // True when the daemon or its supervisor is alive (between two restarts only the supervisor
  // is): `glmctl up` starts nothing for it.
  static bool Running(const Daemon& daemon);

  // Starts the daemon in the background (double fork, setsid, stdio to its log, all other fds
  // closed) and writes its pid file. A supervised daemon: starts its supervisor that way (pid in
  // supervisor_pid_file) and waits (at most 5 s) for the supervisor to write the daemon's pid
  // file. Returns the daemon's pid.
  static absl::StatusOr<int> Start(const Daemon& daemon);
  // True when something accepts TCP connections at daemon.listen (e.g. an agent restarted by
  // hand, which glmctl's pid file does not know about).
  static bool Served(const Daemon& daemon);

  // SIGTERM, then SIGKILL after `grace`; removes the pid file. A supervised daemon: stops the
  // supervisor first (it stops the daemon, so nothing restarts it), then does the above to a
  // daemon still alive, and removes both pid files. Returns a line describing what happened, or
  // "" when neither was running.
  static std::string Stop(const Daemon& daemon, std::chrono::milliseconds grace);

 private:
  explicit LocalCluster(std::string run_dir) : run_dir_(std::move(run_dir)) {}
  std::string run_dir_;
};

// host:port to dial for a listen address: 0.0.0.0 / [::] become loopback.
std::string DialAddress(const std::string& listen);

}  // namespace glm::cli
