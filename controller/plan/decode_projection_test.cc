#include "controller/plan/decode_projection.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "controller/plan/plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::controller {
namespace {

using engine::ModelConfig;
using ::testing::HasSubstr;

std::string SourceDir() {
  const char* dir = std::getenv("GLM_SOURCE_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return GLM_TEST_SOURCE_DIR;
}

// A toy model for hand-computed cases: 2 decoder layers + 1 MTP layer of 1 GB each, 0.8 GB of it
// in 8 routed experts of which a token uses 2 (active layer bytes 0.2 + 0.8 × 2/8 = 0.4 GB),
// lm_head 0.2 GB, hidden 1000 (4,000 B of fp32 activations per token).
struct Toy {
  ModelConfig model;
  WeightSizes weights;
  cluster::ClusterSpec spec;
  Plan plan;
};

Toy MakeToy(int tp, int pp, int mtp_draft_tokens) {
  Toy t;
  t.model.hidden_size = 1000;
  t.model.num_hidden_layers = 2;
  t.model.n_routed_experts = 8;
  t.model.num_experts_per_tok = 2;
  t.model.num_nextn_predict_layers = 1;
  t.weights.layer_bytes = {1'000'000'000, 1'000'000'000, 1'000'000'000};
  t.weights.routed_expert_bytes = {800'000'000, 800'000'000, 800'000'000};
  t.weights.lm_head_bytes = 200'000'000;
  t.spec.model.mtp_draft_tokens = mtp_draft_tokens;
  t.spec.parallel.tensor = tp;
  t.spec.parallel.pipeline = pp;
  for (int i = 0; i < tp * pp; ++i) {
    cluster::NodeSpec node;
    node.name = "n" + std::to_string(i);
    node.memory_bandwidth_bytes_per_s = 100e9;
    node.memory_bandwidth_efficiency = 0.5;  // 50 GB/s effective
    t.spec.nodes.push_back(node);
  }
  t.spec.fabric.link_bandwidth_bytes_per_s = 25e9;
  t.spec.fabric.hop_latency_us = 10;
  t.plan.tensor = tp;
  t.plan.pipeline = pp;
  t.plan.replicas = 1;
  t.plan.world_size = tp * pp;
  t.plan.mtp = mtp_draft_tokens > 0;
  t.plan.nodes.resize(tp * pp);
  for (int s = 0; s < pp; ++s) {
    PlanStage stage;
    stage.pp_rank = s;
    stage.first_layer = pp == 1 ? 0 : s;
    stage.last_layer = pp == 1 ? 1 : s;
    stage.has_embedding = s == 0;
    stage.has_lm_head = s == pp - 1;
    stage.has_mtp = s == pp - 1 && t.plan.mtp;
    t.plan.stages.push_back(stage);
  }
  return t;
}

// `acceptance_rate`: accepted / drafted (--mtp-acceptance).
DecodeProjection Project(const Toy& t, std::optional<double> acceptance_rate = std::nullopt) {
  DecodeProjectionOptions options;
  options.mtp_acceptance_rate = acceptance_rate;
  auto d = ProjectDecode(t.plan, t.spec, t.model, t.weights, options);
  EXPECT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->made) << d->not_made;
  return *d;
}

TEST(DecodeProjection, OneStageIsBytesOverEffectiveBandwidth) {
  DecodeProjection d = Project(MakeToy(1, 1, 0));
  ASSERT_EQ(d.replicas.size(), 1u);
  const DecodeReplicaProjection& r = d.replicas[0];
  ASSERT_EQ(r.stages.size(), 1u);
  // 2 × 0.4 GB + 0.2 GB lm_head = 1.0 GB at 100 GB/s × 0.5 = 20 ms; one rank: no messages.
  EXPECT_EQ(r.stages[0].bytes_per_token, 1'000'000'000);
  EXPECT_DOUBLE_EQ(r.stages[0].seconds, 0.020);
  EXPECT_EQ(r.allreduces_per_token, 0);
  EXPECT_EQ(r.hops_per_token, 0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 0.020);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 50.0);
  EXPECT_FALSE(d.link_bandwidth_assumed);
  EXPECT_FALSE(d.hop_latency_assumed);
}

TEST(DecodeProjection, TwoStagesAddOneHandOffPlusBroadcastAndResult) {
  DecodeProjection d = Project(MakeToy(1, 2, 0));
  const DecodeReplicaProjection& r = d.replicas[0];
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].bytes_per_token, 400'000'000);  // layer 0
  EXPECT_EQ(r.stages[1].bytes_per_token, 600'000'000);  // layer 1 + lm_head
  // Broadcast (10 µs) + hand-off (10 µs + 4,000 B / 25 GB/s = 0.16 µs) + result (10 µs).
  EXPECT_EQ(r.hops_per_token, 3);
  EXPECT_NEAR(r.hop_seconds, 30.16e-6, 1e-12);
  EXPECT_NEAR(r.step_seconds, 0.020 + 30.16e-6, 1e-12);
  // Compared with one stage, the only addition is the hops.
  EXPECT_NEAR(r.step_seconds - Project(MakeToy(1, 1, 0)).replicas[0].step_seconds, 30.16e-6, 1e-12);
}

