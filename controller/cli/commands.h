// glmctl subcommands. Each returns the process exit code:
//   0 success; 1 the operation failed (bring-up stopped, cluster unhealthy, ...);
//   2 usage or configuration error (bad YAML, bad flags); 3 the controller cannot be reached.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cluster/spec/cluster_spec.h"
#include "controller/cli/certs.h"

namespace glm::cli {

struct GlobalFlags {
  std::string controller;  // --controller ADDR (overrides controller.listen)
  bool json = false;       // --json
};

// What `glmctl validate` says of the control plane's exposure without controller.tls: an error
// when the controller would refuse to start (plaintext beyond loopback, no opt-out), warnings
// when it is open by opt-out or a multi-host cluster would need every agent on loopback.
struct ControlPlaneCheck {
  std::string error;
  std::vector<std::string> warnings;
};
ControlPlaneCheck CheckControlPlane(const cluster::ClusterSpec& spec, const std::string& config);

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
  int mtp_draft_tokens = -1;  // MTP drafts per step for this request; -1 = the replica's
  bool logprobs = false;      // print each generated token's raw logprob
};
// Prints the generated ids, comma-separated, as the last stdout line (a summary line before it
// says the finish reason and counts; with --logprobs a `logprobs=` line of each token's raw
// logprob comes before the ids). kFailed when no replica is Ready or the request failed.
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
// `glmctl plan`: the placement, memory budget and projected decode rate. `mtp_acceptance`
// (--mtp-acceptance) replaces the assumed MTP acceptance: a number in [0, 1] (accepted / drafted
// draft tokens, as `glmctl status` reports it), or "measured": the counters of the running
// cluster's replicas, read from its controller (an error when none has drafted yet).
int RunPlan(const std::string& config, const GlobalFlags& flags,
            const std::optional<std::string>& mtp_acceptance = std::nullopt);
// `glmctl certs`: a new CA and every certificate, or with options.renew fresh leaves from the
// CA already in options.out_dir (certs.h).
int RunCerts(const std::string& config, const CertsOptions& options);

// The cluster.yaml to use when none is given: $GLMCTL_CONFIG, else the one the last successful
// `glmctl up` used (remembered in $GLMCTL_STATE_DIR, $XDG_STATE_HOME/glmctl or
// ~/.local/state/glmctl). Empty when neither exists.
std::string DefaultConfig();

}  // namespace glm::cli
