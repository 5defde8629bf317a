// StageWeights / StageNccl / FetchFile over a real in-process gRPC server on 127.0.0.1 (port 0),
// with a peer StageServer serving a complete copy of tests/golden/tiny-sharded, or a second agent
// serving its NCCL library.
#include <filesystem>
#include <fstream>

#include "agent/service/agent_service.h"
#include "agent/stage/stage_server.h"
#include "cluster/manifest/file_hash.h"
#include "cluster/manifest/manifest.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace glm::agent {
namespace {

namespace fs = std::filesystem;

class AgentStageRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("agent_stage_rpc_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    fs::copy(GLM_TINY_SHARDED, root_ / "source", fs::copy_options::recursive);
    AgentServiceOptions options;
    options.node = "n2";
    options.version = "9.9.9";
    service_ = std::make_unique<AgentService>(options, Clock::Real());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
    stub_ = glm::v1::Agent::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                        grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    fs::remove_all(root_);
  }

  struct Result {
    grpc::Status status;
    std::vector<glm::v1::Progress> progress;
  };
  template <typename Req, typename Call>
  Result Stream(const Req& req, Call call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = (stub_.get()->*call)(&ctx, req);
    Result r;
    glm::v1::Progress p;
    while (reader->Read(&p)) r.progress.push_back(p);
    r.status = reader->Finish();
    return r;
  }

  fs::path root_;
  int port_ = 0;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<glm::v1::Agent::Stub> stub_;
};

TEST_F(AgentStageRpcTest, CompleteDirectoryIsVerifiedWithoutFetching) {
  glm::v1::StageWeightsRequest req;
  req.set_model_dir((root_ / "source").string());
  Result r = Stream(req, &glm::v1::Agent::Stub::StageWeights);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_FALSE(r.progress.empty());
  const glm::v1::Progress& last = r.progress.back();
  EXPECT_TRUE(last.done());
  EXPECT_NE(last.message().find("present and verified"), std::string::npos) << last.message();
  EXPECT_GT(last.total_bytes(), 0);
  EXPECT_EQ(last.done_bytes(), last.total_bytes());
}

TEST_F(AgentStageRpcTest, MissingFileIsFetchedFromPeerAndVerified) {
  absl::StatusOr<cluster::Manifest> manifest = cluster::BuildManifest((root_ / "source").string());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  fs::copy(root_ / "source", root_ / "node", fs::copy_options::recursive);
  const std::string missing = "model-00002-of-00002.safetensors";
  fs::remove(root_ / "node" / missing);
  auto server = stage::StageServer::Start({.root = (root_ / "source").string()});
  ASSERT_TRUE(server.ok()) << server.status();

  glm::v1::StageWeightsRequest req;
  req.set_model_dir((root_ / "node").string());
  req.set_manifest_json(manifest->ToJson().dump());
  auto* peer = req.add_peers();
  peer->set_node("n1");
  peer->set_host("127.0.0.1");
  peer->set_port((*server)->port());
  Result r = Stream(req, &glm::v1::Agent::Stub::StageWeights);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_NE(r.progress.back().message().find("fetched from peers"), std::string::npos)
      << r.progress.back().message();
  EXPECT_NE(r.progress.back().message().find(missing), std::string::npos);
  ASSERT_TRUE(fs::exists(root_ / "node" / missing));
  EXPECT_EQ(fs::file_size(root_ / "node" / missing), fs::file_size(root_ / "source" / missing));
}

TEST_F(AgentStageRpcTest, MissingFileWithoutPeersFailsNamingNodeAndFile) {
  absl::StatusOr<cluster::Manifest> manifest = cluster::BuildManifest((root_ / "source").string());
  ASSERT_TRUE(manifest.ok());
  const std::string missing = "model-00001-of-00002.safetensors";
  fs::remove(root_ / "source" / missing);
  glm::v1::StageWeightsRequest req;
  req.set_model_dir((root_ / "source").string());
  req.set_manifest_json(manifest->ToJson().dump());
  Result r = Stream(req, &glm::v1::Agent::Stub::StageWeights);
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.error_message().find("n2"), std::string::npos) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find(missing), std::string::npos) << r.status.error_message();
}

TEST_F(AgentStageRpcTest, NcclWithoutLibraryIsSkipped) {
  Result r = Stream(glm::v1::StageNcclRequest(), &glm::v1::Agent::Stub::StageNccl);
  ASSERT_TRUE(r.status.ok());
  ASSERT_EQ(r.progress.size(), 1u);
  EXPECT_EQ(r.progress[0].step(), "skip");
  EXPECT_NE(r.progress[0].message().find("names no NCCL library"), std::string::npos);
}

TEST_F(AgentStageRpcTest, NcclIsCopiedFromSourceAndVersionChecked) {
  glm::v1::StageNcclRequest req;
  req.set_library_path((root_ / "lib" / "libnccl.so.2").string());
  req.set_source_path(GLM_FAKE_NCCL_23004);
  req.set_expected_version("2.30.4");
  Result r = Stream(req, &glm::v1::Agent::Stub::StageNccl);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_NE(r.progress.back().message().find("staged from the source and verified"),
            std::string::npos)
      << r.progress.back().message();
  EXPECT_NE(r.progress.back().message().find("2.30.4"), std::string::npos);

  req.set_expected_version("2.27.7");
  r = Stream(req, &glm::v1::Agent::Stub::StageNccl);
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.error_message().find("2.27.7"), std::string::npos) << r.status.error_message();
}

