// Path MTU between two real glm-agent daemons in two network namespaces, checked by the
// controller's preflight (`glmctl preflight --json`): the namespaces share a fabric veth pair
// whose ends have different MTUs (9000 in A, 1500 in B) on a fabric.mtu: 9000 cluster, so both
// nodes' mtu.path checks fail, naming the peer and the largest size that passed (~1500); with
// B's end raised to 9000 the same preflight passes. The control plane (gRPC to the agents) runs
// over a second veth per namespace on a bridge in the root namespace, where the controller and
// glmctl run. The test creates and removes all of it; addresses exist only on its own links.
// Skips with the reason when not root or `ip netns` is unavailable.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

std::string IpBin() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// True when something accepts TCP connections on host:port (the agents' control addresses are
// reachable from the root namespace through the bridge).
bool TcpOpen(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval limit{1, 0};  // Bounds connect().
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

CommandResult Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {IpBin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, {}, seconds(10));
}

class MtuDaemonsNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (IpBin().empty()) GTEST_SKIP() << "iproute2 `ip` not found";
    std::random_device rd;
    tag_ = absl::StrCat(rd() % 0xffff);
    int octet = 1 + static_cast<int>(rd() % 250);
    control_ = absl::StrCat("10.207.", octet);
    fabric_ = absl::StrCat("10.208.", octet);
    bridge_ = "glmmb" + tag_;
    CommandResult probe = Ip({"netns", "add", "glmmprobe" + tag_});
    if (probe.exit_code != 0) GTEST_SKIP() << "`ip netns add` is unavailable here: " << probe.output;
    Ip({"netns", "del", "glmmprobe" + tag_});

    ASSERT_TRUE(Must({"link", "add", bridge_, "type", "bridge"}));
    created_bridge_ = true;
    ASSERT_TRUE(Must({"addr", "add", control_ + ".1/24", "dev", bridge_}));
    ASSERT_TRUE(Must({"link", "set", bridge_, "up"}));
    for (int i = 0; i < 2; ++i) {
      std::string ns = Ns(i), host_if = absl::StrCat("glmmh", tag_, i),
                  peer = absl::StrCat("glmmc", tag_, i);
      ASSERT_TRUE(Must({"netns", "add", ns}));
      namespaces_.push_back(ns);
      ASSERT_TRUE(Must({"link", "add", host_if, "type", "veth", "peer", "name", peer}));
      ASSERT_TRUE(Must({"link", "set", peer, "netns", ns}));
      ASSERT_TRUE(Must({"link", "set", host_if, "master", bridge_}));
      ASSERT_TRUE(Must({"link", "set", host_if, "up"}));
      ASSERT_TRUE(Must({"-n", ns, "addr", "add", ControlAddr(i) + "/24", "dev", peer}));
      ASSERT_TRUE(Must({"-n", ns, "link", "set", peer, "up"}));
      ASSERT_TRUE(Must({"-n", ns, "link", "set", "lo", "up"}));
    }
    // The fabric: one veth pair straight from A to B, 9000 at A's end, 1500 at B's.
    ASSERT_TRUE(Must({"link", "add", FabricIf(0), "netns", Ns(0), "type", "veth", "peer", "name",
                      FabricIf(1), "netns", Ns(1)}));
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(Must({"-n", Ns(i), "addr", "add", FabricAddr(i) + "/24", "dev", FabricIf(i)}));
      ASSERT_TRUE(Must({"-n", Ns(i), "link", "set", FabricIf(i), "mtu", i == 0 ? "9000" : "1500",
                        "up"}));
    }

    dir_ = std::make_unique<TempDir>("glm-mtu-netns");
    yaml_ = dir_->path() + "/cluster.yaml";
    std::string nodes;
    for (int i = 0; i < 2; ++i) {
      absl::StrAppend(&nodes, "  - name: ", Node(i), "\n    agent: ", ControlAddr(i),
                      ":47101\n    fabric_ip: ", FabricAddr(i), "\n");
    }
    controller_port_ = FreePorts(1, control_ + ".1").at(0);
    WriteFile(yaml_, absl::StrCat("name: mtu-netns-", tag_, "\ncontroller:\n  listen: ", control_,
                                  ".1:", controller_port_, "\n  insecure: true\n  gateway: ", control_,
                                  ".1:0\nmodel:\n  path: ", SourceDir(),
                                  "/tests/golden/tiny-dense\n  max_model_len: 512\n"
                                  "  kv_cache_dtype: bf16\n  kv_cache_bytes: 64MiB\n"
                                  "  activation_reserve_bytes: 256MiB\n  max_num_seqs: 4\n"
                                  "node_defaults:\n  memory_budget_bytes: 1GiB\n"
                                  "parallel:\n  tensor: 2\nfabric: {mtu: 9000}\nnodes:\n", nodes));
    for (int i = 0; i < 2; ++i) {
      // `ip netns exec` execs the agent in place, so the pid is the agent's. The agent serves its
      // UDP path-MTU echo (and the stage port) on the fabric address.
      agents_.push_back(SpawnBackground(
          {IpBin(), "netns", "exec", Ns(i), AgentBin(), "serve", "--listen",
           ControlAddr(i) + ":47101", "--node", Node(i), "--allow-no-gpu", "--fabric-ip",
           FabricAddr(i), "--mtu-echo-port", "0", "--stage-port", "0", "--insecure"},
          absl::StrCat(dir_->path(), "/agent-", Node(i), ".log")));
    }
    controller_ = SpawnBackground({ControllerBin(), "--config", yaml_},
                                  dir_->path() + "/controller.log");
  }

  void TearDown() override {
    if (controller_ > 0) KillNow(controller_);
    for (int pid : agents_) KillNow(pid);
    if (HasFailure() && dir_) {
      for (const auto& e : fs::directory_iterator(dir_->path())) {
        if (e.path().extension() == ".log") {
          std::cerr << "==== " << e.path() << "\n" << ReadFile(e.path().string());
        }
      }
    }
    for (const auto& ns : namespaces_) Ip({"netns", "del", ns});  // Deletes the veths in it.
    if (created_bridge_) Ip({"link", "del", bridge_});
  }

  bool Must(const std::vector<std::string>& args) {
    CommandResult r = Ip(args);
    if (r.exit_code != 0) {
      std::string line = "ip";
      for (const auto& a : args) line += " " + a;
      ADD_FAILURE() << line << ": " << r.output;
    }
    return r.exit_code == 0;
  }
  std::string Ns(int i) const { return absl::StrCat("glmm", tag_, "-", i); }
  std::string Node(int i) const { return i == 0 ? "mtu-a" : "mtu-b"; }
  std::string ControlAddr(int i) const { return absl::StrCat(control_, ".", 11 + i); }
  std::string FabricAddr(int i) const { return absl::StrCat(fabric_, ".", 1 + i); }
  std::string FabricIf(int i) const { return absl::StrCat("glmmf", tag_, i); }

  // `glmctl preflight --json`: exit code and node -> its mtu.path checks.
  std::pair<int, std::map<std::string, std::vector<nlohmann::json>>> Preflight() {
    CommandResult r = RunCommand({GlmctlBin(), "preflight", "--json", yaml_},
                                 {{"GLMCTL_STATE_DIR", dir_->path() + "/state"}}, seconds(120));
    std::map<std::string, std::vector<nlohmann::json>> mtu;
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.output;
    if (j.is_discarded()) return {r.exit_code, mtu};
    for (const auto& n : j["nodes"]) {
      for (const auto& c : n["checks"]) {
        if (c["id"] == "mtu.path") mtu[n["node"].get<std::string>()].push_back(c);
      }
    }
    std::cout << "glmctl preflight (exit " << r.exit_code << ") mtu.path:\n";
    for (const auto& [node, checks] : mtu) {
      for (const auto& c : checks) {
        std::cout << "  " << node << ": " << c["status"].get<std::string>() << ": "
                  << c["message"].get<std::string>() << " [" << c["evidence"].get<std::string>()
                  << "]\n";
      }
    }
    return {r.exit_code, mtu};
  }

  std::string tag_, control_, fabric_, bridge_, yaml_;
  bool created_bridge_ = false;
  std::vector<std::string> namespaces_;
  std::unique_ptr<TempDir> dir_;
  std::vector<int> agents_;
  int controller_ = 0;
  int controller_port_ = 0;
};

