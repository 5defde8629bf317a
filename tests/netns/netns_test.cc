// Four glm-agents in four network namespaces with their own addresses, the controller in the
// root namespace, joined by veth pairs on a bridge the test creates (and removes). Checks bring-up
// over real (virtual) links, kill -9 detection, and a silent partition (link down: no RST, only
// missing heartbeats) detected by the heartbeat timeout. Skips with the reason when not root or
// `ip netns` is unavailable.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string IpBin() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

CommandResult Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {IpBin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, {}, seconds(10));
}

class NetnsClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (IpBin().empty()) GTEST_SKIP() << "iproute2 `ip` not found";
    std::random_device rd;
    tag_ = absl::StrCat(rd() % 0xffff);
    subnet_ = absl::StrCat("10.203.", 1 + rd() % 250);
    bridge_ = "glmbr" + tag_;
    CommandResult probe = Ip({"netns", "add", "glmprobe" + tag_});
    if (probe.exit_code != 0) {
      GTEST_SKIP() << "`ip netns add` is unavailable here: " << probe.output;
    }
    Ip({"netns", "del", "glmprobe" + tag_});
    ASSERT_TRUE(Must({"link", "add", bridge_, "type", "bridge"}));
    created_bridge_ = true;
    ASSERT_TRUE(Must({"addr", "add", subnet_ + ".1/24", "dev", bridge_}));
    ASSERT_TRUE(Must({"link", "set", bridge_, "up"}));
    for (int i = 1; i <= 4; ++i) {
      std::string ns = Ns(i), host_if = absl::StrCat("glmv", tag_, i),
                  peer = absl::StrCat("glmp", tag_, i);
      ASSERT_TRUE(Must({"netns", "add", ns}));
      namespaces_.push_back(ns);
      ASSERT_TRUE(Must({"link", "add", host_if, "type", "veth", "peer", "name", peer}));
      ASSERT_TRUE(Must({"link", "set", peer, "netns", ns}));
      ASSERT_TRUE(Must({"link", "set", host_if, "master", bridge_}));
      ASSERT_TRUE(Must({"link", "set", host_if, "up"}));
      ASSERT_TRUE(Must({"-n", ns, "addr", "add", Addr(i) + "/24", "dev", peer}));
      ASSERT_TRUE(Must({"-n", ns, "link", "set", peer, "up"}));
      ASSERT_TRUE(Must({"-n", ns, "link", "set", "lo", "up"}));
    }
    dir_ = std::make_unique<TempDir>("glm-netns");
    yaml_ = dir_->path() + "/cluster.yaml";
    std::string nodes;
    for (int i = 1; i <= 4; ++i) {
      absl::StrAppend(&nodes, "  - name: ns-node-", i, "\n    agent: ", Addr(i), ":47101\n");
    }
    int controller_port = FreePorts(1, subnet_ + ".1").at(0);
    controller_addr_ = absl::StrCat(subnet_, ".1:", controller_port);
    WriteFile(yaml_, absl::StrCat("name: netns-", tag_, "\ncontroller:\n  listen: ",
                                  controller_addr_, "\n  insecure: true\n  gateway: ", subnet_,
                                  ".1:0\nmodel:\n  path: ", SourceDir(),
                                  "/tests/golden/tiny-dense\n  max_model_len: 512\n  kv_cache_dtype: bf16\n"
                                  "  kv_cache_bytes: 64MiB\n  activation_reserve_bytes: 256MiB\n"
                                  "  max_num_seqs: 4\nnode_defaults:\n  memory_budget_bytes: 1GiB\n",
                                  "parallel:\n  tensor: 4\nnodes:\n", nodes));
    for (int i = 1; i <= 4; ++i) agents_[i] = StartAgent(i);
    controller_ = SpawnBackground({ControllerBin(), "--config", yaml_},
                                  dir_->path() + "/controller.log");
  }

  void TearDown() override {
    if (controller_ > 0) KillNow(controller_);
    for (auto& [i, pid] : agents_) KillNow(pid);
    if (HasFailure() && dir_) {
      for (const auto& e : fs::directory_iterator(dir_->path())) {
        if (e.path().extension() == ".log") {
          std::cerr << "==== " << e.path() << "\n" << ReadFile(e.path().string());
        }
      }
    }
    for (const auto& ns : namespaces_) Ip({"netns", "del", ns});  // deletes the veth pairs
    if (created_bridge_) Ip({"link", "del", bridge_});
  }

  bool Must(const std::vector<std::string>& args) {
    CommandResult r = Ip(args);
    if (r.exit_code != 0) {
      ADD_FAILURE() << "ip";
      for (const auto& a : args) std::cerr << " " << a;
      std::cerr << ": " << r.output;
    }
    return r.exit_code == 0;
  }
  std::string Ns(int i) const { return absl::StrCat("glmt", tag_, "-", i); }
  std::string Addr(int i) const { return absl::StrCat(subnet_, ".", 10 + i); }
  int StartAgent(int i) {
    // `ip netns exec` execs the agent in place, so the pid is the agent's.
    return SpawnBackground({IpBin(), "netns", "exec", Ns(i), AgentBin(), "serve", "--listen",
                            Addr(i) + ":47101", "--node", absl::StrCat("ns-node-", i),
                            "--allow-no-gpu", "--insecure"},
                           absl::StrCat(dir_->path(), "/agent-", i, ".log"));
  }
  CommandResult Glmctl(std::vector<std::string> args, milliseconds timeout) {
    args.insert(args.begin(), GlmctlBin());
    return RunCommand(args, {{"GLMCTL_STATE_DIR", dir_->path() + "/state"}}, timeout);
  }
  std::string NodeState(const std::string& node) {
    CommandResult r = Glmctl({"status", "--json", yaml_}, seconds(10));
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    if (r.exit_code != 0 || j.is_discarded()) return "";
    for (const auto& n : j["nodes"])
      if (n["name"] == node) return n["state"];
    return "";
  }

  std::string tag_, subnet_, bridge_, yaml_, controller_addr_;
  bool created_bridge_ = false;
  std::vector<std::string> namespaces_;
  std::unique_ptr<TempDir> dir_;
  std::map<int, int> agents_;
  int controller_ = 0;
};