TEST(DecodeProjection, MicroBatchesOverlapTheStagesUpToTheBusiestOne) {
  Toy t = MakeToy(1, 2, 0);
  DecodeProjection d = Project(t);
  const DecodeReplicaProjection& r = d.replicas[0];
  // Default: pipeline (2) steps in flight. Stage 1 (layer 1 + lm_head, 12 ms) is the busiest;
  // two sequences need 2 × 12 ms > one step (20.03 ms) per pair of tokens.
  EXPECT_EQ(r.micro_batches, 2);
  EXPECT_EQ(r.busiest_stage, 1);
  EXPECT_DOUBLE_EQ(r.busiest_stage_seconds, 0.012);
  EXPECT_NEAR(r.pipelined_tokens_per_s, 2 / 0.024, 1e-9);
  EXPECT_GT(r.pipelined_tokens_per_s, 1.6 * r.tokens_per_s);
  // One step at a time, or one sequence at most: the single-sequence rate.
  t.spec.parallel.micro_batches = 1;
  const DecodeReplicaProjection one = Project(t).replicas[0];
  EXPECT_EQ(one.micro_batches, 1);
  EXPECT_DOUBLE_EQ(one.pipelined_tokens_per_s, one.tokens_per_s);
  t.spec.parallel.micro_batches = 0;
  t.spec.model.max_num_seqs = 1;
  EXPECT_EQ(Project(t).replicas[0].micro_batches, 1);
  // No pipeline: nothing to overlap.
  const DecodeReplicaProjection flat = Project(MakeToy(1, 1, 0)).replicas[0];
  EXPECT_EQ(flat.micro_batches, 1);
  EXPECT_DOUBLE_EQ(flat.pipelined_tokens_per_s, flat.tokens_per_s);
  // TP all-reduces keep a stage busy too (2 per layer).
  const DecodeReplicaProjection tp = Project(MakeToy(2, 2, 0)).replicas[0];
  EXPECT_NEAR(tp.busiest_stage_seconds, tp.stages[1].seconds + 2 * tp.allreduce_seconds, 1e-12);
}

TEST(DecodeProjection, AStageStartingOnASharedIndexerLayerAlsoReceivesTheTopK) {
  Toy t = MakeToy(1, 2, 0);
  t.model.index_topk = 1000;  // 4,000 B of int32 top-k per token
  t.model.indexer_types = {engine::IndexerType::kFull, engine::IndexerType::kShared};
  const DecodeProjection d = Project(t);
  EXPECT_EQ(d.topk_bytes_per_token, 4000);
  EXPECT_EQ(d.shared_indexer_boundaries, 1);
  // The hand-off carries 4,000 B of activations + 4,000 B of top-k: 0.32 µs at 25 GB/s.
  EXPECT_EQ(d.replicas[0].hops_per_token, 3);
  EXPECT_NEAR(d.replicas[0].hop_seconds, 30.32e-6, 1e-12);
  t.model.indexer_types = {engine::IndexerType::kFull, engine::IndexerType::kFull};
  EXPECT_EQ(Project(t).shared_indexer_boundaries, 0);
  EXPECT_NEAR(Project(t).replicas[0].hop_seconds, 30.16e-6, 1e-12);
}

