// NCCL staging and staged-file transfers through the daemons: two agents on loopback, each with
// its own NCCL path (--nccl-library) and model dir; the controller's host holds the pinned build
// at nccl.library (test-built fake NCCL libraries). node-2 lacks the library: preflight warns
// that it will be staged from node-1, Stage fetches it from node-1 over gRPC (FetchFile), checks
// hash and version, and the cluster reaches Ready. A pinned build of the wrong version stops `up`
// naming the node, both versions and the fix. Under mTLS the peer fetch works with the nodes'
// cluster certificates and a client without a valid certificate is refused.

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "controller/cli/certs.h"
#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/rpc/credentials.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

class StageNcclTest : public LoopbackClusterTest {
 protected:
  StageNcclTest() : LoopbackClusterTest("stagenccl") {}
  void SetUp() override {
    source_ = dir_->path() + "/source";
    fs::copy(SourceDir() + "/tests/golden/tiny-sharded", source_, fs::copy_options::recursive);
  }

  std::string NodeLib(int i) const {
    return absl::StrCat(dir_->path(), "/node-", i, "-nccl/libnccl.so.2");
  }
  std::string Certs() const { return dir_->path() + "/certs/"; }

  // The controller's host and node-1 hold `pinned`; node-2 has no NCCL library.
  void Start(const std::string& pinned, bool tls) {
    const std::string controller_lib = dir_->path() + "/controller-nccl/libnccl.so.2";
    fs::create_directories(fs::path(controller_lib).parent_path());
    fs::copy_file(pinned, controller_lib);
    fs::create_directories(fs::path(NodeLib(1)).parent_path());
    fs::copy_file(pinned, NodeLib(1));
    fs::create_directories(fs::path(NodeLib(2)).parent_path());
    ClusterYaml cluster;
    cluster.model_path = source_;
    if (tls) {
      cluster.controller_lines =
          "  tls: {ca: certs/ca.pem, cert: certs/controller.pem, key: certs/controller.key}\n";
    }
    cluster.sections =
        absl::StrCat("nccl:\n  library: ", controller_lib, "\n  expected_version: \"2.30.4\"\n");
    cluster.nodes = {{"node-1", ""}, {"node-2", ""}};
    WriteClusterYaml(cluster);
    if (tls) {
      CommandResult certs = Glmctl({"certs", "--out", dir_->path() + "/certs", yaml_});
      ASSERT_EQ(certs.exit_code, 0) << certs.output;
    }
    for (int i = 1; i <= 2; ++i) {
      std::string model = absl::StrCat(dir_->path(), "/node-", i, "-model");
      fs::copy(source_, model, fs::copy_options::recursive);
      std::string node = absl::StrCat("node-", i);
      std::vector<std::string> args = {"--allow-no-gpu", "--fabric-ip", "127.0.0.1",
                                       "--mtu-echo-port", "0", "--stage-port", "0",
                                       "--model-dir", model, "--nccl-library", NodeLib(i)};
      if (tls) {
        args.insert(args.end(), {"--tls-ca", Certs() + "ca.pem", "--tls-cert",
                                 Certs() + node + ".pem", "--tls-key", Certs() + node + ".key"});
      }
      StartAgent(i - 1, args);
    }
    StartController();
    WaitForPorts();
  }

