#include "controller/plan/plan.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::controller {
namespace {

using ::testing::HasSubstr;
using engine::ModelConfig;

constexpr int64_t kGiB = int64_t{1} << 30;

std::string SourceDir() {
  const char* dir = std::getenv("GLM_SOURCE_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return GLM_TEST_SOURCE_DIR;
}

ModelConfig Glm5() {
  auto c = engine::LoadModelConfig(SourceDir() + "/configs/models/glm-5");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}
ModelConfig Glm52() {
  auto c = engine::LoadModelConfig(SourceDir() + "/configs/models/glm-5.2-fp8");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// `count` nodes n0.. with the given budget; parallel sizes set by the caller.
cluster::ClusterSpec Spec(int tp, int pp, int replicas, int64_t budget) {
  cluster::ClusterSpec spec;
  spec.source = "test.yaml";
  spec.name = "test";
  spec.model.path = "m";
  spec.model.served_name = "m";
  spec.model.max_model_len = 200000;
  spec.model.max_num_seqs = 1;
  spec.parallel.tensor = tp;
  spec.parallel.pipeline = pp;
  spec.parallel.replicas = replicas;
  for (int i = 0; i < tp * pp * replicas; ++i) {
    cluster::NodeSpec node;
    node.name = "n" + std::to_string(i);
    node.agent = "10.0.0." + std::to_string(i + 1) + ":1";
    node.memory_budget_bytes = budget;
    spec.nodes.push_back(node);
  }
  return spec;
}

TEST(KvBytes, PerLayerMatchesSpec) {
  ModelConfig c = Glm5();
  // fp8_ds_mla: 512 fp8 latent + 64 bf16 rope (128 B) + 512/128 = 4 f32 scales (16 B) = 656.
  EXPECT_EQ(LatentKvBytesPerTokenLayer(c, cluster::KvCacheDtype::kFp8), 656);
  // bf16: (512 + 64) * 2 = 1152.
  EXPECT_EQ(LatentKvBytesPerTokenLayer(c, cluster::KvCacheDtype::kBf16), 1152);
  // Indexer key: 128 fp8 + one f32 scale = 132; bf16 128 * 2 = 256.
  EXPECT_EQ(IndexerKvBytesPerTokenLayer(c, cluster::KvCacheDtype::kFp8), 132);
  EXPECT_EQ(IndexerKvBytesPerTokenLayer(c, cluster::KvCacheDtype::kBf16), 256);
}

TEST(KvBytes, WholeModel) {
  // GLM-5: 78 layers, all full: 78 * (656 + 132) = 61,464 B/token.
  EXPECT_EQ(KvBytesPerToken(Glm5(), cluster::KvCacheDtype::kFp8, 0, 77), 61464);
  // GLM-5 bf16: 78 * (1152 + 256) = 109,824.
  EXPECT_EQ(KvBytesPerToken(Glm5(), cluster::KvCacheDtype::kBf16, 0, 77), 109824);
  // GLM-5.2: indexer keys only on the 21 full layers: 78 * 656 + 21 * 132 = 51,168 + 2,772 = 53,940.
  EXPECT_EQ(KvBytesPerToken(Glm52(), cluster::KvCacheDtype::kFp8, 0, 77), 53940);
  // The MTP layer (78) always has a full indexer: 656 + 132 = 788.
  EXPECT_EQ(KvBytesPerToken(Glm52(), cluster::KvCacheDtype::kFp8, 78, 78), 788);
}

// specs/quantized-checkpoints.md §5.1: QuantTrio Int4-Int8Mix holds 405,459,090,304 tensor
// bytes, which only matches with FP32 routers: the estimate counts a compressed-tensors
// checkpoint's routers as FP32. NVFP4 (BF16 routers, MTP experts excluded) is
// 464,795,267,072 B.
TEST(WeightEstimate, QuantizedCheckpointsMatchTheSpecByteModel) {
  auto int4 = engine::LoadModelConfig(SourceDir() + "/configs/models/glm-5.2-int4-int8mix");
  ASSERT_TRUE(int4.ok()) << int4.status();
  auto w = EstimateWeightSizes(*int4);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->total_bytes(), int64_t{405459090304});
  // One INT4 g128 routed expert of layer 3: gate/up [2048, 6144] -> 2048*768*4 + 2048*48*2 + 16,
  // down [6144, 2048] -> 6144*256*4 + 6144*16*2 + 16.
  EXPECT_EQ(w->routed_expert_bytes[3], int64_t{256} * (2 * (6291456 + 196608 + 16) + (6291456 + 196608 + 16)));

  auto nvfp4 = engine::LoadModelConfig(SourceDir() + "/configs/models/glm-5.2-nvfp4");
  ASSERT_TRUE(nvfp4.ok()) << nvfp4.status();
  ASSERT_TRUE(nvfp4->quantization.has_value());
  EXPECT_EQ(nvfp4->quantization->method, engine::QuantMethod::kNvfp4);
  auto n = EstimateWeightSizes(*nvfp4);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->total_bytes(), int64_t{464795267072});
  // gate/up [2048, 6144]: 2048*3072 + 2048*384 + 8; down [6144, 2048]: 6144*1024 + 6144*128 + 8.
  EXPECT_EQ(n->routed_expert_bytes[3], int64_t{256} * (2 * (6291456 + 786432 + 8) + (6291456 + 786432 + 8)));
}

TEST(WeightEstimate, Glm52Fp8MatchesCheckpointTotal) {
  auto w = EstimateWeightSizes(Glm52());
  ASSERT_TRUE(w.ok()) << w.status();
  // Spec §4: GLM-5.2-FP8 has 755,617,140,416 tensor bytes; the shape-by-shape estimate is exact.
  EXPECT_EQ(w->total_bytes(), 755617140416);
  // embed_tokens [154880, 6144] bf16 = 1,903,165,440; lm_head the same; model.norm 6144 * 2.
  EXPECT_EQ(w->embedding_bytes, 1903165440);
  EXPECT_EQ(w->lm_head_bytes, 1903165440);
  EXPECT_EQ(w->final_norm_bytes, 12288);
  ASSERT_EQ(w->layer_bytes.size(), 79u);
  // Attention block incl. the two layer norms, fp8 with one f32 scale per 128x128 block:
  //   norms 2*6144*2 = 24,576
  //   q_a_proj [2048,6144] 12,582,912 + 16*48*4 = 12,585,984; q_a_layernorm 4,096
  //   q_b_proj [16384,2048] 33,554,432 + 128*16*4 = 33,562,624
  //   kv_a_proj_with_mqa [576,6144] 3,538,944 + 5*48*4 = 3,539,904; kv_a_layernorm 1,024
  //   kv_b_proj [28672,512] 14,680,064 + 224*4*4 = 14,683,648
  //   o_proj [6144,16384] 100,663,296 + 48*128*4 = 100,687,872      => 165,089,728
  // Indexer: wq_b [4096,2048] 8,390,656 + wk [128,6144] 786,624 + k_norm 512
  //   + weights_proj [32,6144] bf16 393,216                         => 9,571,008
  // Dense MLP: gate/up [12288,6144] 75,515,904 each + down 75,515,904 => 226,547,712
  // Layer 0 (dense, full indexer) = 165,089,728 + 9,571,008 + 226,547,712 = 401,208,448.
  EXPECT_EQ(w->layer_bytes[0], 401208448);
  // Expert: 3 * ([2048,6144] 12,582,912 + 16*48*4) = 37,757,952.
  // MoE: router [256,6144] bf16 3,145,728 + bias 256*4 + shared 37,757,952 + 256 experts
  //   9,666,035,712 = 9,706,940,416. Layer 3 is "shared" in GLM-5.2 (no indexer tensors):
  //   165,089,728 + 9,706,940,416 = 9,872,030,144.
  EXPECT_EQ(w->layer_bytes[3], 9872030144);
  // Layer 6 is full: + 9,571,008.
  EXPECT_EQ(w->layer_bytes[6], 9872030144 + 9571008);
  // MTP layer 78: full layer + enorm/hnorm/shared_head.norm 3*6144*2 + eh_proj [6144,12288] bf16
  //   = 165,089,728 + 9,571,008 + 9,706,940,416 + 36,864 + 150,994,944 = 10,032,632,960.
  EXPECT_EQ(w->layer_bytes[78], 10032632960);
}

TEST(WeightEstimate, Glm5HasIndexersOnEveryLayer) {
  auto w = EstimateWeightSizes(Glm5());
  ASSERT_TRUE(w.ok());
  // 57 more indexers than GLM-5.2: 755,617,140,416 + 57 * 9,571,008 = 756,162,687,872.
  EXPECT_EQ(w->total_bytes(), 756162687872);
}

// GLM-5.2-FP8 on 8 Sparks, PP8 with the 1M-context partition, fp8 KV, 0.95 of 112 GiB usable.
TEST(MakePlan, Glm52Pp8HandComputed) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  ASSERT_TRUE(weights.ok());
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.model.max_model_len = 1048576;
  spec.model.kv_cache_memory_fraction = 0.95;
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 7};
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 8u);
  EXPECT_FALSE(plan->partition_proposed);
  EXPECT_EQ(plan->model_kv_bytes_per_token, 53940);
  const auto& s0 = plan->stages[0];
  const auto& s1 = plan->stages[1];
  const auto& s7 = plan->stages[7];
  EXPECT_EQ(s0.first_layer, 0);
  EXPECT_EQ(s0.last_layer, 10);
  EXPECT_TRUE(s0.has_embedding);
  EXPECT_EQ(s1.first_layer, 11);
  EXPECT_EQ(s1.last_layer, 20);
  EXPECT_EQ(s7.first_layer, 71);
  EXPECT_EQ(s7.last_layer, 77);
  EXPECT_TRUE(s7.has_lm_head);
  EXPECT_FALSE(s7.has_mtp);
  // KV per token: stage 0 has full layers 0,1,2,6,10: 11*656 + 5*132 = 7,876.
  EXPECT_EQ(s0.kv_bytes_per_token, 7876);
  // Stage 1 (11..20) has full layers 14, 18: 10*656 + 2*132 = 6,824.
  EXPECT_EQ(s1.kv_bytes_per_token, 6824);
  // Stage 2 (21..30) has 22, 26, 30: 6,956. Stage 7 (71..77) has 74: 7*656 + 132 = 4,724.
  EXPECT_EQ(plan->stages[2].kv_bytes_per_token, 6956);
  EXPECT_EQ(s7.kv_bytes_per_token, 4724);
  int64_t kv_sum = 0;
  for (const auto& s : plan->stages) kv_sum += s.kv_bytes_per_token;
  EXPECT_EQ(kv_sum, 53940);
  // Weights: stage 0 = embedding 1,903,165,440 + layers 0..2 (dense) + 8 MoE layers + indexers.
  EXPECT_EQ(s0.weight_bytes, 82102173952);
  EXPECT_EQ(s1.weight_bytes, 98739443456);  // 10 * 9,872,030,144 + 2 * 9,571,008
  EXPECT_EQ(s7.weight_bytes, 71016959744);  // 7 MoE layers + 1 indexer + lm_head + norm
  // Capacity, stage 1: usable = floor(0.95 * 112 GiB) = 114,246,130,073;
  // reserve = 2 GiB + 8192 * 6144 * 32 = 2,147,483,648 + 1,610,612,736 = 3,758,096,384;
  // KV = 114,246,130,073 - 98,739,443,456 - 3,758,096,384 = 11,748,590,233 B
  //    / 6,824 B/token = 1,721,657 tokens.
  EXPECT_EQ(plan->nodes[1].reserve_bytes, 3758096384);
  EXPECT_EQ(plan->nodes[1].kv_cache_bytes, 11748590233);
  EXPECT_EQ(s1.kv_capacity_tokens, 1721657);
  // Stage 0: (114,246,130,073 - 82,102,173,952 - 3,758,096,384) / 7,876 = 3,604,095.
  EXPECT_EQ(s0.kv_capacity_tokens, 3604095);
  EXPECT_TRUE(plan->fits);
  // The largest context is capped by max_position_embeddings (1,048,576).
  EXPECT_EQ(plan->max_context_tokens, 1048576);
}

