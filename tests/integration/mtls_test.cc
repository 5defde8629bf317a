// mTLS both ways, with real processes: a local cluster whose YAML names certificates made by
// `glmctl certs` comes up; an agent refuses a client without a certificate or with one from
// another CA; the controller refuses glmctl without a valid certificate too.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "controller/cli/certs.h"
#include "controller/orchestrate/grpc_agent_client.h"
#include "glm/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/rpc/credentials.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

class MtlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("glm-mtls");
    name_ = absl::StrCat("mtls-", ::getpid());
    ports_ = FreePorts(3);
    yaml_ = dir_->path() + "/cluster.yaml";
    WriteFile(yaml_, absl::StrCat(
        "name: ", name_, "\nlocal: true\ncontroller:\n  listen: 127.0.0.1:", ports_[0],
        "\n  tls: {ca: certs/ca.pem, cert: certs/controller.pem, key: certs/controller.key}\n",
        "model:\n  path: ", SourceDir(), "/tests/golden/tiny-dense\n  max_model_len: 512\n  kv_cache_dtype: bf16\n"
                                  "  kv_cache_bytes: 64MiB\n  activation_reserve_bytes: 256MiB\n"
                                  "  max_num_seqs: 4\nnode_defaults:\n  memory_budget_bytes: 1GiB\n",
        "parallel:\n  tensor: 2\nnodes:\n",
        "  - name: a1\n    agent: 127.0.0.1:", ports_[1], "\n",
        "  - name: a2\n    agent: 127.0.0.1:", ports_[2], "\n"));
    env_ = {{"GLMCTL_STATE_DIR", dir_->path() + "/state"},
            {"GLM_BIN_DIR", fs::path(GlmctlBin()).parent_path().string()}};
  }
  void TearDown() override {
    RunCommand({GlmctlBin(), "down", yaml_}, env_, seconds(30));
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_->path() + "/.glmctl/" + name_, ec)) {
      if (e.path().extension() == ".pid") KillNow(std::atoi(ReadFile(e.path().string()).c_str()));
      if (HasFailure() && e.path().extension() == ".log") {
        std::cerr << "==== " << e.path() << "\n" << ReadFile(e.path().string());
      }
    }
  }
  CommandResult Glmctl(std::vector<std::string> args) {
    args.insert(args.begin(), GlmctlBin());
    return RunCommand(args, env_, seconds(60));
  }
  absl::Status AgentInfo(const rpc::TlsFiles& tls) {
    orchestrate::GrpcAgentClientFactory factory(tls);
    auto client = factory.Create({"a1", absl::StrCat("127.0.0.1:", ports_[1])});
    if (!client.ok()) return client.status();
    return (*client)->Info(seconds(3)).status();
  }

  std::unique_ptr<TempDir> dir_;
  std::string name_, yaml_;
  std::vector<int> ports_;
  std::map<std::string, std::string> env_;
};