TEST_F(NetnsClusterTest, UpAcrossNamespacesDetectsKillAndPartition) {
  CommandResult up = Glmctl({"up", yaml_}, seconds(90));
  ASSERT_EQ(up.exit_code, 0) << up.output;
  ASSERT_EQ(Glmctl({"health", yaml_}, seconds(10)).exit_code, 0);

  // kill -9: the stream breaks at once.
  ::kill(agents_[2], SIGKILL);
  auto killed = PollUntil([&] { return NodeState("ns-node-2") == "Unreachable"; }, seconds(3));
  ASSERT_GE(killed.count(), 0) << "ns-node-2 not Unreachable within 3 s";
  std::cout << "[ measure ] netns kill -9 -> Unreachable: " << killed.count() << " ms\n";
  KillNow(agents_[2]);
  agents_[2] = StartAgent(2);
  // Back and alive without its shard: the controller's self-healing re-forms the replica's
  // group, runs the canary and re-admits it with no command.
  auto back = PollUntil([&] { return Glmctl({"health", yaml_}, seconds(10)).exit_code == 0; },
                        seconds(30));
  ASSERT_GE(back.count(), 0) << "the replica is not Ready again (self-healing) within 30 s";
  std::cout << "[ measure ] netns agent restart -> replica Ready (self-healed): " << back.count()
            << " ms\n";

  // Silent partition: the link goes down, nothing is reset; heartbeats stop.
  std::string host_if = absl::StrCat("glmv", tag_, 3);
  ASSERT_TRUE(Must({"link", "set", host_if, "down"}));
  auto parted = PollUntil([&] { return NodeState("ns-node-3") == "Unreachable"; }, seconds(6));
  ASSERT_GE(parted.count(), 0) << "partitioned ns-node-3 not Unreachable within 6 s";
  std::cout << "[ measure ] netns link down -> Unreachable: " << parted.count()
            << " ms (heartbeat timeout 3 s)\n";
  EXPECT_NE(Glmctl({"health", yaml_}, seconds(10)).exit_code, 0);
  ASSERT_TRUE(Must({"link", "set", host_if, "up"}));
  auto healed = PollUntil([&] { return NodeState("ns-node-3") == "Ready"; }, seconds(20));
  ASSERT_GE(healed.count(), 0) << "ns-node-3 did not come back after the link came up";
  std::cout << "[ measure ] netns link up -> Ready: " << healed.count() << " ms\n";
  // Its replica serves again (at once when its group held through the partition, else after
  // self-healing re-formed it).
  EXPECT_GE(PollUntil([&] { return Glmctl({"health", yaml_}, seconds(10)).exit_code == 0; },
                      seconds(30))
                .count(),
            0);
}

}  // namespace
}  // namespace glm::testing
