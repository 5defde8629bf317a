#include "agent/preflight/preflight.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::preflight {
namespace {

using ::testing::HasSubstr;

const std::string kFixtures = GLM_PREFLIGHT_FIXTURES;

class FakeVerbs : public VerbsProvider {
 public:
  absl::StatusOr<std::vector<std::string>> DeviceNames() override { return std::vector<std::string>{"rocep1s0f0"}; }
  absl::StatusOr<VerbsPortInfo> QueryPort(const std::string&, int) override { return info; }
  absl::StatusOr<std::vector<GidEntry>> QueryGidTable(const std::string&, int) override {
    return gids;
  }
  VerbsPortInfo info;
  std::vector<GidEntry> gids;
};

PreflightOptions Options(const std::string& name) {
  PreflightOptions o;
  o.roots = SystemRoots{kFixtures + "/" + name + "/sys", kFixtures + "/" + name + "/proc",
                        kFixtures + "/" + name + "/dev"};
  auto node = LoadNodePreflightConfig(kFixtures + "/" + name + "/cluster.yaml", "spark1");
  EXPECT_TRUE(node.ok()) << node.status();
  o.node = *node;
  o.node.nccl_library = GLM_FAKE_NCCL_GOOD;
  o.node.nccl_expected_version = "2.30.4";
  o.gpu_probe = [] { return std::vector<GpuInfo>{{"NVIDIA GB10", 12, 1}}; };
  o.disk_path = testing::TempDir();
  return o;
}

const CheckResult& Get(const PreflightReport& report, const std::string& id) {
  const CheckResult* c = report.Find(id);
  if (c == nullptr) {
    ADD_FAILURE() << "no check " << id << " in\n" << report.ToText();
    static CheckResult none;
    return none;
  }
  return *c;
}

TEST(PreflightTest, HealthyNodePassesEverything) {
  PreflightReport report = RunNodePreflight(Options("healthy"));
  EXPECT_TRUE(report.ok()) << report.ToText();
  for (const char* id : {"rdma.hca", "rdma.uverbs", "rdma.port_state", "rdma.link_layer",
                         "mtu.netdev", "mtu.port", "gid.index", "memlock", "cap_ipc_lock",
                         "gpu.present", "nccl.version", "mem.free", "disk.free"}) {
    EXPECT_EQ(Get(report, id).status, CheckStatus::kPass) << id << ": " << Get(report, id).message;
  }
  ASSERT_TRUE(report.gid.has_value());
  EXPECT_EQ(report.gid->index, 3);
  EXPECT_THAT(Get(report, "mtu.port").evidence, HasSubstr("derived from"));
  EXPECT_THAT(Get(report, "gpu.present").message, HasSubstr("NVIDIA GB10 (sm_121)"));
  EXPECT_THAT(Get(report, "nccl.version").message, HasSubstr("NCCL 2.30.4"));

  nlohmann::json j = report.ToJson();
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["gid"]["index"], 3);
  EXPECT_EQ(j["gid"]["hca"], "rocep1s0f0");
  EXPECT_EQ(j["gid"]["netdev"], "enp1s0f0np0");
  EXPECT_EQ(j["gid"]["type"], "RoCE v2");
  EXPECT_EQ(j["checks"][0]["id"], "rdma.hca");
  EXPECT_EQ(j["checks"][0]["status"], "pass");
}

TEST(PreflightTest, LinkLocalAtIndexThree) {
  PreflightReport report = RunNodePreflight(Options("gid_linklocal_at_3"));
  EXPECT_FALSE(report.ok());
  const CheckResult& gid = Get(report, "gid.index");
  EXPECT_EQ(gid.status, CheckStatus::kFail);
  EXPECT_EQ(gid.fix, "set gid_index: 4 for node spark1 (or gid_index: auto, which resolves per node)");
  EXPECT_FALSE(report.gid.has_value());
  // Only the GID is wrong.
  for (const CheckResult& c : report.checks) {
    if (c.id != "gid.index") {
      EXPECT_EQ(c.status, CheckStatus::kPass) << c.id << ": " << c.message;
    }
  }
}

TEST(PreflightTest, SecondHcaOnlyLinkLocal) {
  PreflightReport report = RunNodePreflight(Options("second_hca_linklocal"));
  const CheckResult& gid = Get(report, "gid.index");
  EXPECT_EQ(gid.status, CheckStatus::kFail);
  EXPECT_THAT(gid.message, HasSubstr("only link-local GIDs"));
  EXPECT_THAT(gid.fix, HasSubstr("assign the fabric IP 192.168.101.3 to enp1s0f1np1 persistently"));
  EXPECT_EQ(Get(report, "rdma.uverbs").status, CheckStatus::kPass);  // uverbs1 belongs to it.
}