TEST(MakePlan, Glm52Tp4DoesNotFitOnSparks) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(4, 1, 1, 112 * kGiB);
  spec.nodes[2].name = "spark-3";
  spec.model.kv_cache_memory_fraction = 1.0;
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  // MTP is off, so layer 78 is not loaded: 755,617,140,416 - 10,032,632,960 = 745,584,507,456 B;
  // per node / 4 = 186,396,126,864 B = 173.59 GiB (shown rounded up: 173.6);
  // + reserve 3.5 GiB - 112 GiB = 65.09 GiB short (rounded up: 65.1).
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("node spark-3 (pp stage 0, layers 0-77) needs 65.1 GiB more: weights "
                        "173.6 GiB + reserve 3.5 GiB > budget 112.0 GiB"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("node n0 "));
}

TEST(MakePlan, FixedKvBytesCountAgainstBudget) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 100 * kGiB);
  spec.model.kv_cache_bytes = 10 * kGiB;
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 7};
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_FALSE(plan.ok());
  // Stage 1: 98,739,443,456 (91.96 GiB) + 3.5 GiB + 10 GiB - 100 GiB = 5.46 GiB short.
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("node n1 (pp stage 1, layers 11-20) needs 5.5 GiB more: weights 92.0 GiB "
                        "+ reserve 3.5 GiB + kv_cache_bytes 10.0 GiB > budget 100.0 GiB"));
  EXPECT_THAT(std::string(plan.status().message()), Not(HasSubstr("node n0 ")));
}

