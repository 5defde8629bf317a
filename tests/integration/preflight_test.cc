// Node preflight through the real daemons on loopback: agents read fixture sysfs/proc trees
// (tests/fixtures/sysfs, copied to a temp dir), the controller runs every node's checks.
//   - `glmctl preflight` shows every check per node and the resolved GID index side by side,
//     warning when nodes disagree; a failed gid.index makes it and `glmctl up` fail naming the
//     node, the check and the fix.
//   - After bring-up the agent's GID watcher turns a change of the tree into a Degraded node in
//     `glmctl status`.
//   - Agents serving the path-MTU echo on their fabric IP give peers' mtu.path checks a target.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct NodeDef {
  std::string name;
  std::string fixture;  // tests/fixtures/sysfs/<fixture>; empty: the real host, no RDMA
  std::string fabric_yaml;  // extra YAML lines of the node (fabric_ip, hca, ...)
  std::vector<std::string> agent_args;
};

class PreflightClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("glm-pftest");
    name_ = absl::StrCat("pftest-", ::getpid());
    yaml_ = dir_->path() + "/cluster.yaml";
    env_ = {{"GLMCTL_STATE_DIR", dir_->path() + "/state"}};
  }
  void TearDown() override {
    for (int pid : pids_) KillNow(pid);
    if (HasFailure()) {
      for (const auto& e : fs::directory_iterator(dir_->path(), ec_)) {
        if (e.path().extension() == ".log") {
          std::cerr << "==== " << e.path() << "\n" << ReadFile(e.path().string());
        }
      }
    }
  }

  // Writes cluster.yaml (not local: this test starts the daemons itself).
  void WriteYaml(const std::vector<NodeDef>& nodes, const std::string& fabric = "fabric: {mtu: 9000}\n") {
    std::string text = absl::StrCat(
        "name: ", name_, "\ncontroller:\n  listen: 127.0.0.1:", ports_[0], "\nmodel:\n  path: ",
        SourceDir(),
        "/tests/golden/tiny-dense\n  max_model_len: 512\n  kv_cache_dtype: bf16\n"
        "  kv_cache_bytes: 64MiB\n  activation_reserve_bytes: 256MiB\n  max_num_seqs: 4\n"
        "node_defaults:\n  memory_budget_bytes: 1GiB\nparallel:\n  tensor: ",
        nodes.size(), "\n", fabric, "nodes:\n");
    for (size_t i = 0; i < nodes.size(); ++i) {
      absl::StrAppend(&text, "  - name: ", nodes[i].name, "\n    agent: 127.0.0.1:", ports_[i + 1],
                      "\n", nodes[i].fabric_yaml);
    }
    WriteFile(yaml_, text);
  }

  void Start(const std::vector<NodeDef>& nodes) {
    ports_ = FreePorts(static_cast<int>(nodes.size()) + 1);
    WriteYaml(nodes);
    for (size_t i = 0; i < nodes.size(); ++i) {
      std::vector<std::string> argv = {AgentBin(), "serve", "--listen",
                                       absl::StrCat("127.0.0.1:", ports_[i + 1]), "--node",
                                       nodes[i].name, "--allow-no-gpu"};
      if (!nodes[i].fixture.empty()) {
        std::string root = dir_->path() + "/" + nodes[i].name;
        fs::copy(SourceDir() + "/tests/fixtures/sysfs/" + nodes[i].fixture, root,
                 fs::copy_options::recursive);
        argv.insert(argv.end(), {"--sysfs-root", root + "/sys", "--proc-root", root + "/proc",
                                 "--dev-root", root + "/dev"});
      }
      argv.insert(argv.end(), nodes[i].agent_args.begin(), nodes[i].agent_args.end());
      pids_.push_back(SpawnBackground(argv, dir_->path() + "/agent-" + nodes[i].name + ".log"));
    }
    pids_.push_back(SpawnBackground({ControllerBin(), "--config", yaml_},
                                    dir_->path() + "/controller.log"));
    for (int port : ports_) {
      ASSERT_GE(PollUntil([&] { return LoopbackPortOpen(port); }, seconds(20)).count(), 0)
          << "port " << port << " never opened";
    }
  }

  CommandResult Glmctl(std::vector<std::string> args, milliseconds timeout = seconds(60)) {
    args.insert(args.begin(), GlmctlBin());
    return RunCommand(args, env_, timeout);
  }

  nlohmann::json Json(const CommandResult& r) {
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.output;
    return j;
  }

  std::unique_ptr<TempDir> dir_;
  std::string name_, yaml_;
  std::vector<int> ports_;
  std::vector<int> pids_;
  std::map<std::string, std::string> env_;
  std::error_code ec_;
};

