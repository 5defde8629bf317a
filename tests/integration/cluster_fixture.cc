#include "tests/integration/cluster_fixture.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace glm::testing {

namespace fs = std::filesystem;
using std::chrono::seconds;

LoopbackClusterTest::LoopbackClusterTest(const std::string& prefix)
    : dir_(std::make_unique<TempDir>("glm-" + prefix)),
      name_(absl::StrCat(prefix, "-", ::getpid())),
      yaml_(dir_->path() + "/cluster.yaml"),
      run_dir_(dir_->path() + "/.glmctl/" + name_),
      env_({{"GLMCTL_STATE_DIR", dir_->path() + "/state"},
            {"GLM_BIN_DIR", fs::path(GlmctlBin()).parent_path().string()}}) {}

void LoopbackClusterTest::TearDown() {
  std::error_code ec;
  if (local_) {
    CommandResult down = Glmctl({"down", yaml_}, seconds(30));
    for (const auto& entry : fs::directory_iterator(run_dir_, ec)) {
      if (entry.path().extension() != ".pid") continue;
      const int pid = std::atoi(ReadFile(entry.path().string()).c_str());
      if (ProcessAlive(pid)) {
        ADD_FAILURE() << "glmctl down left " << entry.path() << " running:\n" << down.output;
        KillNow(pid);
      }
    }
  }
  for (int pid : pids_) KillNow(pid);
  if (HasFailure()) {
    for (const std::string& dir : {dir_->path(), run_dir_}) {
      for (const auto& entry : fs::directory_iterator(dir, ec)) {
        if (entry.path().extension() == ".log") {
          std::cerr << "==== " << entry.path() << "\n" << ReadFile(entry.path().string());
        }
      }
    }
  }
}

void LoopbackClusterTest::WriteClusterYaml(const ClusterYaml& cluster) {
  local_ = cluster.local;
  if (ports_.size() != cluster.nodes.size() + 2) {
    ports_ = FreePorts(static_cast<int>(cluster.nodes.size()) + 2);
  }
  node_names_.clear();
  std::string text = absl::StrCat(
      "name: ", name_, "\nlocal: ", cluster.local ? "true" : "false",
      "\ncontroller:\n  listen: 127.0.0.1:", ports_[0], "\n",
      cluster.controller_lines.find("gateway:") == std::string::npos
          ? absl::StrCat("  gateway: 127.0.0.1:", ports_.back(), "\n")
          : "",
      cluster.controller_lines,
      "model:\n  path: ",
      cluster.model_path.empty() ? SourceDir() + "/tests/golden/tiny-dense" : cluster.model_path,
      "\n  max_model_len: 512\n  kv_cache_dtype: bf16\n  kv_cache_bytes: ", cluster.kv_cache_bytes,
      "\n  activation_reserve_bytes: 256MiB\n  max_num_seqs: 4\n", cluster.model_lines,
      "node_defaults:\n  memory_budget_bytes: 1GiB\nparallel:\n",
      cluster.parallel_lines.empty() ? absl::StrCat("  tensor: ", cluster.nodes.size(), "\n")
                                     : cluster.parallel_lines,
      cluster.sections, "nodes:\n");
  for (size_t i = 0; i < cluster.nodes.size(); ++i) {
    node_names_.push_back(cluster.nodes[i].name);
    absl::StrAppend(&text, "  - name: ", cluster.nodes[i].name, "\n    agent: ", AgentAddress(i),
                    "\n", cluster.nodes[i].yaml);
  }
  WriteFile(yaml_, text);
}

int LoopbackClusterTest::StartAgent(size_t i, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {AgentBin(), "serve", "--listen", AgentAddress(i), "--node",
                                   node_names_.at(i)};
  argv.insert(argv.end(), args.begin(), args.end());
  const int pid =
      SpawnBackground(argv, absl::StrCat(dir_->path(), "/agent-", node_names_[i], ".log"));
  pids_.push_back(pid);
  return pid;
}

int LoopbackClusterTest::StartController() {
  const int pid =
      SpawnBackground({ControllerBin(), "--config", yaml_}, dir_->path() + "/controller.log");
  pids_.push_back(pid);
  return pid;
}

void LoopbackClusterTest::WaitForPorts() {
  for (size_t i = 0; i + 1 < ports_.size(); ++i) {
    const int port = ports_[i];
    ASSERT_GE(PollUntil([&] { return LoopbackPortOpen(port); }, seconds(20)).count(), 0)
        << "port " << port << " never opened";
  }
}

std::string LoopbackClusterTest::AgentAddress(size_t i) const {
  return absl::StrCat("127.0.0.1:", ports_.at(i + 1));
}

CommandResult LoopbackClusterTest::Glmctl(std::vector<std::string> args,
                                          std::chrono::milliseconds timeout) {
  args.insert(args.begin(), GlmctlBin());
  return RunCommand(args, env_, timeout);
}

nlohmann::json LoopbackClusterTest::StatusJson() {
  CommandResult r = Glmctl({"status", "--json", yaml_}, seconds(10));
  if (r.exit_code != 0) return nullptr;
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

std::string LoopbackClusterTest::NodeState(const std::string& node, nlohmann::json* status) {
  nlohmann::json j = StatusJson();
  if (j.is_null()) return "";
  if (status != nullptr) *status = j;
  for (const auto& n : j["nodes"]) {
    if (n["name"] == node) return n["state"];
  }
  return "";
}

int LoopbackClusterTest::RunDirPid(const std::string& daemon) const {
  return std::atoi(ReadFile(run_dir_ + "/" + daemon + ".pid").c_str());
}

}  // namespace glm::testing