TEST(MakePlan, MtpLayerOnLastStage) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.model.mtp_draft_tokens = 2;
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 7};
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->stages[7].has_mtp);
  // 4,724 + MTP layer 656 + 132 = 5,512; weights + 10,032,632,960.
  EXPECT_EQ(plan->stages[7].kv_bytes_per_token, 5512);
  EXPECT_EQ(plan->stages[7].weight_bytes, 71016959744 + 10032632960);
  EXPECT_EQ(plan->model_kv_bytes_per_token, 53940 + 788);
}

TEST(MakePlan, StatesBackendAndWeightDtype) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 7};
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->backend, cluster::EngineBackend::kAuto);
  EXPECT_EQ(plan->weight_dtype, cluster::WeightDtype::kAuto);
  EXPECT_THAT(PlanToText(*plan),
              HasSubstr("engine: backend auto (cuda where usable, else cpu), weights auto (cuda: "
                        "fp8 stays fp8, else bf16; cpu: fp32)\n"));
  spec.model.backend = cluster::EngineBackend::kCuda;
  plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(PlanToText(*plan),
              HasSubstr("engine: backend cuda, weights auto (fp8 stays fp8, else bf16)\n"));
  spec.model.backend = cluster::EngineBackend::kCuda;
  spec.model.weight_dtype = cluster::WeightDtype::kBf16;
  plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(PlanToText(*plan), HasSubstr("engine: backend cuda, weights bf16\n"));
  nlohmann::json j = PlanToJson(*plan);
  EXPECT_EQ(j["backend"], "cuda");
  EXPECT_EQ(j["weight_dtype"], "bf16");
}

