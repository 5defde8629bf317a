#include "cluster/manifest/file_hash.h"

#include <filesystem>
#include <fstream>

#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"

namespace glm::cluster {
namespace {

namespace fs = std::filesystem;

TEST(FileHashTest, KnownVectorAndStreaming) {
  fs::path p = testing_util::ScratchDir("file_hash") / "hash_vec";
  std::ofstream(p) << "";
  // XXH3-128 of the empty input (xxhash test vectors).
  EXPECT_EQ(HashFile(p.string())->xxh3_128, "99aa06d3014798d86001c324468d497f");
  Xxh3Hasher a, b;
  a.Update("hello world", 11);
  b.Update("hello ", 6);
  b.Update("world", 5);
  EXPECT_EQ(a.HexDigest(), b.HexDigest());
  EXPECT_FALSE(HashFile((fs::path(::testing::TempDir()) / "nope").string()).ok());
}

}  // namespace
}  // namespace glm::cluster