  // FetchFile of node-1's NCCL library with `creds`; returns the bytes or the error.
  grpc::Status FetchNodeOneLibrary(std::shared_ptr<grpc::ChannelCredentials> creds,
                                   std::string* data) {
    auto stub = glm::v1::Agent::NewStub(
        grpc::CreateChannel(AgentAddress(0), creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    glm::v1::FetchFileRequest req;
    req.set_nccl_library(true);
    auto reader = stub->FetchFile(&ctx, req);
    glm::v1::FileChunk chunk;
    while (reader->Read(&chunk)) *data += chunk.data();
    return reader->Finish();
  }

  std::string source_;
};

TEST_F(StageNcclTest, MissingLibraryIsFetchedFromAPeerVerifiedAndUpReachesReady) {
  ASSERT_NO_FATAL_FAILURE(Start(GLM_FAKE_NCCL_23004, /*tls=*/false));
  ASSERT_FALSE(fs::exists(NodeLib(2)));
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find(NodeLib(2) + " is missing; will be staged from node-1"),
            std::string::npos)
      << up.output;
  EXPECT_NE(up.output.find("staged from node-1 and verified, version 2.30.4"), std::string::npos)
      << up.output;
  EXPECT_NE(up.output.find("is up"), std::string::npos) << up.output;
  ASSERT_TRUE(fs::exists(NodeLib(2)));
  EXPECT_EQ(ReadFile(NodeLib(2)), ReadFile(GLM_FAKE_NCCL_23004));

  // Again (--force: a full bring-up): both copies verified in place, and the controller hashed
  // no source file anew (the hash cache in its state dir).
  CommandResult again = Glmctl({"up", "--force", yaml_});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(again.output.find("staged from node-1"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("nccl: " + NodeLib(2) + " present and verified"), std::string::npos)
      << again.output;
  EXPECT_TRUE(fs::exists(dir_->path() + "/.glmctl/" + name_ + "/source-hashes.json"));
  std::string log = ReadFile(dir_->path() + "/controller.log");
  size_t last = log.rfind("files_hashed=");
  ASSERT_NE(last, std::string::npos) << log;
  EXPECT_EQ(log.substr(last, 14), "files_hashed=0") << log;
}

TEST_F(StageNcclTest, WrongVersionOfThePinnedBuildFailsUpNamingNodeVersionsAndFix) {
  ASSERT_NO_FATAL_FAILURE(Start(GLM_FAKE_NCCL_22707, /*tls=*/false));
  CommandResult up = Glmctl({"up", yaml_});
  EXPECT_NE(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("node-1"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("is version 2.27.7"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("expected 2.30.4"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("Fix:"), std::string::npos) << up.output;
  EXPECT_EQ(up.output.find("is up"), std::string::npos) << up.output;
  EXPECT_FALSE(fs::exists(NodeLib(2)));
}

TEST_F(StageNcclTest, UnderMtlsPeersFetchWithClusterCertificatesAndStrangersAreRefused) {
  ASSERT_NO_FATAL_FAILURE(Start(GLM_FAKE_NCCL_23004, /*tls=*/true));
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("staged from node-1 and verified, version 2.30.4"), std::string::npos)
      << up.output;
  EXPECT_EQ(ReadFile(NodeLib(2)), ReadFile(GLM_FAKE_NCCL_23004));

  // node-2's certificate (what its agent fetched with) reads node-1's library...
  auto node2 = rpc::MakeChannelCredentials(
      {Certs() + "ca.pem", Certs() + "node-2.pem", Certs() + "node-2.key"});
  ASSERT_TRUE(node2.ok()) << node2.status();
  std::string data;
  grpc::Status ok = FetchNodeOneLibrary(*node2, &data);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(data, ReadFile(GLM_FAKE_NCCL_23004));
  // ...a client presenting no certificate does not...
  {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = *rpc::ReadPemFile(Certs() + "ca.pem", "ca");
    std::string got;
    EXPECT_FALSE(FetchNodeOneLibrary(grpc::SslCredentials(opts), &got).ok());
    EXPECT_TRUE(got.empty());
  }
  // ...nor one whose certificate another CA signed, nor a plaintext one.
  orchestrate::ClusterTopology rogue;
  rogue.cluster_name = "rogue";
  rogue.controller_listen = "127.0.0.1:1";
  rogue.nodes = {{"node-2", absl::StrCat("127.0.0.1:", ports_[2])}};
  ASSERT_TRUE(cli::MakeClusterCerts(rogue, {.out_dir = dir_->path() + "/rogue"}).ok());
  const std::string r = dir_->path() + "/rogue/";
  {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = *rpc::ReadPemFile(Certs() + "ca.pem", "ca");
    opts.pem_cert_chain = *rpc::ReadPemFile(r + "node-2.pem", "cert");
    opts.pem_private_key = *rpc::ReadPemFile(r + "node-2.key", "key");
    std::string got;
    EXPECT_FALSE(FetchNodeOneLibrary(grpc::SslCredentials(opts), &got).ok());
    EXPECT_TRUE(got.empty());
  }
  std::string plain;
  EXPECT_FALSE(FetchNodeOneLibrary(grpc::InsecureChannelCredentials(), &plain).ok());
  EXPECT_TRUE(plain.empty());
}

}  // namespace
}  // namespace glm::testing