TEST(MakePlan, TensorParallelShardsWeightsNotKv) {
  ModelConfig model = Glm5();
  auto weights = EstimateWeightSizes(model);
  // Two replicas of PP4 x TP2 = 16 ranks on 200 GiB nodes.
  cluster::ClusterSpec spec = Spec(2, 4, 2, 200 * kGiB);
  spec.parallel.layer_partition = {20, 20, 20, 18};
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->nodes.size(), 16u);
  // rank = replica * 8 + pp_rank * 2 + tp_rank.
  EXPECT_EQ(plan->nodes[11].replica, 1);
  EXPECT_EQ(plan->nodes[11].pp_rank, 1);
  EXPECT_EQ(plan->nodes[11].tp_rank, 1);
  EXPECT_EQ(plan->stages[1].nodes, (std::vector<std::string>{"n2", "n3", "n10", "n11"}));
  // Stage 1 = layers 20..39, all MoE + full: 20 * (165,089,728 + 9,571,008 + 9,706,940,416)
  // = 197,632,023,040 B, / TP2 = 98,816,011,520 per node.
  EXPECT_EQ(plan->stages[1].weight_bytes, 98816011520);
  // KV is not sharded by TP: 20 * (656 + 132) = 15,760 B/token on every node of the stage.
  EXPECT_EQ(plan->stages[1].kv_bytes_per_token, 15760);
}