TEST(PreflightTest, Mtu1500OnA9000Fabric) {
  PreflightReport report = RunNodePreflight(Options("mtu_1500"));
  EXPECT_FALSE(report.ok());
  const CheckResult& netdev = Get(report, "mtu.netdev");
  EXPECT_EQ(netdev.status, CheckStatus::kFail);
  EXPECT_EQ(netdev.message, "enp1s0f0np0 MTU is 1500, fabric.mtu is 9000");
  EXPECT_THAT(netdev.fix, HasSubstr("ip link set dev enp1s0f0np0 mtu 9000"));
  EXPECT_THAT(netdev.fix, HasSubstr("netplan"));
  const CheckResult& port = Get(report, "mtu.port");
  EXPECT_EQ(port.status, CheckStatus::kFail);
  EXPECT_THAT(port.message, HasSubstr("active MTU is 1024, expected 4096"));
  EXPECT_EQ(Get(report, "gid.index").status, CheckStatus::kPass);
}

TEST(PreflightTest, PortMtuFromLibibverbsWhenAvailable) {
  FakeVerbs verbs;
  verbs.info = VerbsPortInfo{4, 1024, 4096, true};
  PreflightOptions o = Options("healthy");
  o.verbs = &verbs;
  PreflightReport report = RunNodePreflight(o);
  const CheckResult& port = Get(report, "mtu.port");
  EXPECT_EQ(port.status, CheckStatus::kFail);
  EXPECT_THAT(port.evidence, HasSubstr("ibv_query_port active_mtu=1024"));
  verbs.info.active_mtu_bytes = 4096;
  EXPECT_EQ(Get(RunNodePreflight(o), "mtu.port").status, CheckStatus::kPass);
}