const char kSpark1Fabric[] =
    "    fabric_ip: 192.168.100.1\n    hca: rocep1s0f0\n    port: 1\n    gid_index: auto\n"
    "    netdev: enp1s0f0np0\n";
const char kSpark2FabricAuto[] =
    "    fabric_ip: 192.168.100.2\n    hca: rocep1s0f0\n    port: 1\n    gid_index: auto\n"
    "    netdev: enp1s0f0np0\n";
const char kSpark2FabricAt3[] =
    "    fabric_ip: 192.168.100.2\n    hca: rocep1s0f0\n    port: 1\n    gid_index: 3\n"
    "    netdev: enp1s0f0np0\n";

TEST_F(PreflightClusterTest, GidIndicesSideBySideAndFailedGidStopsUp) {
  std::vector<NodeDef> nodes = {{"spark1", "healthy", kSpark1Fabric, {}},
                                {"spark2", "gid_linklocal_at_3", kSpark2FabricAuto, {}}};
  Start(nodes);

  // auto resolves 3 on spark1 and 4 on spark2: passes, with a warning naming both.
  CommandResult table = Glmctl({"preflight", yaml_});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("gid.index"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("rdma.port_state"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("host.cpu.count"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("GID index"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("index 3 on spark1"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("index 4 on spark2"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("WARNING"), std::string::npos) << table.output;
  std::cout << table.output;

  CommandResult json = Glmctl({"preflight", "--json", yaml_});
  EXPECT_EQ(json.exit_code, 0) << json.output;
  nlohmann::json j = Json(json);
  ASSERT_EQ(j["nodes"].size(), 2u) << json.output;
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["nodes"][0]["node"], "spark1");
  EXPECT_EQ(j["nodes"][0]["gid"]["index"], 3);
  EXPECT_EQ(j["nodes"][0]["gid"]["gid"], "::ffff:192.168.100.1");
  EXPECT_EQ(j["nodes"][1]["gid"]["index"], 4);
  EXPECT_NE(j["gid_warning"].get<std::string>().find("spark2"), std::string::npos);

  // spark2 pinned to index 3, where a link-local entry sits: preflight and up fail naming it.
  nodes[1].fabric_yaml = kSpark2FabricAt3;
  WriteYaml(nodes);
  CommandResult failed = Glmctl({"preflight", yaml_});
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_NE(failed.output.find("spark2: gid.index FAIL"), std::string::npos) << failed.output;

  CommandResult up = Glmctl({"up", yaml_}, seconds(90));
  EXPECT_EQ(up.exit_code, 1) << up.output;
  EXPECT_NE(up.output.find("node 'spark2': check gid.index failed"), std::string::npos)
      << up.output;
  EXPECT_NE(up.output.find("Fix:"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("4"), std::string::npos) << up.output;
  EXPECT_EQ(up.output.find("node 'spark1': check"), std::string::npos) << up.output;
  std::cout << up.output;
}

TEST_F(PreflightClusterTest, GidChangeAfterBringUpShowsDegradedInStatus) {
  Start({{"spark1", "healthy", kSpark1Fabric, {"--gid-watch-ms", "100"}},
         {"spark2", "gid_linklocal_at_3", kSpark2FabricAuto, {"--gid-watch-ms", "100"}}});
  CommandResult up = Glmctl({"up", yaml_}, seconds(90));
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("different GID indices"), std::string::npos) << up.output;

  nlohmann::json status;
  auto state_of = [&](const std::string& node) -> std::string {
    CommandResult r = Glmctl({"status", "--json", yaml_}, seconds(10));
    if (r.exit_code != 0) return "";
    status = nlohmann::json::parse(r.output, nullptr, false);
    if (status.is_discarded()) return "";
    for (const auto& n : status["nodes"])
      if (n["name"] == node) return n["state"];
    return "";
  };
  ASSERT_GE(PollUntil([&] { return state_of("spark1") == "Ready"; }, seconds(10)).count(), 0)
      << status.dump(2);
  EXPECT_EQ(status["nodes"][0]["gid"]["index"], 3) << status.dump(2);

  // DHCP fell back to link-local on spark1: index 3 is now 169.254.12.7, the fabric IP moved
  // to index 5.
  const std::string port = dir_->path() + "/spark1/sys/class/infiniband/rocep1s0f0/ports/1";
  WriteFile(port + "/gid_attrs/types/5", "RoCE v2\n");
  WriteFile(port + "/gid_attrs/ndevs/5", "enp1s0f0np0\n");
  WriteFile(port + "/gids/5", "0000:0000:0000:0000:0000:ffff:c0a8:6401\n");
  WriteFile(port + "/gids/3", "0000:0000:0000:0000:0000:ffff:a9fe:0c07\n");
  auto took = PollUntil([&] { return state_of("spark1") == "Degraded"; }, seconds(10));
  ASSERT_GE(took.count(), 0) << status.dump(2);
  std::cout << "[ measure ] GID change -> Degraded in glmctl status: " << took.count() << " ms\n";
  std::string err = status["nodes"][0]["last_error"];
  EXPECT_NE(err.find("index 3"), std::string::npos) << err;
  EXPECT_NE(err.find("index 5"), std::string::npos) << err;
  EXPECT_EQ(status["nodes"][0]["gid"]["index"], 5) << status.dump(2);
  EXPECT_EQ(status["replicas"][0]["state"], "Degraded") << status.dump(2);
  EXPECT_EQ(state_of("spark2"), "Ready");

  CommandResult table = Glmctl({"status", yaml_}, seconds(10));
  EXPECT_NE(table.output.find("spark1 degraded: gid.index changed"), std::string::npos)
      << table.output;
  EXPECT_EQ(Glmctl({"health", yaml_}, seconds(10)).exit_code, 1);
}

TEST_F(PreflightClusterTest, AgentsServeThePathMtuEchoForPeers) {
  std::string stage = dir_->path() + "/weights";
  fs::create_directories(stage);
  Start({{"a1", "", "    fabric_ip: 127.0.0.1\n",
          {"--fabric-ip", "127.0.0.1", "--mtu-echo-port", "0", "--stage-root", stage,
           "--stage-port", "0"}},
         {"a2", "", "    fabric_ip: 127.0.0.2\n",
          {"--fabric-ip", "127.0.0.2", "--mtu-echo-port", "0"}}});
  CommandResult json = Glmctl({"preflight", "--json", yaml_});
  nlohmann::json j = Json(json);
  ASSERT_EQ(j["nodes"].size(), 2u) << json.output;
  for (const auto& n : j["nodes"]) {
    int probes = 0;
    for (const auto& c : n["checks"]) {
      if (c["id"] != "mtu.path") continue;
      ++probes;
      EXPECT_EQ(c["status"], "pass") << c.dump();
    }
    EXPECT_EQ(probes, 1) << n.dump(2);
    EXPECT_TRUE(n["gid"].is_null());
  }
}

}  // namespace
}  // namespace glm::testing
