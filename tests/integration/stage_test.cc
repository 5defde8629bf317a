// The Stage phase through the daemons: two agents started by the test on loopback, each with its
// own model directory (--model-dir), served to peers over gRPC (FetchFile); node-2's copy of
// tests/golden/tiny-sharded lacks a shard file that node-1 has. `glmctl up` passes through Stage,
// node-2 fetches the file from node-1 and verifies it, and the cluster reaches Ready.

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

class StageClusterTest : public LoopbackClusterTest {
 protected:
  StageClusterTest() : LoopbackClusterTest("stagetest") {}
  void SetUp() override {
    source_ = dir_->path() + "/source";
    fs::copy(SourceDir() + "/tests/golden/tiny-sharded", source_, fs::copy_options::recursive);
  }

  // Each node keeps the model in its own copy of the source; `drop` is removed from node-2's
  // (and from node-1's too when `drop_everywhere`).
  void Start(const std::string& drop, bool drop_everywhere = false) {
    ClusterYaml cluster;
    cluster.model_path = source_;
    cluster.nodes = {{"node-1", ""}, {"node-2", ""}};
    WriteClusterYaml(cluster);
    for (int i = 1; i <= 2; ++i) {
      std::string model = absl::StrCat(dir_->path(), "/node-", i, "-model");
      fs::copy(source_, model, fs::copy_options::recursive);
      if ((i == 2 || drop_everywhere) && !drop.empty()) fs::remove(model + "/" + drop);
      models_.push_back(model);
      StartAgent(i - 1, {"--allow-no-gpu", "--fabric-ip", "127.0.0.1", "--mtu-echo-port", "0",
                         "--stage-root", model, "--stage-port", "0", "--model-dir", model});
    }
    StartController();
    WaitForPorts();
  }

  std::string source_;
  std::vector<std::string> models_;
};

TEST_F(StageClusterTest, CompleteCopiesAreVerifiedInPlace) {
  ASSERT_NO_FATAL_FAILURE(Start(""));
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("[Stage] node-1: "), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("[Stage] node-2: "), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("present and verified"), std::string::npos) << up.output;
  EXPECT_EQ(up.output.find("fetched from peers"), std::string::npos) << up.output;
}

TEST_F(StageClusterTest, MissingShardFileIsFetchedFromThePeerAndVerified) {
  const std::string missing = "model-00002-of-00002.safetensors";
  ASSERT_NO_FATAL_FAILURE(Start(missing));
  ASSERT_FALSE(fs::exists(models_[1] + "/" + missing));
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("fetched from peers"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find(missing), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("is up"), std::string::npos) << up.output;
  ASSERT_TRUE(fs::exists(models_[1] + "/" + missing));
  EXPECT_EQ(ReadFile(models_[1] + "/" + missing), ReadFile(source_ + "/" + missing));
}

TEST_F(StageClusterTest, FileNoPeerHasStopsUpNamingNodeFileAndFix) {
  const std::string missing = "model-00001-of-00002.safetensors";
  ASSERT_NO_FATAL_FAILURE(Start(missing, /*drop_everywhere=*/true));
  CommandResult up = Glmctl({"up", yaml_});
  EXPECT_NE(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("node node-1"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find(missing), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("Fix:"), std::string::npos) << up.output;
  EXPECT_EQ(up.output.find("is up"), std::string::npos) << up.output;
}

}  // namespace
}  // namespace glm::testing
