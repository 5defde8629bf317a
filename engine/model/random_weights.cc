#include "engine/model/random_weights.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace glm::engine {
namespace {

class SpecBuilder {
 public:
  explicit SpecBuilder(std::vector<RandomTensorSpec>* out) : out_(out) {}
  // A Linear weight [rows, cols] (out, in): standard deviation gain / sqrt(cols).
  void Linear(const std::string& name, int64_t rows, int64_t cols, float gain = 1.0f) {
    out_->push_back({name, {rows, cols}, 0.0f, gain / std::sqrt(static_cast<float>(cols))});
  }
  void Vector(const std::string& name, int64_t n, float mean, float stddev) {
    out_->push_back({name, {n}, mean, stddev});
  }

 private:
  std::vector<RandomTensorSpec>* out_;
};

// One decoder layer in DecoderLayer::Load's order (layers.cc).
void LayerSpecs(const ModelConfig& c, int l, SpecBuilder& f) {
  const std::string p = absl::StrCat("model.layers.", l);
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  f.Vector(p + ".input_layernorm.weight", H, 1.0f, 0.1f);
  f.Vector(p + ".post_attention_layernorm.weight", H, 1.0f, 0.1f);
  const std::string a = p + ".self_attn";
  f.Linear(a + ".q_a_proj.weight", c.q_lora_rank, H);
  f.Vector(a + ".q_a_layernorm.weight", c.q_lora_rank, 1.0f, 0.1f);
  f.Linear(a + ".q_b_proj.weight", nh * c.qk_head_dim(), c.q_lora_rank, 2.0f);
  f.Linear(a + ".kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, H);
  f.Vector(a + ".kv_a_layernorm.weight", c.kv_lora_rank, 1.0f, 0.1f);
  f.Linear(a + ".kv_b_proj.weight", nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
           2.0f);
  f.Linear(a + ".o_proj.weight", H, nh * c.v_head_dim);
  if (c.HasIndexer(l)) {
    f.Linear(a + ".indexer.wq_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    f.Linear(a + ".indexer.wk.weight", c.index_head_dim, H);
    f.Vector(a + ".indexer.k_norm.weight", c.index_head_dim, 1.0f, 0.1f);
    f.Vector(a + ".indexer.k_norm.bias", c.index_head_dim, 0.0f, 0.1f);
    f.Linear(a + ".indexer.weights_proj.weight", c.index_n_heads, H);
  }
  const std::string m = p + ".mlp";
  auto mlp = [&](const std::string& q, int64_t inter) {
    f.Linear(q + ".gate_proj.weight", inter, H);
    f.Linear(q + ".up_proj.weight", inter, H);
    f.Linear(q + ".down_proj.weight", H, inter);
  };
  if (c.IsMoeLayer(l)) {
    f.Linear(m + ".gate.weight", c.n_routed_experts, H, 2.0f);
    f.Vector(m + ".gate.e_score_correction_bias", c.n_routed_experts, 0.0f, 0.1f);
    for (int e = 0; e < c.n_routed_experts; ++e) {
      mlp(absl::StrCat(m, ".experts.", e), c.moe_intermediate_size);
    }
    mlp(m + ".shared_experts", c.moe_intermediate_size * std::max(1, c.n_shared_experts));
  } else {
    mlp(m, c.intermediate_size);
  }
}

}  // namespace

int64_t RandomTensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<RandomTensorSpec> RandomTensorSpecs(const ModelConfig& c) {
  std::vector<RandomTensorSpec> specs;
  SpecBuilder f(&specs);
  const int64_t H = c.hidden_size;
  f.Vector("model.embed_tokens.weight", c.vocab_size * H, 0.0f, 1.0f);
  specs.back().shape = {c.vocab_size, H};
  for (int l = 0; l < c.num_hidden_layers; ++l) LayerSpecs(c, l, f);
  f.Vector("model.norm.weight", H, 1.0f, 0.1f);
  f.Linear("lm_head.weight", c.vocab_size, H, 4.0f);
  if (c.num_nextn_predict_layers > 0) {
    const std::string p = absl::StrCat("model.layers.", c.num_hidden_layers);
    f.Vector(p + ".enorm.weight", H, 1.0f, 0.1f);
    f.Vector(p + ".hnorm.weight", H, 1.0f, 0.1f);
    f.Vector(p + ".shared_head.norm.weight", H, 1.0f, 0.1f);
    f.Linear(p + ".eh_proj.weight", H, 2 * H);
    LayerSpecs(c, c.num_hidden_layers, f);
  }
  return specs;
}

void MakeRandomWeights(const ModelConfig& c, uint64_t seed, InMemoryWeights* out) {
  std::mt19937_64 rng(seed);
  for (RandomTensorSpec& spec : RandomTensorSpecs(c)) {
    std::normal_distribution<float> d(spec.mean, spec.stddev);
    std::vector<float> v(spec.numel());
    for (float& x : v) x = d(rng);
    out->Put(spec.name, std::move(spec.shape), std::move(v));
  }
}

ModelConfig SmallTestConfig(int num_layers, int num_dense, bool index_share) {
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = num_layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.q_lora_rank = 32;
  c.kv_lora_rank = 16;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_topk = 4;
  c.first_k_dense_replace = num_dense;
  for (int l = 0; l < num_layers; ++l) {
    c.indexer_types.push_back(index_share && l > 0 && l % 2 == 0 ? IndexerType::kShared
                                                                  : IndexerType::kFull);
    c.mlp_layer_types.push_back(l < num_dense ? MlpType::kDense : MlpType::kSparse);
  }
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 4096;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.routed_scaling_factor = 2.5;
  c.num_nextn_predict_layers = 1;
  return c;
}

}  // namespace glm::engine
