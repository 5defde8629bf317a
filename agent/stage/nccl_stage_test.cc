#include "agent/stage/nccl_stage.h"

#include <filesystem>
#include <fstream>

#include "cluster/manifest/file_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::stage {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class NcclStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("nccl_stage_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(NcclStageTest, CopiesWhenMissingThenSkipsWhenSame) {
  NcclStageOptions o;
  o.source_path = GLM_FAKE_NCCL_23004;
  o.dest_path = (dir_ / "nccl/libnccl.so.2").string();
  o.expected_version = "2.30.4";
  auto r = StageAndLoadNccl(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->copied);
  EXPECT_EQ(r->library->version(), "2.30.4");
  EXPECT_EQ(cluster::HashFile(o.dest_path)->xxh3_128, cluster::HashFile(o.source_path)->xxh3_128);
  EXPECT_FALSE(fs::exists(o.dest_path + ".partial"));

  auto again = StageAndLoadNccl(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->copied);
}

TEST_F(NcclStageTest, ReplacesDifferentBuildWithSameVersion) {
  // Same version string, different bytes (vllm#42354: a different build fixed a wedge).
  NcclStageOptions o;
  o.dest_path = (dir_ / "libnccl.so.2").string();
  fs::copy_file(GLM_FAKE_NCCL_NO_ALLREDUCE, o.dest_path);
  o.source_path = GLM_FAKE_NCCL_23004;
  o.expected_version = "2.30.4";
  auto r = StageAndLoadNccl(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->copied);
}

TEST_F(NcclStageTest, HashMismatchFromFetchIsRejected) {
  NcclStageOptions o;
  o.dest_path = (dir_ / "libnccl.so.2").string();
  o.expected_hash = cluster::HashFile(GLM_FAKE_NCCL_23004)->xxh3_128;
  o.fetch = [](const std::string& partial) {
    std::error_code ec;
    fs::copy_file(GLM_FAKE_NCCL_22707, partial, ec);
    return absl::OkStatus();
  };
  auto r = StageAndLoadNccl(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("differs from the source's " + o.expected_hash));
  EXPECT_FALSE(fs::exists(o.dest_path));
  EXPECT_FALSE(fs::exists(o.dest_path + ".partial"));
}

TEST_F(NcclStageTest, WrongVersionAfterStagingNamesBoth) {
  NcclStageOptions o;
  o.dest_path = (dir_ / "libnccl.so.2").string();
  o.source_path = GLM_FAKE_NCCL_22707;
  o.expected_version = "2.30.4";
  auto r = StageAndLoadNccl(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is version 2.27.7 (code 22707), expected 2.30.4"));
}

}  // namespace
}  // namespace glm::stage