TEST(MakePlan, ProposesBalancedPartition) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.model.max_model_len = 1048576;
  spec.model.kv_cache_memory_fraction = 0.95;
  auto proposed = MakePlan(spec, model, *weights);
  ASSERT_TRUE(proposed.ok()) << proposed.status();
  EXPECT_TRUE(proposed->partition_proposed);
  const auto& parts = proposed->layer_partition;
  ASSERT_EQ(parts.size(), 8u);
  EXPECT_EQ(std::accumulate(parts.begin(), parts.end(), 0), 78);
  EXPECT_LE(*std::max_element(parts.begin(), parts.end()) -
                *std::min_element(parts.begin(), parts.end()),
            3);
  // At least as good as the hand-written 1M partition.
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 7};
  auto given = MakePlan(spec, model, *weights);
  ASSERT_TRUE(given.ok());
  int64_t proposed_min = INT64_MAX;
  int64_t given_min = INT64_MAX;
  for (const auto& s : proposed->stages) proposed_min = std::min(proposed_min, s.kv_capacity_tokens);
  for (const auto& s : given->stages) given_min = std::min(given_min, s.kv_capacity_tokens);
  EXPECT_GE(proposed_min, given_min);
}

TEST(MakePlan, SmallNodeGetsFewerLayers) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.nodes[3].memory_budget_bytes = 90 * kGiB;
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& parts = plan->layer_partition;
  EXPECT_LT(parts[3], parts[2]);
  EXPECT_LT(parts[3], parts[4]);
}

TEST(MakePlan, InputErrorsNameTheField) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 10};
  spec.parallel.layer_partition_location = {12, 20};
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("test.yaml:12:20: field `parallel.layer_partition`: sums to 81 layers but "
                        "the model has num_hidden_layers = 78"));

  spec = Spec(3, 1, 1, 112 * kGiB);
  plan = MakePlan(spec, model, *weights);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("`parallel.tensor`: 3 does not divide"));

  spec = Spec(1, 8, 1, 112 * kGiB);
  spec.model.max_model_len = 2000000;
  spec.model.max_model_len_location = {4, 18};
  plan = MakePlan(spec, model, *weights);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("test.yaml:4:18: field `model.max_model_len`: 2,000,000 is longer than the "
                        "model's max_position_embeddings 1,048,576"));

  spec = Spec(1, 8, 1, 112 * kGiB);
  spec.nodes[5].memory_budget_bytes.reset();
  plan = MakePlan(spec, model, *weights);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("`nodes[5].memory_budget_bytes`"));

  engine::ModelConfig no_mtp = model;
  no_mtp.num_nextn_predict_layers = 0;
  spec = Spec(1, 8, 1, 112 * kGiB);
  spec.model.mtp_draft_tokens = 1;
  plan = MakePlan(spec, no_mtp, *weights);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("`model.mtp_draft_tokens`"));
}