// A second agent ("n1") holding the pinned NCCL build at its --nccl-library and a stage root.
class PeerAgent {
 public:
  PeerAgent(const std::string& nccl_library, const std::string& stage_root) {
    AgentServiceOptions options;
    options.node = "n1";
    options.nccl_library = nccl_library;
    options.stage_root = stage_root;
    service_ = std::make_unique<AgentService>(options, Clock::Real());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
  }
  ~PeerAgent() {
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  int port() const { return port_; }
  AgentService& service() { return *service_; }

 private:
  int port_ = 0;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(AgentStageRpcTest, NcclMissingHereIsFetchedFromAPeerAgentAndVerified) {
  fs::create_directories(root_ / "peer");
  fs::copy_file(GLM_FAKE_NCCL_23004, root_ / "peer" / "libnccl.so.2");
  auto hash = cluster::HashFile((root_ / "peer" / "libnccl.so.2").string());
  ASSERT_TRUE(hash.ok());
  PeerAgent peer((root_ / "peer" / "libnccl.so.2").string(), (root_ / "source").string());
  ASSERT_NE(peer.port(), 0);

  glm::v1::StageNcclRequest req;
  req.set_library_path((root_ / "lib" / "libnccl.so.2").string());
  req.set_expected_version("2.30.4");
  req.set_expected_hash(hash->xxh3_128);
  req.set_peer_size(static_cast<int64_t>(hash->size));
  auto* p = req.add_peers();
  p->set_node("n1");
  p->set_host("127.0.0.1");
  p->set_port(peer.port());
  Result r = Stream(req, &glm::v1::Agent::Stub::StageNccl);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_NE(r.progress.back().message().find("staged from n1 and verified, version 2.30.4"),
            std::string::npos)
      << r.progress.back().message();
  EXPECT_EQ(cluster::HashFile((root_ / "lib" / "libnccl.so.2").string())->xxh3_128, hash->xxh3_128);
  EXPECT_EQ(peer.service().bytes_served(), hash->size);
  // Byte progress reached the stream.
  bool saw_bytes = false;
  for (const auto& m : r.progress) saw_bytes = saw_bytes || m.total_bytes() == int64_t(hash->size);
  EXPECT_TRUE(saw_bytes);

  // The same, once present: verified in place, nothing fetched.
  r = Stream(req, &glm::v1::Agent::Stub::StageNccl);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_NE(r.progress.back().message().find("present and verified"), std::string::npos);
  EXPECT_EQ(peer.service().bytes_served(), hash->size);

  // The pinned build has another version than the YAML expects: both versions are named.
  fs::remove(root_ / "lib" / "libnccl.so.2");
  req.set_expected_version("2.27.7");
  r = Stream(req, &glm::v1::Agent::Stub::StageNccl);
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.error_message().find("n2"), std::string::npos) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("is version 2.30.4"), std::string::npos)
      << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("expected 2.27.7"), std::string::npos);

  // No peer and no source: the error says nobody holds it.
  req.set_expected_version("2.30.4");
  req.clear_peers();
  fs::remove(root_ / "lib" / "libnccl.so.2");
  r = Stream(req, &glm::v1::Agent::Stub::StageNccl);
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.error_message().find("no peer holds it"), std::string::npos)
      << r.status.error_message();
}

TEST_F(AgentStageRpcTest, FetchFileServesTheStageRootOnly) {
  PeerAgent peer("", (root_ / "source").string());
  auto stub = glm::v1::Agent::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(peer.port()), grpc::InsecureChannelCredentials()));
  auto fetch = [&](const std::string& path, int64_t offset, std::string* data) {
    grpc::ClientContext ctx;
    glm::v1::FetchFileRequest req;
    req.set_path(path);
    req.set_offset(offset);
    auto reader = stub->FetchFile(&ctx, req);
    glm::v1::FileChunk chunk;
    while (reader->Read(&chunk)) *data += chunk.data();
    return reader->Finish();
  };
  std::string data;
  ASSERT_TRUE(fetch("config.json", 0, &data).ok());
  std::ifstream in(root_ / "source" / "config.json");
  std::string expected((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(data, expected);
  data.clear();
  ASSERT_TRUE(fetch("config.json", 5, &data).ok());
  EXPECT_EQ(data, expected.substr(5));
  EXPECT_EQ(fetch("../source/config.json", 0, &data).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(fetch("/etc/passwd", 0, &data).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(fetch("nope.bin", 0, &data).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(fetch("config.json", 1 << 30, &data).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  // No NCCL library configured on that agent.
  grpc::ClientContext ctx;
  glm::v1::FetchFileRequest req;
  req.set_nccl_library(true);
  auto reader = stub->FetchFile(&ctx, req);
  glm::v1::FileChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace glm::agent