TEST(DecodeProjection, TensorParallelHalvesBytesAndAddsAllReduces) {
  DecodeProjection d = Project(MakeToy(2, 1, 0));
  const DecodeReplicaProjection& r = d.replicas[0];
  EXPECT_EQ(r.stages[0].bytes_per_token, 500'000'000);  // 1.0 GB / 2
  // 2 per layer × 2 layers; ring of 2: 2 × 1 × (10 µs + 4,000 B / 2 / 25 GB/s = 0.08 µs).
  EXPECT_EQ(r.allreduces_per_token, 4);
  EXPECT_NEAR(r.allreduce_seconds, 20.16e-6, 1e-12);
  EXPECT_EQ(r.hops_per_token, 1);  // the head's broadcast
  EXPECT_NEAR(r.step_seconds, 0.010 + 4 * 20.16e-6 + 10e-6, 1e-12);
}

TEST(DecodeProjection, MtpWithZeroAcceptanceOnlyPaysTheDrafts) {
  const Toy t = MakeToy(1, 1, 2);
  DecodeProjection none = Project(MakeToy(1, 1, 0));
  DecodeProjection d = Project(t, 0.0);
  const DecodeReplicaProjection& r = d.replicas[0];
  EXPECT_EQ(d.mtp_draft_tokens, 2);
  EXPECT_FALSE(d.mtp_acceptance_assumed);
  EXPECT_DOUBLE_EQ(r.tokens_per_step, 1.0);
  // A draft pass: MTP layer 0.4 GB + lm_head 0.2 GB at 50 GB/s = 12 ms.
  EXPECT_EQ(r.stages[0].mtp_bytes_per_pass, 600'000'000);
  EXPECT_DOUBLE_EQ(r.mtp_pass_seconds, 0.012);
  EXPECT_DOUBLE_EQ(r.verify_seconds, none.replicas[0].step_seconds);
  EXPECT_DOUBLE_EQ(r.mtp_step_seconds, 0.020 + 2 * 0.012);
  EXPECT_DOUBLE_EQ(1.0 / r.mtp_tokens_per_s, 1.0 / none.replicas[0].tokens_per_s + 2 * 0.012);
  // The k = 0 figure is still given.
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 50.0);
}