TEST(MakePlan, ContextThatDoesNotFitIsRefused) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 7};
  // 2 GiB = 2,147,483,648 B of KV per node: stage 0 (7,876 B/token) holds 272,661 tokens,
  // stage 2 (6,956 B/token) 308,723.
  spec.model.kv_cache_bytes = 2 * kGiB;
  spec.model.max_model_len = 400000;
  spec.model.max_model_len_location = {4, 18};
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("test.yaml:4:18: field `model.max_model_len`: 400,000 tokens do not fit"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("node n0 (pp stage 0) holds 272,661 tokens of KV (7,876 B/token)"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("node n2 (pp stage 2) holds 308,723 tokens"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("expected max_model_len <= 272,661"));
}

TEST(MakePlan, ConcurrencyShortfallIsReportedNotRefused) {
  ModelConfig model = Glm52();
  auto weights = EstimateWeightSizes(model);
  cluster::ClusterSpec spec = Spec(1, 8, 1, 112 * kGiB);
  spec.parallel.layer_partition = {11, 10, 10, 10, 10, 10, 10, 7};
  spec.model.kv_cache_bytes = 2 * kGiB;
  spec.model.max_model_len = 200000;
  spec.model.max_num_seqs = 2;  // 400,000 > 272,661 (stage 0)
  auto plan = MakePlan(spec, model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits);
  EXPECT_EQ(plan->max_context_tokens, 272661);
  ASSERT_FALSE(plan->notes.empty());
  EXPECT_THAT(plan->notes[0], HasSubstr("at most 1 full-length sequences"));
  nlohmann::json j = PlanToJson(*plan);
  EXPECT_EQ(j["fits"], false);
  EXPECT_EQ(j["max_context_tokens"], 272661);
  ASSERT_EQ(j["stages"].size(), 8u);
  EXPECT_EQ(j["stages"][2]["pp_rank"], 2);
  EXPECT_EQ(j["stages"][2]["first_layer"], 21);
  EXPECT_EQ(j["stages"][2]["last_layer"], 30);
  EXPECT_EQ(j["stages"][2]["nodes"], nlohmann::json::array({"n2"}));
  EXPECT_EQ(j["stages"][2]["kv_bytes_per_token"], 6956);
  EXPECT_EQ(j["stages"][2]["kv_capacity_tokens"], 308723);
  EXPECT_EQ(j["stages"][2]["weight_bytes"], 98749014464);
  std::string text = PlanToText(*plan);
  EXPECT_THAT(text, HasSubstr("does NOT fit"));
  EXPECT_THAT(text, HasSubstr("21-30"));
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("plan_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

void WriteSafetensors(const std::filesystem::path& path, const std::string& header) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
}

TEST(LoadWeightSizes, ReadsSafetensorsHeaders) {
  TempDir dir;
  ModelConfig model = Glm52();
  WriteSafetensors(dir.path() / "model-00001.safetensors",
                   R"({"__metadata__":{"format":"pt"},)"
                   R"("model.embed_tokens.weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,100]},)"
                   R"("model.layers.3.mlp.gate.weight":{"dtype":"BF16","shape":[1],"data_offsets":[100,130]},)"
                   R"("model.layers.3.mlp.experts.7.down_proj.weight":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[130,135]},)"
                   R"("model.layers.3.mlp.shared_experts.up_proj.weight":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[135,138]}})");
  WriteSafetensors(dir.path() / "model-00002.safetensors",
                   R"({"model.layers.3.self_attn.o_proj.weight":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,7]},)"
                   R"("model.layers.78.eh_proj.weight":{"dtype":"BF16","shape":[1],"data_offsets":[7,20]},)"
                   R"("lm_head.weight":{"dtype":"BF16","shape":[1],"data_offsets":[20,70]},)"
                   R"("model.norm.weight":{"dtype":"BF16","shape":[1],"data_offsets":[70,72]}})");
  auto w = LoadWeightSizes(dir.path().string(), model);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->source, WeightSizes::Source::kSafetensorsHeaders);
  EXPECT_EQ(w->embedding_bytes, 100);
  EXPECT_EQ(w->layer_bytes[3], 45);
  EXPECT_EQ(w->routed_expert_bytes[3], 5);  // mlp.experts.*, not mlp.shared_experts.*
  EXPECT_EQ(w->routed_expert_bytes[78], 0);
  EXPECT_EQ(w->layer_bytes[78], 13);
  EXPECT_EQ(w->lm_head_bytes, 50);
  EXPECT_EQ(w->final_norm_bytes, 2);
  EXPECT_EQ(w->total_bytes(), 210);
}

