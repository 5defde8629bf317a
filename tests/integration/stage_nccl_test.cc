// NCCL staging and staged-file transfers through the daemons: two agents on loopback, each with
// its own NCCL path (--nccl-library) and model dir; the controller's host holds the pinned build
// at nccl.library (test-built fake NCCL libraries). node-2 lacks the library: preflight warns
// that it will be staged from node-1, Stage fetches it from node-1 over gRPC (FetchFile), checks
// hash and version, and the cluster reaches Ready. A pinned build of the wrong version stops `up`
// naming the node, both versions and the fix. Under mTLS the peer fetch works with the nodes'
// cluster certificates and a client without a valid certificate is refused.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "controller/cli/certs.h"
#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/rpc/credentials.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

class StageNcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("glm-stagenccl");
    name_ = absl::StrCat("stagenccl-", ::getpid());
    yaml_ = dir_->path() + "/cluster.yaml";
    env_ = {{"GLMCTL_STATE_DIR", dir_->path() + "/state"}};
    ports_ = FreePorts(3);
    source_ = dir_->path() + "/source";
    fs::copy(SourceDir() + "/tests/golden/tiny-sharded", source_, fs::copy_options::recursive);
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
    WriteFile(yaml_,
              absl::StrCat("name: ", name_, "\ncontroller:\n  listen: 127.0.0.1:", ports_[0],
                           tls ? "\n  tls: {ca: certs/ca.pem, cert: certs/controller.pem, "
                                 "key: certs/controller.key}"
                               : "",
                           "\nmodel:\n  path: ", source_,
                           "\n  max_model_len: 512\n  kv_cache_dtype: bf16\n"
                           "  kv_cache_bytes: 64MiB\n  activation_reserve_bytes: 256MiB\n"
                           "  max_num_seqs: 4\nnode_defaults:\n  memory_budget_bytes: 1GiB\n"
                           "nccl:\n  library: ", controller_lib,
                           "\n  expected_version: \"2.30.4\"\n"
                           "parallel:\n  tensor: 2\nnodes:\n  - name: node-1\n    agent: 127.0.0.1:",
                           ports_[1], "\n  - name: node-2\n    agent: 127.0.0.1:", ports_[2], "\n"));
    if (tls) {
      CommandResult certs = Glmctl({"certs", "--out", dir_->path() + "/certs", yaml_});
      ASSERT_EQ(certs.exit_code, 0) << certs.output;
    }
    for (int i = 1; i <= 2; ++i) {
      std::string model = absl::StrCat(dir_->path(), "/node-", i, "-model");
      fs::copy(source_, model, fs::copy_options::recursive);
      std::string node = absl::StrCat("node-", i);
      std::vector<std::string> argv = {
          AgentBin(), "serve", "--listen", absl::StrCat("127.0.0.1:", ports_[i]), "--node", node,
          "--allow-no-gpu", "--fabric-ip", "127.0.0.1", "--mtu-echo-port", "0", "--stage-port",
          "0", "--model-dir", model, "--nccl-library", NodeLib(i)};
      if (tls) {
        argv.insert(argv.end(), {"--tls-ca", Certs() + "ca.pem", "--tls-cert",
                                 Certs() + node + ".pem", "--tls-key", Certs() + node + ".key"});
      }
      pids_.push_back(SpawnBackground(argv, absl::StrCat(dir_->path(), "/agent-", node, ".log")));
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

  // FetchFile of node-1's NCCL library with `creds`; returns the bytes or the error.
  grpc::Status FetchNodeOneLibrary(std::shared_ptr<grpc::ChannelCredentials> creds,
                                   std::string* data) {
    auto stub = glm::v1::Agent::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", ports_[1]), creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    glm::v1::FetchFileRequest req;
    req.set_nccl_library(true);
    auto reader = stub->FetchFile(&ctx, req);
    glm::v1::FileChunk chunk;
    while (reader->Read(&chunk)) *data += chunk.data();
    return reader->Finish();
  }

  std::unique_ptr<TempDir> dir_;
  std::string name_, yaml_, source_;
  std::vector<int> ports_;
  std::vector<int> pids_;
  std::map<std::string, std::string> env_;
  std::error_code ec_;
};

TEST_F(StageNcclTest, MissingLibraryIsFetchedFromAPeerVerifiedAndUpReachesReady) {
  Start(GLM_FAKE_NCCL_23004, /*tls=*/false);
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
  Start(GLM_FAKE_NCCL_22707, /*tls=*/false);
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
  Start(GLM_FAKE_NCCL_23004, /*tls=*/true);
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
