// The manifest of a five-file checkpoint (4 decoder layers + the MTP layer): what each shard
// needs, the JSON round trip, and the entries FromJson refuses.
#include "cluster/manifest/manifest.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::cluster {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("manifest_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << R"({"num_hidden_layers": 4, "hidden_size": 64})";
    std::ofstream(dir_ / "tokenizer.json") << R"({"model": {"type": "BPE"}})";
    std::ofstream(dir_ / "model.safetensors.index.json") << R"({
      "metadata": {"total_size": 1},
      "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00005.safetensors",
        "model.layers.0.self_attn.q_a_proj.weight": "model-00002-of-00005.safetensors",
        "model.layers.1.mlp.experts.0.up_proj.weight": "model-00002-of-00005.safetensors",
        "model.layers.2.self_attn.q_a_proj.weight": "model-00003-of-00005.safetensors",
        "model.layers.3.mlp.gate.weight": "model-00003-of-00005.safetensors",
        "model.norm.weight": "model-00004-of-00005.safetensors",
        "lm_head.weight": "model-00004-of-00005.safetensors",
        "model.layers.4.eh_proj.weight": "model-00005-of-00005.safetensors"
      }})";
    for (int i = 1; i <= 5; ++i) {
      std::ofstream(dir_ / ("model-0000" + std::to_string(i) + "-of-00005.safetensors"))
          << std::string(4096 * i + 17, static_cast<char>('a' + i));
    }
    std::ofstream(dir_ / "model-00001-of-00005.safetensors.partial") << "half a download";
    std::ofstream(dir_ / ".hidden") << "editor state";
    auto m = BuildManifest(dir_.string());
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  Manifest manifest_;
};

TEST_F(ManifestTest, ListsEveryFileButPartialsAndDotFiles) {
  EXPECT_EQ(manifest_.num_hidden_layers, 4);
  EXPECT_EQ(manifest_.files.size(), 8u);
  EXPECT_EQ(manifest_.weight_map.size(), 8u);
  const ManifestFile* f = manifest_.Find("model-00002-of-00005.safetensors");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->size, 4096u * 2 + 17);
  EXPECT_EQ(f->xxh3_128.size(), 32u);
  EXPECT_EQ(manifest_.Find("model-00001-of-00005.safetensors.partial"), nullptr);
  EXPECT_EQ(manifest_.Find(".hidden"), nullptr);
}

TEST_F(ManifestTest, ShardPlans) {
  const std::string common[] = {"config.json", "model.safetensors.index.json", "tokenizer.json"};
  ShardSpec first{0, 2, true, false, true};
  EXPECT_THAT(FilesForShard(manifest_, first),
              ElementsAre(common[0], "model-00001-of-00005.safetensors",
                          "model-00002-of-00005.safetensors", common[1], common[2]));
  ShardSpec last{2, 4, false, true, true};  // MTP reuses embed_tokens → 00001 too
  EXPECT_THAT(FilesForShard(manifest_, last),
              ElementsAre(common[0], "model-00001-of-00005.safetensors",
                          "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                          "model-00005-of-00005.safetensors", common[1], common[2]));
  ShardSpec last_no_mtp{2, 4, false, true, false};
  EXPECT_THAT(FilesForShard(manifest_, last_no_mtp),
              ElementsAre(common[0], "model-00003-of-00005.safetensors",
                          "model-00004-of-00005.safetensors", common[1], common[2]));
}

TEST_F(ManifestTest, JsonRoundTripAndRefusedEntries) {
  auto round_trip = Manifest::FromJson(manifest_.ToJson());
  ASSERT_TRUE(round_trip.ok()) << round_trip.status();
  EXPECT_EQ(round_trip->ToJson(), manifest_.ToJson());
  nlohmann::json bad = manifest_.ToJson();
  bad["files"][0]["path"] = "../etc/passwd";
  EXPECT_THAT(std::string(Manifest::FromJson(bad).status().message()), HasSubstr("without '..'"));
  bad = manifest_.ToJson();
  bad["weight_map"]["x"] = "nope.safetensors";
  EXPECT_THAT(std::string(Manifest::FromJson(bad).status().message()), HasSubstr("unlisted file"));
}

}  // namespace
}  // namespace glm::cluster
