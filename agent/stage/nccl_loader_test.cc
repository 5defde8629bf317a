#include "agent/stage/nccl_loader.h"

#include <filesystem>
#include <fstream>

#include "common/testing/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::stage {
namespace {

using ::testing::HasSubstr;

TEST(NcclVersionTest, ParsesAndFormats) {
  EXPECT_EQ(*ParseNcclVersion("2.30.4"), 23004);
  EXPECT_EQ(*ParseNcclVersion("2.18.1"), 21801);
  EXPECT_EQ(*ParseNcclVersion("2.8.4"), 2804);
  EXPECT_EQ(FormatNcclVersion(23004), "2.30.4");
  EXPECT_EQ(FormatNcclVersion(2804), "2.8.4");
  EXPECT_FALSE(ParseNcclVersion("2.30").ok());
  EXPECT_FALSE(ParseNcclVersion("two.30.4").ok());
}

TEST(NcclLoaderTest, GoodVersionLoadsAndTableCallsThroughHandle) {
  auto lib = NcclLibrary::Load(GLM_FAKE_NCCL_23004, "2.30.4");
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ((*lib)->version_code(), 23004);
  EXPECT_EQ((*lib)->version(), "2.30.4");
  const nccl::FunctionTable& t = (*lib)->table();
  nccl::UniqueId id;
  ASSERT_EQ(t.GetUniqueId(&id), 0);
  nccl::Comm comm = nullptr;
  ASSERT_EQ(t.CommInitRank(&comm, 2, id, 0), 0);
  EXPECT_EQ(reinterpret_cast<size_t>(comm), 7u);  // the fake derives it from the id bytes.
  float in[3] = {1, 2, 3}, out[3] = {};
  ASSERT_EQ(t.AllReduce(in, out, 3, 7, 0, comm, nullptr), 0);
  EXPECT_EQ(out[2], 3.0f);
  EXPECT_STREQ(t.GetErrorString(0), "no error");
}

TEST(NcclLoaderTest, WrongVersionNamesBoth) {
  auto lib = NcclLibrary::Load(GLM_FAKE_NCCL_22707, "2.30.4");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(lib.status().message()), HasSubstr("is version 2.27.7 (code 22707)"));
  EXPECT_THAT(std::string(lib.status().message()), HasSubstr("expected 2.30.4 (code 23004)"));
}

TEST(NcclLoaderTest, AnyVersionWhenNoneExpected) {
  auto lib = NcclLibrary::Load(GLM_FAKE_NCCL_22707, "");
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ((*lib)->version(), "2.27.7");
}

TEST(NcclLoaderTest, MissingSymbolNamed) {
  auto lib = NcclLibrary::Load(GLM_FAKE_NCCL_NO_ALLREDUCE, "2.30.4");
  ASSERT_FALSE(lib.ok());
  EXPECT_THAT(std::string(lib.status().message()), HasSubstr("does not export ncclAllReduce"));
}

TEST(NcclLoaderTest, InitRankConfigIsResolvedWhenPresent) {
  auto lib = NcclLibrary::Load(GLM_FAKE_NCCL_23004, "2.30.4");
  ASSERT_TRUE(lib.ok()) << lib.status();
  const nccl::FunctionTable& t = (*lib)->table();
  ASSERT_NE(t.CommInitRankConfig, nullptr);
  nccl::UniqueId id;
  ASSERT_EQ(t.GetUniqueId(&id), 0);
  nccl::Config config;
  config.blocking = 0;
  nccl::Comm comm = nullptr;
  ASSERT_EQ(t.CommInitRankConfig(&comm, 2, id, 0, &config), 0);
  EXPECT_EQ(reinterpret_cast<size_t>(comm), 7u);
  config.magic = 0;  // not made by NCCL_CONFIG_INITIALIZER: the library rejects it
  EXPECT_EQ(t.CommInitRankConfig(&comm, 2, id, 0, &config), 4);
}

TEST(NcclLoaderTest, InitRankConfigIsOptional) {
  // NCCL 2.13 has no ncclCommInitRankConfig: the library loads, with that slot null.
  auto lib = NcclLibrary::Load(GLM_FAKE_NCCL_21304, "2.13.4");
  ASSERT_TRUE(lib.ok()) << lib.status();
  const nccl::FunctionTable& t = (*lib)->table();
  EXPECT_EQ(t.CommInitRankConfig, nullptr);
  EXPECT_NE(t.CommInitRank, nullptr);
  EXPECT_NE(t.AllReduce, nullptr);
}

TEST(NcclLoaderTest, UnloadableFile) {
  std::filesystem::path dir = testing_util::ScratchDir("nccl_unloadable");
  std::string path = (dir / "libnccl.so.2").string();
  std::ofstream(path) << "this is not an ELF file\n";
  auto lib = NcclLibrary::Load(path, "2.30.4");
  ASSERT_FALSE(lib.ok());
  EXPECT_THAT(std::string(lib.status().message()), HasSubstr("cannot load NCCL library " + path));
  EXPECT_THAT(std::string(lib.status().message()), HasSubstr("fix:"));

  auto missing = NcclLibrary::Load((dir / "absent.so").string(), "2.30.4");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("cannot load NCCL library"));
}

}  // namespace
}  // namespace glm::stage
