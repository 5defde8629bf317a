// Node preflight through the real daemons on loopback: agents read fixture sysfs/proc trees
// (tests/fixtures/sysfs, copied to a temp dir), the controller runs every node's checks.
//   - `glmctl preflight` shows every check per node and the resolved GID index side by side,
//     warning when nodes disagree; a failed gid.index makes it and `glmctl up` fail naming the
//     node, the check and the fix.
//   - After bring-up the agent's GID watcher turns a change of the tree into a Degraded node in
//     `glmctl status`.
//   - Agents serving the path-MTU echo on their fabric IP give peers' mtu.path checks a target.

#include <filesystem>
#include <iostream>

#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

struct NodeDef {
  std::string name;
  std::string fixture;  // tests/fixtures/sysfs/<fixture>; empty: the real host, no RDMA
  std::string fabric_yaml;  // extra YAML lines of the node (fabric_ip, hca, ...)
  std::vector<std::string> agent_args;
};

class PreflightClusterTest : public LoopbackClusterTest {
 protected:
  PreflightClusterTest() : LoopbackClusterTest("pftest") {}

  // Writes cluster.yaml (not local: this test starts the daemons itself).
  void WriteYaml(const std::vector<NodeDef>& nodes) {
    ClusterYaml cluster;
    cluster.sections = "fabric: {mtu: 9000}\n";
    for (const NodeDef& n : nodes) cluster.nodes.push_back({n.name, n.fabric_yaml});
    WriteClusterYaml(cluster);
  }

  void Start(const std::vector<NodeDef>& nodes) {
    WriteYaml(nodes);
    for (size_t i = 0; i < nodes.size(); ++i) {
      std::vector<std::string> args = {"--allow-no-gpu"};
      if (!nodes[i].fixture.empty()) {
        std::string root = dir_->path() + "/" + nodes[i].name;
        fs::copy(SourceDir() + "/tests/fixtures/sysfs/" + nodes[i].fixture, root,
                 fs::copy_options::recursive);
        args.insert(args.end(), {"--sysfs-root", root + "/sys", "--proc-root", root + "/proc",
                                 "--dev-root", root + "/dev"});
      }
      args.insert(args.end(), nodes[i].agent_args.begin(), nodes[i].agent_args.end());
      StartAgent(i, args);
    }
    StartController();
    WaitForPorts();
  }

  nlohmann::json Json(const CommandResult& r) {
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.output;
    return j;
  }
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
  ASSERT_NO_FATAL_FAILURE(Start(nodes));

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
  ASSERT_NO_FATAL_FAILURE(
      Start({{"spark1", "healthy", kSpark1Fabric, {"--gid-watch-ms", "100"}},
             {"spark2", "gid_linklocal_at_3", kSpark2FabricAuto, {"--gid-watch-ms", "100"}}}));
  CommandResult up = Glmctl({"up", yaml_}, seconds(90));
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("different GID indices"), std::string::npos) << up.output;

  nlohmann::json status;
  auto state_of = [&](const std::string& node) { return NodeState(node, &status); };
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
  ASSERT_NO_FATAL_FAILURE(Start({{"a1", "", "    fabric_ip: 127.0.0.1\n",
                                  {"--fabric-ip", "127.0.0.1", "--mtu-echo-port", "0",
                                   "--stage-root", stage, "--stage-port", "0"}},
                                 {"a2", "", "    fabric_ip: 127.0.0.2\n",
                                  {"--fabric-ip", "127.0.0.2", "--mtu-echo-port", "0"}}}));
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
