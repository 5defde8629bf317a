// The Load phase against fake agents: each node's request (layers, grid position, KV bytes,
// page-cache policy, MTP on the last stage only), byte progress forwarded into the Up stream,
// the shard status recorded in ClusterState, a failure naming node and message, the machine
// passing Stage -> Load -> Ready, and StopShards for `down`.
#include "controller/orchestrate/load_step.h"

#include <mutex>

#include "controller/orchestrate/stage_step.h"
#include "controller/orchestrate/steps.h"
#include "controller/orchestrate/testing/fake_agent_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// LoadShard streams three byte-progress messages, then (unless `error` is set, which ends the
// stream instead) the Loaded shard status; StopShard says what it freed.
void ScriptShard(FakeAgentClient& agent, absl::Status error = absl::OkStatus()) {
  agent.load_shard.progress.clear();
  for (int64_t done : {0, 600, 1200}) {
    agent.load_shard.progress.push_back(
        BytesProgress("load", "load: model.layers.1.mlp.down_proj.weight", done, 1200));
  }
  agent.load_shard.status = error;
  if (error.ok()) {
    glm::v1::Progress last = BytesProgress("done", "loaded layers 0-1 in 0.10 s", 1200, 1200);
    last.set_done(true);
    glm::v1::ShardStatus* shard = last.mutable_shard();
    shard->set_state(glm::v1::SHARD_STATE_LOADED);
    shard->set_bytes_loaded(1200);
    shard->set_load_time_ms(100);
    shard->mutable_page_cache()->set_fadvise_bytes_freed(4096);
    agent.load_shard.progress.push_back(last);
  }
  glm::v1::Progress stopped;
  stopped.set_message("stopped: freed layers 0-1");
  stopped.set_done(true);
  agent.stop_shard.progress = {stopped};
}

class LoadStepTest : public ::testing::Test {
 protected:
  LoadStepTest()
      : state_(&clock_), ctx_(&state_, [this](const glm::v1::UpEvent& e) {
          std::lock_guard<std::mutex> lock(mu_);
          events_.push_back(e);
        }) {
    ctx_.topology.cluster_name = "t";
    ctx_.topology.model_dir = "/models/tiny";
    ctx_.topology.tensor = 2;
    ctx_.topology.pipeline = 2;
    ctx_.topology.mtp = true;
    ctx_.topology.mtp_draft_tokens = 3;
    ctx_.topology.page_cache = {"adaptive", 15.0, int64_t{8} << 30};
    // TP2 x PP2: n1, n2 hold layers 0-1 (tp 0, 1); n3, n4 layers 2-3.
    for (int i = 0; i < 4; ++i) {
      NodeEndpoint n{"n" + std::to_string(i + 1), "127.0.0.1:" + std::to_string(i + 1)};
      n.pp_rank = i / 2;
      n.tp_rank = i % 2;
      n.layer_begin = i < 2 ? 0 : 2;
      n.layer_end = i < 2 ? 2 : 4;
      n.first_stage = i < 2;
      n.last_stage = i >= 2;
      n.kv_cache_bytes = (int64_t{1} << 30) * (i + 1);
      ctx_.topology.nodes.push_back(n);
      std::shared_ptr<FakeAgentClient> a = factory_.Add(n.name);
      ScriptShard(*a);
      ctx_.agents[n.name] = a;
    }
    state_.Reset(ctx_.topology);
  }

  FakeClock clock_;
  ClusterState state_;
  std::mutex mu_;
  std::vector<glm::v1::UpEvent> events_;
  BringUpContext ctx_;
  FakeAgentClientFactory factory_;
};

