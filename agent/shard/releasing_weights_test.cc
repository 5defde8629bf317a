#include "agent/shard/releasing_weights.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kGolden = GLM_GOLDEN_DIR;

class ReleasingWeightsTest : public ::testing::Test {
 protected:
  FakeClock clock_;
};

TEST_F(ReleasingWeightsTest, ReleasesEachTensorWhenTheNextIsReadAndTheLastOnFinish) {
  auto store = engine::WeightStore::Open(kGolden + "/tiny-dense");
  ASSERT_TRUE(store.ok()) << store.status();
  pagecache::Options o;
  pagecache::PageCacheManager pages(o, &clock_);
  std::vector<std::string> seen;
  ReleasingWeights w(store->get(), &pages,
                     [&](const std::string& name, int64_t n, uint64_t bytes) {
                       seen.push_back(name);
                       EXPECT_EQ(n, static_cast<int64_t>(seen.size()));
                       EXPECT_GT(bytes, 0u);
                     });
  std::vector<int64_t> shape;
  auto a = w.ReadFloat("model.norm.weight", &shape);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(shape, (std::vector<int64_t>{64}));
  EXPECT_TRUE(pages.actions().empty());  // still being uploaded
  ASSERT_TRUE(w.ReadFloat("lm_head.weight", &shape).ok());
  ASSERT_EQ(pages.actions().size(), 1u);  // the norm's range, once the head was asked for
  EXPECT_THAT(pages.actions()[0].reason, HasSubstr("model.safetensors:model.norm.weight ["));
  ASSERT_TRUE(w.Finish().ok());
  ASSERT_EQ(pages.actions().size(), 2u);
  EXPECT_THAT(pages.actions()[1].reason, HasSubstr("lm_head.weight"));
  EXPECT_EQ(w.tensors_read(), 2);
  EXPECT_EQ(w.bytes_read(), 64u * 4 + 256u * 64 * 4);
  EXPECT_EQ(w.fp32_bytes(), w.bytes_read());  // an fp32 checkpoint
  EXPECT_EQ(w.ranges_released(), 2u);
  EXPECT_THAT(seen, ::testing::ElementsAre("model.norm.weight", "lm_head.weight"));
  // After the release the tensor is still readable from the store (faulted back in).
  EXPECT_TRUE((*store)->ReadFloat("lm_head.weight").ok());
}

TEST_F(ReleasingWeightsTest, BlockScalesAreReleasedWithTheirWeight) {
  auto store = engine::WeightStore::Open(kGolden + "/tiny-fp8", [] {
    engine::WeightStoreOptions o;
    o.block = {128, 128};
    return o;
  }());
  ASSERT_TRUE(store.ok()) << store.status();
  pagecache::Options o;
  pagecache::PageCacheManager pages(o, &clock_);
  ReleasingWeights w(store->get(), &pages);
  auto down = w.ReadFloat("model.layers.0.mlp.down_proj.weight", nullptr);
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_TRUE(w.Finish().ok());
  ASSERT_EQ(pages.actions().size(), 2u);
  EXPECT_THAT(pages.actions()[0].reason, HasSubstr("down_proj.weight ["));
  EXPECT_THAT(pages.actions()[1].reason, HasSubstr("down_proj.weight_scale_inv ["));
  EXPECT_EQ(w.fp32_bytes(), down->size() * sizeof(float));
  EXPECT_GT(w.fp32_bytes(), w.bytes_read());  // fp8 on disk, fp32 in memory
}

TEST_F(ReleasingWeightsTest, MissingTensorIsNotFoundAndNothingIsCounted) {
  auto store = engine::WeightStore::Open(kGolden + "/tiny-dense");
  ASSERT_TRUE(store.ok());
  ReleasingWeights w(store->get(), nullptr);
  EXPECT_FALSE(w.Has("model.layers.9.mlp.gate.weight"));
  auto missing = w.ReadFloat("model.layers.9.mlp.gate.weight", nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(w.tensors_read(), 0);
  EXPECT_TRUE(w.Finish().ok());
}

}  // namespace
}  // namespace glm::agent
