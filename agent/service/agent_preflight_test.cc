// The agent's Preflight RPC running agent/preflight's node checks against fixture trees
// (tests/fixtures/sysfs), the resolved GID entry in the response, and the GID watcher publishing
// a change of the resolved entry as a degraded status.
#include <filesystem>
#include <fstream>

#include "agent/service/agent_service.h"
#include "gtest/gtest.h"

namespace glm::agent {
namespace {

namespace fs = std::filesystem;

std::string Fixture(const std::string& name) {
  return std::string(GLM_PREFLIGHT_FIXTURES) + "/" + name;
}

AgentServiceOptions FixtureOptions(const std::string& root) {
  AgentServiceOptions options;
  options.node = "spark1";
  options.version = "9.9.9";
  options.roots = {root + "/sys", root + "/proc", root + "/dev"};
  options.probe_paths.proc_root = root + "/proc";
  options.probe_paths.dev_root = root + "/dev";
  options.allow_no_gpu = true;
  options.gid_watch_interval = std::chrono::seconds(5);
  options.gid_netlink = false;
  return options;
}

glm::v1::PreflightRequest FabricRequest(const std::string& ip, std::optional<int> gid_index) {
  glm::v1::PreflightRequest req;
  req.set_fabric_ip(ip);
  req.set_hca("rocep1s0f0");
  req.set_hca_port(1);
  req.set_gid_index_auto(!gid_index.has_value());
  req.set_gid_index(gid_index.value_or(0));
  req.set_netdev("enp1s0f0np0");
  req.set_fabric_mtu(9000);
  return req;
}

const glm::v1::Check* Find(const glm::v1::PreflightResponse& resp, const std::string& id) {
  for (const auto& c : resp.checks())
    if (c.id() == id) return &c;
  return nullptr;
}

glm::v1::PreflightResponse RunPreflight(AgentService& service, const glm::v1::PreflightRequest& req) {
  grpc::ServerContext ctx;
  glm::v1::PreflightResponse resp;
  EXPECT_TRUE(service.Preflight(&ctx, &req, &resp).ok());
  return resp;
}

TEST(AgentPreflightTest, HealthyFixtureResolvesGidAndKeepsHostChecks) {
  FakeClock clock;
  AgentService service(FixtureOptions(Fixture("healthy")), &clock);
  glm::v1::PreflightResponse resp = RunPreflight(service, FabricRequest("192.168.100.1", 3));
  ASSERT_NE(Find(resp, "host.cpu.count"), nullptr);
  for (const char* id : {"rdma.hca", "rdma.uverbs", "rdma.port_state", "rdma.link_layer",
                         "mtu.netdev", "mtu.port", "gid.index", "memlock", "cap_ipc_lock"}) {
    const glm::v1::Check* c = Find(resp, id);
    ASSERT_NE(c, nullptr) << id;
    EXPECT_EQ(c->status(), glm::v1::CHECK_STATUS_PASS) << id << ": " << c->message();
  }
  EXPECT_EQ(Find(resp, "mem.free"), nullptr) << "host.memory.available covers it";
  ASSERT_TRUE(resp.has_gid());
  EXPECT_EQ(resp.gid().index(), 3);
  EXPECT_EQ(resp.gid().gid(), "::ffff:192.168.100.1");
  EXPECT_EQ(resp.gid().type(), "RoCE v2");
  EXPECT_EQ(resp.gid().netdev(), "enp1s0f0np0");
  EXPECT_EQ(service.publisher().Snapshot().gid().index(), 3);
}

TEST(AgentPreflightTest, LinkLocalAtConfiguredIndexFailsNamingTheRightOne) {
  FakeClock clock;
  AgentService service(FixtureOptions(Fixture("gid_linklocal_at_3")), &clock);
  glm::v1::PreflightResponse resp = RunPreflight(service, FabricRequest("192.168.100.2", 3));
  EXPECT_FALSE(resp.ok());
  const glm::v1::Check* gid = Find(resp, "gid.index");
  ASSERT_NE(gid, nullptr);
  EXPECT_EQ(gid->status(), glm::v1::CHECK_STATUS_FAIL);
  EXPECT_NE(gid->fix().find("4"), std::string::npos) << gid->fix();
  // auto resolves 4.
  glm::v1::PreflightResponse autor = RunPreflight(service, FabricRequest("192.168.100.2", std::nullopt));
  ASSERT_TRUE(autor.has_gid());
  EXPECT_EQ(autor.gid().index(), 4);
}

TEST(AgentPreflightTest, WithoutFabricMemlockIsAWarningNotAFailure) {
  FakeClock clock;
  // missing_uverbs: memlock 8 MiB and no CAP_IPC_LOCK.
  AgentService service(FixtureOptions(Fixture("missing_uverbs")), &clock);
  glm::v1::PreflightResponse resp = RunPreflight(service, glm::v1::PreflightRequest());
  const glm::v1::Check* memlock = Find(resp, "memlock");
  ASSERT_NE(memlock, nullptr);
  EXPECT_EQ(memlock->status(), glm::v1::CHECK_STATUS_WARN);
  EXPECT_FALSE(resp.has_gid());
  // With the fabric configured it fails.
  glm::v1::PreflightResponse rdma = RunPreflight(service, FabricRequest("192.168.100.5", 3));
  EXPECT_EQ(Find(rdma, "memlock")->status(), glm::v1::CHECK_STATUS_FAIL);
  EXPECT_EQ(Find(rdma, "rdma.uverbs")->status(), glm::v1::CHECK_STATUS_FAIL);
}

TEST(AgentPreflightTest, PeerWithoutEchoResponderIsAWarning) {
  FakeClock clock;
  AgentService service(FixtureOptions(Fixture("healthy")), &clock);
  glm::v1::PreflightRequest req = FabricRequest("192.168.100.1", 3);
  auto* peer = req.add_mtu_peers();
  peer->set_node("spark2");
  peer->set_fabric_ip("192.168.100.2");
  peer->set_port(0);
  glm::v1::PreflightResponse resp = RunPreflight(service, req);
  const glm::v1::Check* path = Find(resp, "mtu.path");
  ASSERT_NE(path, nullptr);
  EXPECT_EQ(path->status(), glm::v1::CHECK_STATUS_WARN);
  EXPECT_NE(path->message().find("spark2"), std::string::npos);
}

TEST(AgentPreflightTest, MissingNcclWarnsWhenStagedAndReportsWhatTheNodeHolds) {
  FakeClock clock;
  glm::v1::PreflightRequest req = FabricRequest("192.168.100.1", 3);
  req.set_nccl_library("/nonexistent/libnccl.so.2");
  req.set_nccl_expected_version("2.30.4");
  {
    AgentService service(FixtureOptions(Fixture("healthy")), &clock);
    glm::v1::PreflightResponse resp = RunPreflight(service, req);
    ASSERT_NE(Find(resp, "nccl.version"), nullptr);
    EXPECT_EQ(Find(resp, "nccl.version")->status(), glm::v1::CHECK_STATUS_FAIL);
    EXPECT_FALSE(resp.nccl().present());
    req.set_nccl_stage_if_missing(true);
    resp = RunPreflight(service, req);
    EXPECT_EQ(Find(resp, "nccl.version")->status(), glm::v1::CHECK_STATUS_WARN);
    EXPECT_NE(Find(resp, "nccl.version")->message().find("is missing; will be staged"),
              std::string::npos);
  }
  // --nccl-library points this node at its own copy: it is inspected and reported.
  AgentServiceOptions options = FixtureOptions(Fixture("healthy"));
  options.nccl_library = GLM_FAKE_NCCL_23004;
  AgentService service(options, &clock);
  glm::v1::PreflightResponse resp = RunPreflight(service, req);
  EXPECT_EQ(Find(resp, "nccl.version")->status(), glm::v1::CHECK_STATUS_PASS);
  EXPECT_TRUE(resp.nccl().present());
  EXPECT_EQ(resp.nccl().path(), GLM_FAKE_NCCL_23004);
  EXPECT_EQ(resp.nccl().version(), "2.30.4");
  EXPECT_EQ(resp.nccl().xxh3_128().size(), 32u);
  EXPECT_EQ(resp.nccl().size(), static_cast<int64_t>(fs::file_size(GLM_FAKE_NCCL_23004)));
}

TEST(AgentPreflightTest, GidWatcherPublishesAChangeAsDegraded) {
  // A private copy of the healthy tree, modified while the "agent" runs.
  fs::path root = fs::temp_directory_path() /
                  ("glm-gidwatch-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::copy(Fixture("healthy"), root, fs::copy_options::recursive);
  FakeClock clock;
  AgentService service(FixtureOptions(root.string()), &clock);
  EXPECT_FALSE(service.PollGidWatch(true)) << "nothing armed before a preflight";
  glm::v1::PreflightResponse resp = RunPreflight(service, FabricRequest("192.168.100.1", std::nullopt));
  ASSERT_TRUE(resp.has_gid());
  EXPECT_FALSE(service.publisher().Snapshot().degraded());

  // Interval not reached: no re-read.
  EXPECT_FALSE(service.PollGidWatch(false));
  // DHCP fell back to link-local; the address moved to index 5.
  const fs::path port = root / "sys/class/infiniband/rocep1s0f0/ports/1";
  std::ofstream(port / "gids/3") << "0000:0000:0000:0000:0000:ffff:a9fe:0c07\n";
  std::ofstream(port / "gids/5") << "0000:0000:0000:0000:0000:ffff:c0a8:6401\n";
  std::ofstream(port / "gid_attrs/types/5") << "RoCE v2\n";
  std::ofstream(port / "gid_attrs/ndevs/5") << "enp1s0f0np0\n";
  clock.Advance(std::chrono::seconds(6));
  EXPECT_TRUE(service.PollGidWatch(false));
  glm::v1::AgentStatus status = service.publisher().Snapshot();
  EXPECT_TRUE(status.degraded());
  EXPECT_NE(status.degraded_message().find("index 3"), std::string::npos)
      << status.degraded_message();
  EXPECT_NE(status.degraded_message().find("index 5"), std::string::npos)
      << status.degraded_message();
  EXPECT_EQ(status.gid().index(), 5);

  // Back to the entry bring-up validated: no longer degraded.
  std::ofstream(port / "gids/3") << "0000:0000:0000:0000:0000:ffff:c0a8:6401\n";
  EXPECT_TRUE(service.PollGidWatch(true));
  status = service.publisher().Snapshot();
  EXPECT_FALSE(status.degraded());
  EXPECT_EQ(status.gid().index(), 3);
  service.Shutdown();
  fs::remove_all(root);
}

}  // namespace
}  // namespace glm::agent