TEST(PreflightTest, GidTableFromLibibverbsWhenSysfsHasNone) {
  // A sysfs tree without the gids directory (old kernels in some containers).
  namespace fs = std::filesystem;
  fs::path root = fs::path(testing::TempDir()) / ("no_gids_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::copy(kFixtures + "/healthy", root, fs::copy_options::recursive);
  fs::remove_all(root / "sys/class/infiniband/rocep1s0f0/ports/1/gids");
  PreflightOptions o = Options("healthy");
  o.roots = SystemRoots{(root / "sys").string(), (root / "proc").string(), (root / "dev").string()};
  FakeVerbs verbs;
  verbs.info = VerbsPortInfo{4, 4096, 4096, true};
  verbs.gids = {GidEntry{"rocep1s0f0", 1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe00:0001", "RoCE v2", "enp1s0f0np0"},
                GidEntry{"rocep1s0f0", 1, 1, "0000:0000:0000:0000:0000:ffff:c0a8:6401", "RoCE v2", "enp1s0f0np0"}};
  o.verbs = &verbs;
  o.node.gid_index = std::nullopt;
  PreflightReport report = RunNodePreflight(o);
  const CheckResult& gid = Get(report, "gid.index");
  EXPECT_EQ(gid.status, CheckStatus::kPass) << gid.message;
  EXPECT_THAT(gid.evidence, HasSubstr("gid table (libibverbs)"));
  ASSERT_TRUE(report.gid.has_value());
  EXPECT_EQ(report.gid->index, 1);
  o.verbs = nullptr;
  EXPECT_EQ(Get(RunNodePreflight(o), "gid.index").status, CheckStatus::kFail);
  fs::remove_all(root);
}

TEST(PreflightTest, MissingUverbsDeviceAndContainerLimits) {
  PreflightReport report = RunNodePreflight(Options("missing_uverbs"));
  EXPECT_FALSE(report.ok());
  const CheckResult& uverbs = Get(report, "rdma.uverbs");
  EXPECT_EQ(uverbs.status, CheckStatus::kFail);
  EXPECT_THAT(uverbs.message, HasSubstr("/dev/infiniband/uverbs0 (the verbs device of rocep1s0f0) is missing"));
  EXPECT_THAT(uverbs.fix, HasSubstr("--device=/dev/infiniband"));
  const CheckResult& memlock = Get(report, "memlock");
  EXPECT_EQ(memlock.status, CheckStatus::kFail);
  EXPECT_THAT(memlock.message, HasSubstr("8388608 bytes"));
  EXPECT_THAT(memlock.fix, HasSubstr("LimitMEMLOCK=infinity"));
  const CheckResult& cap = Get(report, "cap_ipc_lock");
  EXPECT_EQ(cap.status, CheckStatus::kFail);
  EXPECT_THAT(cap.fix, HasSubstr("--cap-add=IPC_LOCK"));
}

TEST(PreflightTest, UnknownHcaSuggestsNearest) {
  PreflightOptions o = Options("healthy");
  o.node.hca = "rocep1s0f9";
  PreflightReport report = RunNodePreflight(o);
  const CheckResult& hca = Get(report, "rdma.hca");
  EXPECT_EQ(hca.status, CheckStatus::kFail);
  EXPECT_THAT(hca.fix, HasSubstr("set hca: rocep1s0f0 for node spark1"));
  EXPECT_EQ(report.Find("gid.index"), nullptr);  // not evaluated without the HCA.
}

TEST(PreflightTest, NoFabricConfiguredSkipsRdmaChecksWithAWarning) {
  PreflightOptions o = Options("healthy");
  o.node.hca.clear();
  o.node.netdev.clear();
  PreflightReport report = RunNodePreflight(o);
  EXPECT_TRUE(report.ok()) << report.ToText();
  EXPECT_EQ(Get(report, "rdma.hca").status, CheckStatus::kWarn);
  EXPECT_EQ(report.Find("gid.index"), nullptr);
  EXPECT_EQ(report.Find("rdma.uverbs"), nullptr);
  EXPECT_EQ(report.Find("mtu.netdev"), nullptr);
}

TEST(PreflightTest, GpuNcclMemDiskFailures) {
  PreflightOptions o = Options("healthy");
  o.gpu_probe = [] { return std::vector<GpuInfo>{}; };
  o.node.nccl_expected_version = "2.27.7";
  o.min_mem_available_bytes = uint64_t{200} << 30;
  o.min_disk_free_bytes = uint64_t{1} << 60;
  PreflightReport report = RunNodePreflight(o);
  EXPECT_EQ(Get(report, "gpu.present").status, CheckStatus::kFail);
  const CheckResult& nccl = Get(report, "nccl.version");
  EXPECT_EQ(nccl.status, CheckStatus::kFail);
  EXPECT_THAT(nccl.message, HasSubstr("is version 2.30.4 (code 23004), expected 2.27.7 (code 22707)"));
  EXPECT_THAT(nccl.fix, HasSubstr("stage NCCL 2.27.7"));
  EXPECT_EQ(Get(report, "mem.free").status, CheckStatus::kFail);
  EXPECT_THAT(Get(report, "mem.free").message, HasSubstr("95.4 GiB available, the plan needs 200.0 GiB"));
  EXPECT_EQ(Get(report, "disk.free").status, CheckStatus::kFail);

  o.require_gpu = false;
  EXPECT_EQ(Get(RunNodePreflight(o), "gpu.present").status, CheckStatus::kWarn);
}

TEST(PreflightTest, NcclMissingFailsUnlessStagingCanProvideIt) {
  // Alone (glm-agent preflight), a missing library fails; when the controller stages NCCL it is a
  // warning saying so, and a wrong version is one too (staging replaces the copy; the
  // controller fails preflight when this copy is the pinned build or nobody holds it).
  CheckResult missing = CheckNcclVersion("/nonexistent/libnccl.so.2", "2.30.4");
  EXPECT_EQ(missing.status, CheckStatus::kFail);
  EXPECT_THAT(missing.message, HasSubstr("cannot load NCCL library /nonexistent/libnccl.so.2"));

  CheckResult staged = CheckNcclVersion("/nonexistent/libnccl.so.2", "2.30.4", /*stageable=*/true);
  EXPECT_EQ(staged.id, "nccl.version");
  EXPECT_EQ(staged.status, CheckStatus::kWarn);
  EXPECT_THAT(staged.message, HasSubstr("/nonexistent/libnccl.so.2 is missing; will be staged"));

  CheckResult wrong = CheckNcclVersion(GLM_FAKE_NCCL_GOOD, "2.27.7", /*stageable=*/true);
  EXPECT_EQ(wrong.status, CheckStatus::kWarn);
  EXPECT_THAT(wrong.message, HasSubstr("is version 2.30.4 (code 23004), expected 2.27.7"));
  EXPECT_THAT(wrong.message, HasSubstr("will be replaced by the pinned build"));

  CheckResult right = CheckNcclVersion(GLM_FAKE_NCCL_GOOD, "2.30.4", /*stageable=*/true);
  EXPECT_EQ(right.status, CheckStatus::kPass);

  PreflightOptions o = Options("healthy");
  o.node.nccl_library = "/nonexistent/libnccl.so.2";
  EXPECT_EQ(Get(RunNodePreflight(o), "nccl.version").status, CheckStatus::kFail);
  o.nccl_stageable = true;
  EXPECT_EQ(Get(RunNodePreflight(o), "nccl.version").status, CheckStatus::kWarn);
}

TEST(PreflightTest, PathMtuPerPeer) {
  auto wide = UdpEchoResponder::Start("127.0.0.1", 0);
  auto narrow = UdpEchoResponder::Start("127.0.0.1", 0, 1500 - 28);
  ASSERT_TRUE(wide.ok() && narrow.ok());
  PreflightOptions o = Options("healthy");
  o.mtu_peers = {{"spark2", "127.0.0.1", (*wide)->port()}, {"spark3", "127.0.0.1", (*narrow)->port()}};
  o.mtu_probe_timeout = std::chrono::milliseconds(100);
  PreflightReport report = RunNodePreflight(o);
  std::vector<const CheckResult*> paths;
  for (const CheckResult& c : report.checks) {
    if (c.id == "mtu.path") paths.push_back(&c);
  }
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0]->status, CheckStatus::kPass);
  EXPECT_THAT(paths[0]->message, HasSubstr("spark2 carries 9000-byte packets"));
  EXPECT_EQ(paths[1]->status, CheckStatus::kFail);
  EXPECT_THAT(paths[1]->message, HasSubstr("spark3 carries at most 1500-byte packets"));
  EXPECT_FALSE(report.ok());
}