TEST_F(LoadStepTest, LoadsEveryNodeWithItsStageAndForwardsProgress) {
  LoadStep step;
  ASSERT_TRUE(step.Run(ctx_).ok());
  for (int i = 0; i < 4; ++i) {
    const auto& a = factory_.agents["n" + std::to_string(i + 1)];
    SCOPED_TRACE(a->node);
    EXPECT_EQ(a->CallCount("LoadShard"), 1);
    const glm::v1::LoadShardRequest r = a->last_load_shard();
    EXPECT_EQ(r.model_dir(), "/models/tiny");
    EXPECT_EQ(r.layer_begin(), i < 2 ? 0 : 2);
    EXPECT_EQ(r.layer_end(), i < 2 ? 2 : 4);  // half-open
    EXPECT_EQ(r.shard().pp_rank(), i / 2);
    EXPECT_EQ(r.shard().tp_rank(), i % 2);
    EXPECT_EQ(r.tp_size(), 2);
    EXPECT_EQ(r.pp_size(), 2);
    EXPECT_EQ(r.kv_cache_bytes(), (int64_t{1} << 30) * (i + 1));
    EXPECT_EQ(r.load_mtp(), i >= 2);  // the MTP layer lives on the last stage
    EXPECT_EQ(r.mtp_draft_tokens(), 3);  // every rank runs the head's k
    EXPECT_EQ(r.page_cache().policy(), "adaptive");
    EXPECT_EQ(r.page_cache().interval_s(), 15.0);
    EXPECT_EQ(r.page_cache().min_available_bytes(), int64_t{8} << 30);
  }
  // Byte progress per node in the Load phase, then the agent's shard status in ClusterState.
  int with_bytes = 0;
  for (const auto& e : events_) {
    EXPECT_EQ(e.phase(), glm::v1::BRING_UP_PHASE_LOAD);
    if (e.has_progress()) {
      ++with_bytes;
      EXPECT_EQ(e.progress().total_bytes(), 1200);
      EXPECT_FALSE(e.progress().has_shard());
    }
  }
  EXPECT_EQ(with_bytes, 4 * 4);
  const glm::v1::ClusterStatus snapshot = state_.Snapshot();
  ASSERT_EQ(snapshot.nodes_size(), 4);
  for (const auto& n : snapshot.nodes()) {
    EXPECT_EQ(n.shard_state(), glm::v1::SHARD_STATE_LOADED) << n.name();
    EXPECT_EQ(n.shard().bytes_loaded(), 1200);
    EXPECT_EQ(n.shard().load_time_ms(), 100);
    EXPECT_EQ(n.shard().page_cache().fadvise_bytes_freed(), 4096);
  }
  // Then every rank was started once (after every load).
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(factory_.agents["n" + std::to_string(i + 1)]->CallCount("StartShard"), 1);
  }
}

TEST_F(LoadStepTest, RequestCarriesThePlansBackendAndWeightDtype) {
  // Unset (the topology's "auto"): empty fields, the agent's choice.
  absl::StatusOr<glm::v1::LoadShardRequest> r =
      BuildLoadShardRequest(ctx_.topology, ctx_.topology.nodes[0]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend(), "");
  EXPECT_EQ(r->weight_dtype(), "");
  EXPECT_EQ(r->max_steps_in_flight(), 0);  // parallel.micro_batches unset: pp_size
  ctx_.topology.micro_batches = 1;
  r = BuildLoadShardRequest(ctx_.topology, ctx_.topology.nodes[0]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_steps_in_flight(), 1);
  EXPECT_EQ(r->gpu(), 0);  // nodes[].gpu unset: the first GPU
  ctx_.topology.nodes[2].gpu = 3;
  r = BuildLoadShardRequest(ctx_.topology, ctx_.topology.nodes[2]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->gpu(), 3);
  ctx_.topology.backend = "cuda";
  ctx_.topology.weight_dtype = "bf16";
  ctx_.topology.kv_dtype = "fp8";
  LoadStep step;
  ASSERT_TRUE(step.Run(ctx_).ok());
  for (const auto& [name, agent] : factory_.agents) {
    SCOPED_TRACE(name);
    const glm::v1::LoadShardRequest sent = agent->last_load_shard();
    EXPECT_EQ(sent.backend(), "cuda");
    EXPECT_EQ(sent.weight_dtype(), "bf16");
    EXPECT_EQ(sent.kv_dtype(), "fp8");
  }
  ctx_.topology.backend = "cpu";
  ctx_.topology.weight_dtype = "fp32";
  r = BuildLoadShardRequest(ctx_.topology, ctx_.topology.nodes[3]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend(), "cpu");
  EXPECT_EQ(r->weight_dtype(), "fp32");
}

