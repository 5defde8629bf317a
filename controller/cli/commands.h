// glmctl subcommands. Each returns the process exit code:
//   0 success; 1 the operation failed (bring-up stopped, cluster unhealthy, ...);
//   2 usage or configuration error (bad YAML, bad flags); 3 the controller cannot be reached.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace glm::cli {

struct GlobalFlags {
  std::string controller;  // --controller ADDR (overrides controller.listen)
  bool json = false;       // --json
};

int RunUp(const std::string& config, const GlobalFlags& flags, bool force);
int RunStatus(const std::string& config, const GlobalFlags& flags);
int RunHealth(const std::string& config, const GlobalFlags& flags);
// `glmctl restart`: restart replicas' shard groups through the controller (Controller.Restart),
// printing its progress as it comes. Exit kOk when every replica asked for is back in service.
struct RestartFlags {
  bool rolling = false;
  std::vector<int> replicas;   // empty: all
  double drain_timeout_s = 0;  // 0: lifecycle.drain_timeout_s
  bool processes = false;      // restart the agent daemons too
};
int RunRestart(const std::string& config, const GlobalFlags& flags, const RestartFlags& restart);
// One request through the controller to a Ready replica's head shard.
struct GenerateFlags {
  std::string tokens;        // "1,2,3": the prompt's token ids
  int max_tokens = 16;
  double temperature = 0.0;  // 0 = greedy
  int64_t seed = 0;          // 0 = the engine picks one
  double timeout_s = 600;
};
// Prints the generated ids, comma-separated, as the last stdout line (a summary line before it
// says the finish reason and counts). kFailed when no replica is Ready or the request failed.
int RunGenerate(const std::string& config, const GlobalFlags& flags, const GenerateFlags& gen);
// `glmctl logs [cluster.yaml] NODE`: one daemon's recent log lines (the in-memory ring each
// daemon keeps), through the controller. NODE is a node of cluster.yaml or "controller".
struct LogsFlags {
  std::vector<std::string> args;  // [cluster.yaml] NODE, as given
  int tail = 0;                   // --tail N; 0: the last 200 lines
  bool follow = false;            // --follow/-f: then print new lines until Ctrl-C (exit 0)
};
// kUsage for an unknown node or bad flags; kFailed when the node's agent cannot be reached.
int RunLogs(const std::string& config, const GlobalFlags& flags, const LogsFlags& logs);
int RunDown(const std::string& config, const GlobalFlags& flags);
int RunValidate(const std::string& config, const GlobalFlags& flags);
// Runs every node's preflight through the controller (starting a local cluster's processes
// first, as `up` does); exit 0 only when no check failed and every agent answered.
int RunPreflight(const std::string& config, const GlobalFlags& flags);
int RunPlan(const std::string& config, const GlobalFlags& flags);
int RunCerts(const std::string& config, const std::string& out_dir, bool force);

// The cluster.yaml to use when none is given: $GLMCTL_CONFIG, else the one the last successful
// `glmctl up` used (remembered in $GLMCTL_STATE_DIR, $XDG_STATE_HOME/glmctl or
// ~/.local/state/glmctl). Empty when neither exists.
std::string DefaultConfig();

}  // namespace glm::cli