TEST(PreflightTest, GpuFromDriverProcFilesWarnsWithoutComputeCapability) {
  PreflightOptions o = Options("healthy");
  o.gpu_probe = nullptr;  // ProbeGpus on the fixture proc tree: driver files only.
  PreflightReport report = RunNodePreflight(o);
  const CheckResult& gpu = Get(report, "gpu.present");
  EXPECT_EQ(gpu.status, CheckStatus::kWarn);
  EXPECT_THAT(gpu.message, HasSubstr("NVIDIA GB10 (compute capability unknown)"));
}

int RunCommand(const std::string& cmd, std::string* out) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string CommandFor(const std::string& name, const std::string& extra) {
  std::string dir = kFixtures + "/" + name;
  return std::string(GLM_PREFLIGHT_BIN) + " --config " + dir + "/cluster.yaml --node spark1" +
         " --sysfs-root " + dir + "/sys --proc-root " + dir + "/proc --dev-root " + dir + "/dev" +
         " --allow-no-gpu --disk-path " + testing::TempDir() + " " + extra;
}

TEST(PreflightCommandTest, JsonOutputAndExitCodes) {
  std::string out;
  // Healthy fixture (no nccl configured, GPU from driver files): warnings only → exit 0.
  EXPECT_EQ(RunCommand(CommandFor("healthy", "--json"), &out), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["gid"]["index"], 3);
  EXPECT_EQ(j["gid"]["gid"], "0000:0000:0000:0000:0000:ffff:c0a8:6401");
  ASSERT_TRUE(j["checks"].is_array());
  for (const auto& c : j["checks"]) {
    EXPECT_TRUE(c.contains("id") && c.contains("status") && c.contains("message") && c.contains("fix"));
  }

  out.clear();
  EXPECT_EQ(RunCommand(CommandFor("gid_linklocal_at_3", "--json"), &out), 1) << out;
  j = nlohmann::json::parse(out);
  bool found = false;
  for (const auto& c : j["checks"]) {
    if (c["id"] == "gid.index") {
      found = true;
      EXPECT_EQ(c["status"], "fail");
      EXPECT_THAT(c["fix"].get<std::string>(), HasSubstr("set gid_index: 4"));
    }
  }
  EXPECT_TRUE(found);
  EXPECT_TRUE(j["gid"].is_null());

  out.clear();
  EXPECT_EQ(RunCommand(CommandFor("mtu_1500", ""), &out), 1);
  EXPECT_THAT(out, HasSubstr("[fail] mtu.netdev"));

  out.clear();
  EXPECT_EQ(RunCommand(std::string(GLM_PREFLIGHT_BIN) + " --node spark1 2>&1", &out), 2);
  EXPECT_THAT(out, HasSubstr("--config and --node are required"));
}

}  // namespace
}  // namespace glm::preflight
