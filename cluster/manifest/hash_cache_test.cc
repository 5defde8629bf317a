#include "cluster/manifest/hash_cache.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cluster/manifest/manifest.h"
#include "gtest/gtest.h"

namespace glm::cluster {
namespace {

namespace fs = std::filesystem;

class HashCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("hashcache_" + std::to_string(getpid()));
    fs::remove_all(root_);
    model_ = root_ / "model";
    fs::create_directories(model_ / "sub");
    for (int i = 0; i < 4; ++i) {
      std::ofstream(model_ / ("model-0000" + std::to_string(i) + ".safetensors"))
          << std::string(1000 + i, static_cast<char>('a' + i));
    }
    std::ofstream(model_ / "sub/tokenizer.json") << "{}";
    store_ = (root_ / "state/source-hashes.json").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  // One `glmctl up`: a fresh cache loaded from the store, a manifest, the store saved.
  Manifest Build(DirectHasher* counter) {
    HashCache cache(store_, counter);
    cache.Load();
    auto m = BuildManifest(model_.string(), &cache);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(cache.Save().ok());
    return *m;
  }

  fs::path root_, model_;
  std::string store_;
};

TEST_F(HashCacheTest, SecondBuildHashesNothingAndATouchedFileIsHashedAlone) {
  DirectHasher first;
  Manifest a = Build(&first);
  EXPECT_EQ(first.files_hashed(), 5);
  EXPECT_TRUE(fs::exists(store_));

  DirectHasher second;
  Manifest b = Build(&second);
  EXPECT_EQ(second.files_hashed(), 0);
  EXPECT_EQ(a.ToJson(), b.ToJson());

  // Touch one file (same bytes, new mtime): exactly that one is read again.
  const fs::path touched = model_ / "model-00002.safetensors";
  fs::last_write_time(touched, fs::last_write_time(touched) + std::chrono::seconds(5));
  DirectHasher third;
  Manifest c = Build(&third);
  EXPECT_EQ(third.files_hashed(), 1);
  EXPECT_EQ(a.ToJson(), c.ToJson());

  // Rewrite another with different bytes of the same size: re-hashed and the manifest follows.
  const fs::path changed = model_ / "model-00001.safetensors";
  {
    std::ofstream(changed, std::ios::trunc) << std::string(1001, 'z');
  }
  fs::last_write_time(changed, fs::last_write_time(changed) + std::chrono::seconds(7));
  DirectHasher fourth;
  Manifest d = Build(&fourth);
  EXPECT_EQ(fourth.files_hashed(), 1);
  EXPECT_NE(d.Find("model-00001.safetensors")->xxh3_128,
            a.Find("model-00001.safetensors")->xxh3_128);
  EXPECT_EQ(d.Find("model-00001.safetensors")->xxh3_128,
            HashFile(changed.string())->xxh3_128);
}

TEST_F(HashCacheTest, ReplacedFileWithTheSameSizeAndMtimeIsCaughtByItsInode) {
  DirectHasher first;
  Build(&first);
  const fs::path f = model_ / "model-00003.safetensors";
  auto mtime = fs::last_write_time(f);
  fs::path tmp = model_ / ".replacement";
  std::ofstream(tmp) << std::string(1003, 'Q');
  fs::last_write_time(tmp, mtime);
  fs::rename(tmp, f);  // new inode, same size and mtime
  DirectHasher second;
  Manifest m = Build(&second);
  EXPECT_EQ(second.files_hashed(), 1);
  EXPECT_EQ(m.Find("model-00003.safetensors")->xxh3_128, HashFile(f.string())->xxh3_128);
}

TEST_F(HashCacheTest, CorruptStoreIsIgnored) {
  fs::create_directories(fs::path(store_).parent_path());
  std::ofstream(store_) << "{not json";
  DirectHasher counter;
  HashCache cache(store_, &counter);
  cache.Load();
  auto h = cache.Hash((model_ / "sub/tokenizer.json").string());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->xxh3_128, HashFile((model_ / "sub/tokenizer.json").string())->xxh3_128);
  EXPECT_EQ(counter.files_hashed(), 1);
  EXPECT_EQ(cache.misses(), 1);
  auto again = cache.Hash((model_ / "sub/tokenizer.json").string());
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(counter.files_hashed(), 1);
}

}  // namespace
}  // namespace glm::cluster