TEST_F(MtuDaemonsNetnsTest, MismatchedVethMtusFailNamingPeerAndSizeThenPassWhenRaised) {
  for (int i = 0; i < 2; ++i) {
    ASSERT_GE(PollUntil([&] { return TcpOpen(ControlAddr(i), 47101); }, seconds(30)).count(), 0)
        << Node(i) << "'s agent never listened on " << ControlAddr(i) << ":47101";
  }
  ASSERT_GE(PollUntil([&] { return TcpOpen(control_ + ".1", controller_port_); }, seconds(30))
                .count(),
            0)
      << "the controller never listened";

  auto [code, mtu] = Preflight();
  EXPECT_NE(code, 0) << "preflight passed over a 1500-byte hop on a 9000 fabric";
  ASSERT_EQ(mtu["mtu-a"].size(), 1u);
  ASSERT_EQ(mtu["mtu-b"].size(), 1u);
  // A → B: A's end lets 9000 out; B's veth drops frames over its 1500 (+ a VLAN tag's slack).
  const nlohmann::json& a = mtu["mtu-a"][0];
  EXPECT_EQ(a["status"], "fail") << a.dump();
  EXPECT_THAT(a["message"].get<std::string>(), HasSubstr("path to mtu-b carries at most 150"));
  EXPECT_THAT(a["message"].get<std::string>(), HasSubstr("fabric.mtu is 9000"));
  EXPECT_THAT(a["fix"].get<std::string>(), HasSubstr("raise the MTU to 9000"));
  // B → A: B's own 1500 refuses larger DF datagrams, so exactly 1500.
  const nlohmann::json& b = mtu["mtu-b"][0];
  EXPECT_EQ(b["status"], "fail") << b.dump();
  EXPECT_THAT(b["message"].get<std::string>(), HasSubstr("path to mtu-a carries at most 1500-byte"));
  EXPECT_THAT(b["fix"].get<std::string>(), HasSubstr("set fabric.mtu to 1500"));

  // The operator raises B's end: the same preflight now passes both ways.
  ASSERT_TRUE(Must({"-n", Ns(1), "link", "set", FabricIf(1), "mtu", "9000"}));
  auto [code2, mtu2] = Preflight();
  ASSERT_EQ(mtu2["mtu-a"].size(), 1u);
  ASSERT_EQ(mtu2["mtu-b"].size(), 1u);
  EXPECT_EQ(mtu2["mtu-a"][0]["status"], "pass") << mtu2["mtu-a"][0].dump();
  EXPECT_EQ(mtu2["mtu-b"][0]["status"], "pass") << mtu2["mtu-b"][0].dump();
  EXPECT_THAT(mtu2["mtu-a"][0]["message"].get<std::string>(),
              HasSubstr("path to mtu-b carries 9000-byte packets unfragmented"));
  // Nothing else on these nodes fails for this test's reasons (no RDMA is configured: warnings).
  EXPECT_EQ(code2, 0) << "preflight still fails with matching MTUs";
}

}  // namespace
}  // namespace glm::testing
