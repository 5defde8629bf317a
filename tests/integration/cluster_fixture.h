// The fixture of the tests that run a cluster of real processes on loopback: a temp dir holding
// cluster.yaml, glmctl's state and the daemons' logs, and ports picked at run time. A test either
// lets `glmctl up` start the daemons (ClusterYaml::local) or starts them itself (StartAgent,
// StartController), then drives glmctl.
//
// TearDown stops everything: `glmctl down` for a local cluster (a daemon it leaves running fails
// the test and is killed), SIGKILL for every process the test started. When the test failed it
// prints every daemon's log.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace glm::testing {

class LoopbackClusterTest : public ::testing::Test {
 protected:
  struct Node {
    std::string name;
    std::string yaml;  // further lines of its `nodes:` entry ("    fabric_ip: 127.0.0.1\n")
  };
  // cluster.yaml on loopback. Model defaults: tests/golden/tiny-dense, max_model_len 512, bf16
  // KV, 256 MiB activation reserve, 4 sequences, 1 GiB memory budget per node.
  struct ClusterYaml {
    bool local = false;            // `glmctl up` starts the daemons and `glmctl down` stops them
    std::string model_path;        // empty: tests/golden/tiny-dense in the source tree
    std::string kv_cache_bytes = "64MiB";
    std::string controller_lines;  // further lines under `controller:` ("  tls: {...}\n")
    std::string model_lines;       // further lines under `model:` ("  canary: {...}\n")
    std::string parallel_lines;    // lines under `parallel:`; empty: "  tensor: <nodes>\n"
    std::string sections;          // further top-level sections (nccl, fabric, page_cache)
    std::vector<Node> nodes;
  };

  // `prefix` names the temp dir and the cluster ("<prefix>-<pid>").
  explicit LoopbackClusterTest(const std::string& prefix);
  void TearDown() override;

  // Writes yaml_. The first call (or one with another number of nodes) picks free ports: the
  // controller listens on ports_[0], node i's agent on ports_[i + 1], the gateway on the last
  // port (unless controller_lines names its own gateway:).
  void WriteClusterYaml(const ClusterYaml& cluster);

  // Starts `glm-agent serve --listen <node i's address> --node <name> <args>`, logging to
  // <dir>/agent-<name>.log; killed at TearDown. Returns its pid.
  int StartAgent(size_t i, const std::vector<std::string>& args);
  // Starts `glm-controller --config cluster.yaml`, logging to <dir>/controller.log.
  int StartController();
  // Waits (at most 20 s each) until the controller and every agent accept connections; fails
  // the test (fatally) naming the port otherwise.
  void WaitForPorts();

  // "127.0.0.1:<port>" of node i's agent.
  std::string AgentAddress(size_t i) const;
  CommandResult Glmctl(std::vector<std::string> args,
                       std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // `glmctl status --json`; null when the command or its JSON fails.
  nlohmann::json StatusJson();
  // The state of `node` in `glmctl status --json` ("" when status fails); the whole status in
  // `status` when given.
  std::string NodeState(const std::string& node, nlohmann::json* status = nullptr);
  // The pid glmctl recorded for a daemon it started ("controller", "agent-node-2").
  int RunDirPid(const std::string& daemon) const;

  std::unique_ptr<TempDir> dir_;
  std::string name_;     // the cluster's name
  std::string yaml_;     // <dir>/cluster.yaml
  std::string run_dir_;  // where glmctl keeps a local cluster's pids and logs
  int GatewayPort() const { return ports_.back(); }
  std::vector<int> ports_;
  std::map<std::string, std::string> env_;  // glmctl's environment
  std::vector<int> pids_;                   // started by the test; SIGKILLed at TearDown

 private:
  bool local_ = false;
  std::vector<std::string> node_names_;
};

}  // namespace glm::testing