TEST(DecodeProjection, MtpWithFullAcceptanceGivesKPlusOneTokensPerStep) {
  DecodeProjection d = Project(MakeToy(1, 1, 2), 1.0);
  const DecodeReplicaProjection& r = d.replicas[0];
  EXPECT_DOUBLE_EQ(r.tokens_per_step, 3.0);
  EXPECT_DOUBLE_EQ(r.mtp_tokens_per_s, 3.0 / 0.044);
  // Uniform routing: 3 tokens touch 8 (1 - (6/8)^3) = 4.625 experts per layer:
  // 0.2 + 0.8 × 4.625 / 8 = 0.6625 GB per layer, + 0.2 GB lm_head.
  EXPECT_NEAR(ExpectedDistinctExperts(8, 2, 3), 4.625, 1e-12);
  EXPECT_EQ(r.stages[0].verify_bytes_uniform, 1'525'000'000);
  EXPECT_DOUBLE_EQ(r.mtp_tokens_per_s_uniform, 3.0 / (1.525 / 50 + 0.024));
  EXPECT_LT(r.mtp_tokens_per_s_uniform, r.mtp_tokens_per_s);
}

TEST(DecodeProjection, AcceptanceDefaultsToTheAssumedValueAndIsValidated) {
  const Toy t = MakeToy(1, 1, 4);
  DecodeProjection d = Project(t);
  EXPECT_TRUE(d.mtp_acceptance_assumed);
  EXPECT_DOUBLE_EQ(d.mtp_acceptance, kAssumedMtpAcceptance);
  // r = (0.7 + 0.49 + 0.343 + 0.2401) / 4 = 0.443275; 1 + 4 r = 2.7731 tokens per step.
  EXPECT_NEAR(d.mtp_acceptance_rate, 0.443275, 1e-12);
  EXPECT_NEAR(d.replicas[0].tokens_per_step, 2.7731, 1e-12);
  DecodeProjectionOptions bad;
  bad.mtp_acceptance_rate = 1.5;
  auto status = ProjectDecode(t.plan, t.spec, t.model, t.weights, bad).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--mtp-acceptance"));
  EXPECT_THAT(status.message(), HasSubstr("expected a number in [0, 1]"));
}

TEST(DecodeProjection, MeasuredRateIsTheShareOfDraftsAccepted) {
  // `glmctl status` counts accepted / drafted: with k = 2 and r = 0.5 a step yields 1 + 2 × 0.5
  // tokens, which per-position a = 0.618 (a + a^2 = 1) also gives.
  DecodeProjection d = Project(MakeToy(1, 1, 2), 0.5);
  EXPECT_DOUBLE_EQ(d.replicas[0].tokens_per_step, 2.0);
  EXPECT_NEAR(d.mtp_acceptance, (std::sqrt(5.0) - 1) / 2, 1e-9);
  EXPECT_NEAR(MtpPerPositionAcceptance(MtpAcceptanceRate(0.7, 4), 4), 0.7, 1e-12);
  EXPECT_DOUBLE_EQ(MtpAcceptanceRate(1.0, 4), 1.0);
  EXPECT_DOUBLE_EQ(MtpAcceptanceRate(0.0, 4), 0.0);
}

TEST(DecodeProjection, Monotone) {
  Toy t = MakeToy(2, 2, 4);
  const DecodeReplicaProjection base = Project(t).replicas[0];
  Toy faster = t;
  for (auto& n : faster.spec.nodes) n.memory_bandwidth_bytes_per_s = 200e9;
  EXPECT_GT(Project(faster).replicas[0].tokens_per_s, base.tokens_per_s);
  Toy slower_hops = t;
  slower_hops.spec.fabric.hop_latency_us = 50;
  EXPECT_LT(Project(slower_hops).replicas[0].tokens_per_s, base.tokens_per_s);
  Toy slower_link = t;
  slower_link.spec.fabric.link_bandwidth_bytes_per_s = 1e9;
  EXPECT_LT(Project(slower_link).replicas[0].tokens_per_s, base.tokens_per_s);
  // One slow node bounds its stage.
  Toy one_slow = t;
  one_slow.spec.nodes[1].memory_bandwidth_efficiency = 0.25;
  const DecodeReplicaProjection slow = Project(one_slow).replicas[0];
  EXPECT_EQ(slow.stages[0].node, "n1");
  EXPECT_FALSE(slow.stages[0].efficiency_measured);
  EXPECT_LT(slow.tokens_per_s, base.tokens_per_s);
  double previous = 0;
  for (double a : {0.0, 0.3, 0.6, 0.9, 1.0}) {
    const double rate = Project(t, a).replicas[0].mtp_tokens_per_s;
    EXPECT_GT(rate, previous) << a;
    previous = rate;
  }
  // More tensor parallelism: fewer bytes per rank.
  EXPECT_GT(Project(MakeToy(2, 1, 0)).replicas[0].tokens_per_s,
            Project(MakeToy(1, 1, 0)).replicas[0].tokens_per_s);
}

TEST(DecodeProjection, DefaultsWhenTheYamlLeavesThemOut) {
  Toy t = MakeToy(2, 1, 0);
  t.spec.fabric = {};
  for (auto& n : t.spec.nodes) n.memory_bandwidth_efficiency.reset();
  DecodeProjection d = Project(t);
  EXPECT_TRUE(d.link_bandwidth_assumed);
  EXPECT_TRUE(d.hop_latency_assumed);
  EXPECT_DOUBLE_EQ(d.link_bandwidth_bytes_per_s, kDefaultLinkBandwidthBytesPerS);
  EXPECT_DOUBLE_EQ(d.hop_latency_us, kDefaultHopLatencyUs);
  EXPECT_TRUE(d.replicas[0].stages[0].efficiency_measured);
  EXPECT_DOUBLE_EQ(d.replicas[0].stages[0].efficiency, kMeasuredDecodeBandwidthEfficiency);
}

TEST(DecodeProjection, NoMemoryBandwidthMeansNoProjectionAndSaysWhatToSet) {
  Toy t = MakeToy(2, 1, 0);
  t.spec.nodes[1].memory_bandwidth_bytes_per_s.reset();
  auto d = ProjectDecode(t.plan, t.spec, t.model, t.weights, {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->made);
  EXPECT_THAT(d->not_made, HasSubstr("n1"));
  EXPECT_THAT(d->not_made, HasSubstr("node_defaults.memory_bandwidth"));
  EXPECT_THAT(d->not_made, HasSubstr("273GB/s"));
  for (auto& n : t.spec.nodes) n.memory_bandwidth_bytes_per_s.reset();
  auto none = ProjectDecode(t.plan, t.spec, t.model, t.weights, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->made);
  EXPECT_THAT(none->not_made, HasSubstr("no node has memory_bandwidth"));
}

TEST(DecodeProjection, RoutedShareFromShapesWhenTheCheckpointDoesNotSay) {
  auto model = engine::LoadModelConfig(SourceDir() + "/configs/models/glm-5.2-fp8");
  ASSERT_TRUE(model.ok()) << model.status();
  auto estimate = EstimateWeightSizes(*model);
  ASSERT_TRUE(estimate.ok());
  // Layer 3 (first MoE layer): the routed experts are most of its bytes, and 8 of 256 are read.
  const int64_t layer = estimate->layer_bytes[3];
  const int64_t routed = estimate->routed_expert_bytes[3];
  EXPECT_GT(routed, layer * 9 / 10);
  EXPECT_EQ(estimate->routed_expert_bytes[0], 0);  // dense layer
}

// GLM-5.2-FP8 (the checked-in config.json) on 4 DGX Sparks, TP4, with a budget that lets the fp8
// checkpoint plan (the real Sparks cannot hold it; the community runs a ~4-bit re-quantization).
// Plausible range without MTP: each rank reads ~10 GB per token (~41 GB of active fp8 weights +
// lm_head, / 4) at 273 GB/s × 0.50, ~75 ms, plus ~10 ms of all-reduces: 8-20 tokens/s.
TEST(DecodeProjection, Glm52OnFourSparksLandsInAPlausibleRange) {
  auto model = engine::LoadModelConfig(SourceDir() + "/configs/models/glm-5.2-fp8");
  ASSERT_TRUE(model.ok()) << model.status();
  auto weights = EstimateWeightSizes(*model);
  ASSERT_TRUE(weights.ok());
  cluster::ClusterSpec spec;
  spec.source = "spark.yaml";
  spec.name = "spark-4x";
  spec.model.path = "m";
  spec.model.max_model_len = 8192;
  spec.model.max_num_seqs = 1;
  spec.model.mtp_draft_tokens = 4;
  spec.parallel.tensor = 4;
  spec.fabric.link_bandwidth_bytes_per_s = 25e9;  // ConnectX-7 200 Gb/s
  for (int i = 0; i < 4; ++i) {
    cluster::NodeSpec node;
    node.name = "spark-" + std::to_string(i + 1);
    node.memory_budget_bytes = int64_t{400} << 30;
    node.memory_bandwidth_bytes_per_s = 273e9;
    spec.nodes.push_back(node);
  }
  auto plan = MakePlan(spec, *model, *weights);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->decode.made) << plan->decode.not_made;
  const DecodeReplicaProjection& r = plan->decode.replicas[0];
  EXPECT_GT(r.stages[0].bytes_per_token, int64_t{8'000'000'000});
  EXPECT_LT(r.stages[0].bytes_per_token, int64_t{12'000'000'000});
  EXPECT_GT(r.tokens_per_s, 8.0);
  EXPECT_LT(r.tokens_per_s, 20.0);
  EXPECT_GT(r.mtp_tokens_per_s, r.tokens_per_s);
  EXPECT_LT(r.mtp_tokens_per_s, 5 * r.tokens_per_s);
  std::printf(
      "GLM-5.2-FP8 on 4x Spark TP4: projected %.1f tok/s without MTP, %.1f with k=4 at assumed "
      "a=%.2f per position (low %.1f); community reports ~13 and ~28.8 with a ~4-bit checkpoint\n",
      r.tokens_per_s, r.mtp_tokens_per_s, plan->decode.mtp_acceptance, r.mtp_tokens_per_s_uniform);
  // Every input is on the page.
  const std::string text = PlanToText(*plan);
  EXPECT_THAT(text, HasSubstr("routed experts read 8 of 256"));
  EXPECT_THAT(text, HasSubstr("10.35 GB"));  // bytes per token per rank
  EXPECT_THAT(text, HasSubstr("273.0 GB/s"));
  EXPECT_THAT(text, HasSubstr("0.500 (measured)"));
  EXPECT_THAT(text, HasSubstr("156 per token"));
  EXPECT_THAT(text, HasSubstr("at 25.0 GB/s"));
  EXPECT_THAT(text, HasSubstr("10.0 µs (assumed; set fabric.hop_latency_us)"));
  EXPECT_THAT(text, HasSubstr("tokens/s without MTP"));
  EXPECT_THAT(text, HasSubstr("MTP k = 4, acceptance r = 0.443 of drafts = per position a 0.700 "
                              "(assumed a;"));
  EXPECT_TRUE(PlanToJson(*plan)["decode_projection"]["made"].get<bool>());
}

}  // namespace
}  // namespace glm::controller
