// mTLS both ways, with real processes: a local cluster whose YAML names certificates made by
// `glmctl certs` comes up; an agent refuses a client without a certificate or with one from
// another CA; the controller refuses glmctl without a valid certificate too.
#include "absl/strings/str_cat.h"
#include "controller/cli/certs.h"
#include "controller/orchestrate/grpc_agent_client.h"
#include "glm/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/rpc/credentials.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

using std::chrono::seconds;

class MtlsTest : public LoopbackClusterTest {
 protected:
  MtlsTest() : LoopbackClusterTest("mtls") {}
  void SetUp() override {
    ClusterYaml cluster;
    cluster.local = true;
    cluster.controller_lines =
        "  tls: {ca: certs/ca.pem, cert: certs/controller.pem, key: certs/controller.key}\n";
    cluster.nodes = {{"a1", ""}, {"a2", ""}};
    WriteClusterYaml(cluster);
  }
  absl::Status AgentInfo(const rpc::TlsFiles& tls) {
    orchestrate::GrpcAgentClientFactory factory(tls);
    auto client = factory.Create({"a1", AgentAddress(0)});
    if (!client.ok()) return client.status();
    return (*client)->Info(seconds(3)).status();
  }
};

TEST_F(MtlsTest, ClusterComesUpAndStrangersAreRefused) {
  CommandResult certs = Glmctl({"certs", "--out", dir_->path() + "/certs", yaml_});
  ASSERT_EQ(certs.exit_code, 0) << certs.output;
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("mTLS"), std::string::npos) << up.output;
  EXPECT_EQ(Glmctl({"health", yaml_}).exit_code, 0);
  // The TP 2 group formed through the controller's rendezvous over mTLS, and serves.
  CommandResult gen = Glmctl({"generate", yaml_, "--tokens", "1,2,3", "--max-tokens", "4"});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_NE(gen.output.find("completion_tokens=4"), std::string::npos) << gen.output;

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
        grpc::CreateChannel(AgentAddress(0), grpc::SslCredentials(opts)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(3));
    glm::v1::InfoResponse resp;
    EXPECT_FALSE(stub->Info(&ctx, {}, &resp).ok()) << "agent accepted a client without a cert";
  }
  // ...nor plaintext...
  {
    auto stub = glm::v1::Agent::NewStub(grpc::CreateChannel(
        AgentAddress(0), grpc::InsecureChannelCredentials()));
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
  rogue.nodes = {{"a1", AgentAddress(0)}};
  ASSERT_TRUE(cli::MakeClusterCerts(rogue, {.out_dir = dir_->path() + "/rogue"}).ok());
  const std::string r = dir_->path() + "/rogue/";
  // An impostor agent: its certificate is signed by another CA (it trusts that CA for clients).
  StartAgent(0, {"--tls-ca", r + "ca.pem", "--tls-cert", r + "a1.pem", "--tls-key", r + "a1.key"});
  const std::string c = dir_->path() + "/certs/";
  // With the rogue CA the impostor is reachable (so the refusal below is about trust)...
  auto up = PollUntil([&] { return AgentInfo({r + "ca.pem", r + "controller.pem",
                                              r + "controller.key"}).ok(); },
                      seconds(10));
  EXPECT_GE(up.count(), 0) << ReadFile(dir_->path() + "/agent-a1.log");
  // ...but the cluster's controller identity does not trust it.
  absl::Status s = AgentInfo({c + "ca.pem", c + "controller.pem", c + "controller.key"});
  EXPECT_FALSE(s.ok()) << "controller trusted an agent certificate from another CA";
}

}  // namespace
}  // namespace glm::testing
