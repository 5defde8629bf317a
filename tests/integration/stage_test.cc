// The Stage phase through the daemons: two agents started by the test on loopback, each with its
// own model directory (--model-dir), served to peers over gRPC (FetchFile); node-2's copy of
// tests/golden/tiny-sharded lacks a shard file that node-1 has. `glmctl up` passes through Stage,
// node-2 fetches the file from node-1 and verifies it, and the cluster reaches Ready.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

class StageClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("glm-stagetest");
    name_ = absl::StrCat("stagetest-", ::getpid());
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

  // Each node keeps the model in its own copy of the source; `drop` is removed from node-2's
  // (and from node-1's too when `drop_everywhere`).
  void Start(const std::string& drop, bool drop_everywhere = false) {
    WriteFile(yaml_,
              absl::StrCat("name: ", name_, "\ncontroller:\n  listen: 127.0.0.1:", ports_[0],
                           "\nmodel:\n  path: ", source_,
                           "\n  max_model_len: 512\n  kv_cache_dtype: bf16\n"
                           "  kv_cache_bytes: 64MiB\n  activation_reserve_bytes: 256MiB\n"
                           "  max_num_seqs: 4\nnode_defaults:\n  memory_budget_bytes: 1GiB\n"
                           "parallel:\n  tensor: 2\nnodes:\n  - name: node-1\n    agent: 127.0.0.1:",
                           ports_[1], "\n  - name: node-2\n    agent: 127.0.0.1:", ports_[2], "\n"));
    for (int i = 1; i <= 2; ++i) {
      std::string model = absl::StrCat(dir_->path(), "/node-", i, "-model");
      fs::copy(source_, model, fs::copy_options::recursive);
      if ((i == 2 || drop_everywhere) && !drop.empty()) fs::remove(model + "/" + drop);
      models_.push_back(model);
      pids_.push_back(SpawnBackground(
          {AgentBin(), "serve", "--listen", absl::StrCat("127.0.0.1:", ports_[i]), "--node",
           absl::StrCat("node-", i), "--allow-no-gpu", "--fabric-ip", "127.0.0.1",
           "--mtu-echo-port", "0", "--stage-root", model, "--stage-port", "0", "--model-dir",
           model},
          absl::StrCat(dir_->path(), "/agent-node-", i, ".log")));
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

  std::unique_ptr<TempDir> dir_;
  std::string name_, yaml_, source_;
  std::vector<int> ports_;
  std::vector<int> pids_;
  std::vector<std::string> models_;
  std::map<std::string, std::string> env_;
  std::error_code ec_;
};

TEST_F(StageClusterTest, CompleteCopiesAreVerifiedInPlace) {
  Start("");
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("[Stage] node-1: "), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("[Stage] node-2: "), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("present and verified"), std::string::npos) << up.output;
  EXPECT_EQ(up.output.find("fetched from peers"), std::string::npos) << up.output;
}

TEST_F(StageClusterTest, MissingShardFileIsFetchedFromThePeerAndVerified) {
  const std::string missing = "model-00002-of-00002.safetensors";
  Start(missing);
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
  Start(missing, /*drop_everywhere=*/true);
  CommandResult up = Glmctl({"up", yaml_});
  EXPECT_NE(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("node node-1"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find(missing), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("Fix:"), std::string::npos) << up.output;
  EXPECT_EQ(up.output.find("is up"), std::string::npos) << up.output;
}

}  // namespace
}  // namespace glm::testing