TEST_F(LoadStepTest, AFailedLoadStartsNothingAndAFailedStartNamesTheNode) {
  ScriptShard(*factory_.agents["n2"], absl::DataLossError("bad file"));
  LoadStep step;
  EXPECT_FALSE(step.Run(ctx_).ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(factory_.agents["n" + std::to_string(i + 1)]->CallCount("StartShard"), 0);
  }
  ScriptShard(*factory_.agents["n2"]);
  factory_.agents["n4"]->start_shard.status = absl::DeadlineExceededError(
      "StartShard on node 'n4': world rank 3 (pp 1, tp 1) of group replica-0/epoch-1 could not "
      "start: rendezvous key did not appear");
  absl::Status s = step.Run(ctx_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node n4: starting its shard (replica 0, pp 1, tp 1) failed"),
                    HasSubstr("rendezvous key did not appear")));
  EXPECT_EQ(state_.node_state("n4"), glm::v1::NODE_STATE_FAILED);
}

TEST_F(LoadStepTest, AFailureNamesNodeAndMessageAndMarksTheNodeFailed) {
  ScriptShard(*factory_.agents["n3"],
              absl::DataLossError("LoadShard on node 'n3': /models/tiny/model-00002.safetensors: "
                                  "header is corrupt. Fix: re-stage"));
  LoadStep step;
  absl::Status s = step.Run(ctx_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node n3: loading its shard (layers [2, 4)) failed"),
                    HasSubstr("model-00002.safetensors"), HasSubstr("Fix: re-stage")));
  EXPECT_EQ(state_.node_state("n3"), glm::v1::NODE_STATE_FAILED);
  EXPECT_EQ(factory_.agents["n1"]->CallCount("LoadShard"), 1);  // the others loaded in parallel
}

TEST_F(LoadStepTest, ANodeWithoutLayersOrClientFails) {
  ctx_.topology.nodes[1].layer_end = 0;
  ctx_.agents.erase("n4");
  LoadStep step;
  absl::Status s = step.Run(ctx_);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node n2: the plan assigned it no decoder layers"),
                    HasSubstr("node n4: not connected")));
  EXPECT_EQ(factory_.agents["n2"]->CallCount("LoadShard"), 0);
}

// A step that does nothing, for the phases before Stage.
struct NopStep : BringUpStep {
  explicit NopStep(Phase p) : p_(p) {}
  Phase phase() const override { return p_; }
  absl::Status Run(BringUpContext&) override { return absl::OkStatus(); }
  Phase p_;
};

TEST_F(LoadStepTest, MachinePassesStageThenLoadThenReady) {
  std::vector<std::pair<Phase, Phase>> seen;
  std::vector<std::unique_ptr<BringUpStep>> steps;
  for (Phase p : {Phase::kValidate, Phase::kConnect, Phase::kPreflight, Phase::kPlan}) {
    steps.push_back(std::make_unique<NopStep>(p));
  }
  steps.push_back(std::make_unique<StageStep>());
  steps.push_back(std::make_unique<LoadStep>());
  auto m = BringUpMachine::Create(
      std::move(steps),
      [&](Phase from, Phase to, const std::string&) { seen.emplace_back(from, to); });
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->Run(ctx_).ok());
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(seen[seen.size() - 2], std::make_pair(Phase::kStage, Phase::kLoad));
  EXPECT_EQ(seen.back(), std::make_pair(Phase::kLoad, Phase::kReady));

  ScriptShard(*factory_.agents["n2"],
              absl::ResourceExhaustedError("not enough memory for the plan"));
  absl::Status s = (*m)->Run(ctx_);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ((*m)->phase(), Phase::kFailed);
  EXPECT_EQ(seen.back(), std::make_pair(Phase::kLoad, Phase::kFailed));
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("load failed"), HasSubstr("node n2"),
                                              HasSubstr("not enough memory for the plan")));
}

TEST_F(LoadStepTest, StopShardsStopsEveryReachableNode) {
  factory_.agents.erase("n4");
  int stopped = 0;
  std::vector<std::string> lines =
      StopShards(ctx_.topology, &factory_, std::chrono::seconds(1), &stopped);
  EXPECT_EQ(stopped, 3);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "n1: stopped: freed layers 0-1");
  EXPECT_EQ(lines[3], "n4: agent 'n4' is unreachable");
  for (const auto& [name, a] : factory_.agents) EXPECT_EQ(a->CallCount("StopShard"), 1) << name;
}

}  // namespace
}  // namespace glm::orchestrate