TEST_F(MtlsTest, ClusterComesUpAndStrangersAreRefused) {
  CommandResult certs = Glmctl({"certs", "--out", dir_->path() + "/certs", yaml_});
  ASSERT_EQ(certs.exit_code, 0) << certs.output;
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("mTLS"), std::string::npos) << up.output;
  EXPECT_EQ(Glmctl({"health", yaml_}).exit_code, 0);

  const std::string c = dir_->path() + "/certs/";
  // The controller's identity is accepted by the agent...
  EXPECT_TRUE(AgentInfo({c + "ca.pem", c + "controller.pem", c + "controller.key"}).ok());
  // ...a client presenting no certificate is not...
  {
    auto ca = rpc::ReadPemFile(c + "ca.pem", "ca");
    ASSERT_TRUE(ca.ok());
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = *ca;
    auto stub = glm::v1::Agent::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", ports_[1]), grpc::SslCredentials(opts)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(3));
    glm::v1::InfoResponse resp;
    EXPECT_FALSE(stub->Info(&ctx, {}, &resp).ok()) << "agent accepted a client without a cert";
  }
  // ...nor plaintext...
  {
    auto stub = glm::v1::Agent::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", ports_[1]), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(3));
    glm::v1::InfoResponse resp;
    EXPECT_FALSE(stub->Info(&ctx, {}, &resp).ok()) << "agent accepted plaintext";
  }
  // ...nor a certificate from another CA (the client trusts the real CA, so only the agent's
  // check of the client certificate can refuse it).
  orchestrate::ClusterTopology rogue;
  rogue.cluster_name = "rogue";
  rogue.controller_listen = "127.0.0.1:1";
  rogue.nodes = {{"a1", "127.0.0.1:1"}};
  ASSERT_TRUE(cli::MakeClusterCerts(rogue, {.out_dir = dir_->path() + "/rogue"}).ok());
  const std::string r = dir_->path() + "/rogue/";
  absl::Status stranger = AgentInfo({c + "ca.pem", r + "controller.pem", r + "controller.key"});
  EXPECT_FALSE(stranger.ok()) << "agent accepted a certificate from another CA";

  // The controller refuses glmctl without a valid certificate the same way.
  // (A fresh state dir: no remembered cluster.yaml, hence no certificate to present.)
  CommandResult plain = RunCommand(
      {GlmctlBin(), "--controller", absl::StrCat("127.0.0.1:", ports_[0]), "status"},
      {{"GLMCTL_STATE_DIR", dir_->path() + "/no-state"}}, seconds(30));
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = *rpc::ReadPemFile(c + "ca.pem", "ca");
    opts.pem_cert_chain = *rpc::ReadPemFile(r + "controller.pem", "cert");
    opts.pem_private_key = *rpc::ReadPemFile(r + "controller.key", "key");
    auto stub = glm::v1::Controller::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", ports_[0]), grpc::SslCredentials(opts)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(3));
    glm::v1::ClusterStatus resp;
    EXPECT_FALSE(stub->Status(&ctx, {}, &resp).ok()) << "controller accepted a stranger";
  }
  EXPECT_EQ(Glmctl({"status", yaml_}).exit_code, 0);
}

TEST_F(MtlsTest, ControllerRefusesAnAgentWithAForeignCertificate) {
  ASSERT_EQ(Glmctl({"certs", "--out", dir_->path() + "/certs", yaml_}).exit_code, 0);
  orchestrate::ClusterTopology rogue;
  rogue.cluster_name = "rogue";
  rogue.controller_listen = "127.0.0.1:1";
  rogue.nodes = {{"a1", absl::StrCat("127.0.0.1:", ports_[1])}};
  ASSERT_TRUE(cli::MakeClusterCerts(rogue, {.out_dir = dir_->path() + "/rogue"}).ok());
  const std::string r = dir_->path() + "/rogue/";
  // An impostor agent: its certificate is signed by another CA (it trusts that CA for clients).
  int pid = SpawnBackground({AgentBin(), "serve", "--listen", absl::StrCat("127.0.0.1:", ports_[1]),
                             "--node", "a1", "--tls-ca", r + "ca.pem", "--tls-cert", r + "a1.pem",
                             "--tls-key", r + "a1.key"},
                            dir_->path() + "/impostor.log");
  const std::string c = dir_->path() + "/certs/";
  // With the rogue CA the impostor is reachable (so the refusal below is about trust)...
  auto up = PollUntil([&] { return AgentInfo({r + "ca.pem", r + "controller.pem",
                                              r + "controller.key"}).ok(); },
                      seconds(10));
  EXPECT_GE(up.count(), 0) << ReadFile(dir_->path() + "/impostor.log");
  // ...but the cluster's controller identity does not trust it.
  absl::Status s = AgentInfo({c + "ca.pem", c + "controller.pem", c + "controller.key"});
  EXPECT_FALSE(s.ok()) << "controller trusted an agent certificate from another CA";
  KillNow(pid);
}

}  // namespace
}  // namespace glm::testing
