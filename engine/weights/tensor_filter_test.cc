#include "engine/weights/tensor_filter.h"

#include "gtest/gtest.h"

namespace glm::engine {
namespace {

TEST(TensorFilterTest, LayerIndexOf) {
  EXPECT_EQ(LayerIndexOf("model.layers.0.input_layernorm.weight"), 0);
  EXPECT_EQ(LayerIndexOf("model.layers.78.eh_proj.weight"), 78);
  EXPECT_EQ(LayerIndexOf("model.layers.12"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("model.layers..x"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("model.layers.x1.y"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("model.layers.01.y"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("model.layers.99999999999.y"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("model.embed_tokens.weight"), std::nullopt);
}

TEST(TensorFilterTest, LayerRange) {
  TensorFilter first_stage = LayerRangeFilter(0, 2, /*embedding=*/true, /*head=*/false);
  EXPECT_TRUE(first_stage("model.embed_tokens.weight"));
  EXPECT_TRUE(first_stage("model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_TRUE(first_stage("model.layers.2.self_attn.q_a_proj.weight_scale_inv"));
  EXPECT_FALSE(first_stage("model.layers.3.mlp.gate.weight"));
  EXPECT_FALSE(first_stage("model.layers.20.mlp.gate.weight"));  // not a prefix match on "2"
  EXPECT_FALSE(first_stage("model.norm.weight"));
  EXPECT_FALSE(first_stage("lm_head.weight"));

  TensorFilter last_stage = LayerRangeFilter(3, 4, /*embedding=*/false, /*head=*/true);
  EXPECT_TRUE(last_stage("model.norm.weight"));
  EXPECT_TRUE(last_stage("lm_head.weight"));
  EXPECT_TRUE(last_stage("model.layers.4.mlp.experts.7.down_proj.weight"));
  EXPECT_FALSE(last_stage("model.layers.5.eh_proj.weight"));  // MTP not in range
  EXPECT_FALSE(last_stage("model.embed_tokens.weight"));
  EXPECT_FALSE(last_stage("model.rotary_emb.inv_freq"));

  // An MTP layer (index 5 = num_hidden_layers) is selected by extending the range.
  TensorFilter with_mtp = LayerRangeFilter(3, 5, false, true);
  EXPECT_TRUE(with_mtp("model.layers.5.eh_proj.weight"));
}

TEST(TensorFilterTest, SelectionWithNumHiddenLayers) {
  LayerSelection selection;
  selection.first_layer = 0;
  selection.last_layer = 100;  // clipped to the 78 decoder layers
  selection.num_hidden_layers = 78;
  selection.mtp = false;
  TensorFilter no_mtp = LayerRangeFilter(selection);
  EXPECT_TRUE(no_mtp("model.layers.77.mlp.gate.weight"));
  EXPECT_FALSE(no_mtp("model.layers.78.enorm.weight"));
  selection.first_layer = 77;
  selection.last_layer = 77;
  selection.mtp = true;
  TensorFilter mtp = LayerRangeFilter(selection);
  EXPECT_TRUE(mtp("model.layers.78.shared_head.norm.weight"));
  EXPECT_TRUE(mtp("model.layers.79.enorm.weight"));  // a second MTP layer
  EXPECT_TRUE(mtp("model.layers.77.mlp.gate.weight"));
  EXPECT_FALSE(mtp("model.layers.76.mlp.gate.weight"));
  // MTP only (e.g. a draft-model stage).
  selection.first_layer = 0;
  selection.last_layer = -1;
  TensorFilter mtp_only = LayerRangeFilter(selection);
  EXPECT_FALSE(mtp_only("model.layers.0.mlp.gate.weight"));
  EXPECT_TRUE(mtp_only("model.layers.78.eh_proj.weight"));
}

}  // namespace
}  // namespace glm::engine