TEST(LoadWeightSizes, RejectsLfsPointer) {
  TempDir dir;
  std::ofstream(dir.path() / "model.safetensors") << "version https://git-lfs.github.com/spec/v1\n";
  auto w = LoadWeightSizes(dir.path().string(), Glm52());
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("Git LFS pointer"));
}

TEST(LoadWeightSizes, ScalesEstimateToIndexTotal) {
  TempDir dir;
  ModelConfig model = Glm52();
  std::ofstream(dir.path() / "model.safetensors.index.json")
      << R"({"metadata":{"total_size":1511234280832},"weight_map":{}})";  // 2x the estimate
  auto w = LoadWeightSizes(dir.path().string(), model);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->source, WeightSizes::Source::kIndexTotal);
  EXPECT_EQ(w->total_bytes(), 1511234280832);
  EXPECT_EQ(w->embedding_bytes, int64_t{2} * 1903165440);
  auto estimate = EstimateWeightSizes(model);
  ASSERT_TRUE(estimate.ok());
  ASSERT_EQ(w->routed_expert_bytes.size(), w->layer_bytes.size());
  EXPECT_EQ(w->routed_expert_bytes[3], 2 * estimate->routed_expert_bytes[3]);
}

TEST(PlanFromFiles, ResolvesModelRelativeToYaml) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "clusters");
  std::filesystem::create_directories(dir.path() / "model");
  std::filesystem::copy_file(SourceDir() + "/configs/models/glm-5.2-fp8/config.json",
                             dir.path() / "model" / "config.json");
  std::ofstream(dir.path() / "clusters" / "c.yaml")
      << "name: c\nmodel: {path: ../model, max_model_len: 100000, kv_cache_memory_fraction: 0.95}\n"
         "parallel: {pipeline: 8}\nnode_defaults: {memory_budget_bytes: 112GiB}\nnodes:\n"
      << [] {
           std::string s;
           for (int i = 0; i < 8; ++i) {
             s += "  - {name: s" + std::to_string(i) + ", agent: 10.0.0." +
                  std::to_string(i + 1) + ":1}\n";
           }
           return s;
         }();
  auto plan = PlanFromFiles((dir.path() / "clusters" / "c.yaml").string());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->fits);
  EXPECT_TRUE(plan->partition_proposed);
  EXPECT_EQ(plan->stages.back().last_layer, 77);

  std::ofstream(dir.path() / "clusters" / "bad.yaml")
      << "name: c\nmodel: {path: ../nowhere, max_model_len: 10}\nnodes:\n  - {name: a, agent: x:1}\n";
  auto bad = PlanFromFiles((dir.path() / "clusters" / "bad.yaml").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.yaml:2:8: model.path ../nowhere"));
  EXPECT_THAT(bad.status().message(), HasSubstr("nowhere/config.json: cannot open"));
}

}  // namespace
}  // namespace glm::controller
