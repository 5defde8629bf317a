// The Load phase against fake agents: each node's request (layers, grid position, KV bytes,
// page-cache policy, MTP on the last stage only), byte progress forwarded into the Up stream,
// the shard status recorded in ClusterState, a failure naming node and message, the machine
// passing Stage -> Load -> Ready, and StopShards for `down`.
#include "controller/orchestrate/load_step.h"

#include <map>
#include <mutex>

#include "controller/orchestrate/stage_step.h"
#include "controller/orchestrate/steps.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct LoadAgent : AgentClient {
  std::string node;
  absl::Status load_error;  // returned after the progress messages
  std::mutex mu;
  int loads = 0;
  int stops = 0;
  glm::v1::LoadShardRequest request;

  absl::StatusOr<glm::v1::InfoResponse> Info(Clock::Duration) override {
    return absl::UnimplementedError("unused");
  }
  absl::StatusOr<glm::v1::PreflightResponse> Preflight(const glm::v1::PreflightRequest&,
                                                       Clock::Duration) override {
    return absl::UnimplementedError("unused");
  }
  absl::Status StageNccl(const glm::v1::StageNcclRequest&, const ProgressFn&,
                         Clock::Duration) override {
    return absl::OkStatus();
  }
  absl::Status StageWeights(const glm::v1::StageWeightsRequest&, const ProgressFn&,
                            Clock::Duration) override {
    return absl::OkStatus();
  }
  absl::Status LoadShard(const glm::v1::LoadShardRequest& req, const ProgressFn& on_progress,
                         Clock::Duration) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++loads;
      request = req;
    }
    for (int64_t done : {0, 600, 1200}) {
      glm::v1::Progress p;
      p.set_step("load");
      p.set_message("load: model.layers.1.mlp.down_proj.weight");
      p.set_done_bytes(done);
      p.set_total_bytes(1200);
      on_progress(p);
    }
    if (!load_error.ok()) return load_error;
    glm::v1::Progress last;
    last.set_step("done");
    last.set_message("loaded layers 0-1 in 0.10 s");
    last.set_done_bytes(1200);
    last.set_total_bytes(1200);
    last.set_done(true);
    glm::v1::ShardStatus* shard = last.mutable_shard();
    shard->set_state(glm::v1::SHARD_STATE_LOADED);
    shard->set_bytes_loaded(1200);
    shard->set_load_time_ms(100);
    shard->mutable_page_cache()->set_fadvise_bytes_freed(4096);
    on_progress(last);
    return absl::OkStatus();
  }
  absl::Status StopShard(const glm::v1::StopShardRequest&, const ProgressFn& on_progress,
                         Clock::Duration) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stops;
    }
    glm::v1::Progress p;
    p.set_message("stopped: freed layers 0-1");
    p.set_done(true);
    on_progress(p);
    return absl::OkStatus();
  }
};

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
      auto a = std::make_shared<LoadAgent>();
      a->node = n.name;
      agents_[n.name] = a;
      ctx_.agents[n.name] = a;
    }
    state_.Reset(ctx_.topology);
  }

  FakeClock clock_;
  ClusterState state_;
  std::mutex mu_;
  std::vector<glm::v1::UpEvent> events_;
  BringUpContext ctx_;
  std::map<std::string, std::shared_ptr<LoadAgent>> agents_;
};

TEST_F(LoadStepTest, LoadsEveryNodeWithItsStageAndForwardsProgress) {
  LoadStep step;
  ASSERT_TRUE(step.Run(ctx_).ok());
  for (int i = 0; i < 4; ++i) {
    const auto& a = agents_["n" + std::to_string(i + 1)];
    SCOPED_TRACE(a->node);
    EXPECT_EQ(a->loads, 1);
    const glm::v1::LoadShardRequest& r = a->request;
    EXPECT_EQ(r.model_dir(), "/models/tiny");
    EXPECT_EQ(r.first_layer(), i < 2 ? 0 : 2);
    EXPECT_EQ(r.last_layer(), i < 2 ? 1 : 3);  // inclusive
    EXPECT_EQ(r.shard().pp_rank(), i / 2);
    EXPECT_EQ(r.shard().tp_rank(), i % 2);
    EXPECT_EQ(r.tp_size(), 2);
    EXPECT_EQ(r.pp_size(), 2);
    EXPECT_EQ(r.kv_cache_bytes(), (int64_t{1} << 30) * (i + 1));
    EXPECT_EQ(r.load_mtp(), i >= 2);  // the MTP layer lives on the last stage
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
}

TEST_F(LoadStepTest, AFailureNamesNodeAndMessageAndMarksTheNodeFailed) {
  agents_["n3"]->load_error = absl::DataLossError(
      "LoadShard on node 'n3': /models/tiny/model-00002.safetensors: header is corrupt. Fix: "
      "re-stage");
  LoadStep step;
  absl::Status s = step.Run(ctx_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node n3: loading its shard (layers 2-3) failed"),
                    HasSubstr("model-00002.safetensors"), HasSubstr("Fix: re-stage")));
  EXPECT_EQ(state_.node_state("n3"), glm::v1::NODE_STATE_FAILED);
  EXPECT_EQ(agents_["n1"]->loads, 1);  // the others were loaded in parallel
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
  EXPECT_EQ(agents_["n2"]->loads, 0);
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

  agents_["n2"]->load_error = absl::ResourceExhaustedError("not enough memory for the plan");
  absl::Status s = (*m)->Run(ctx_);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ((*m)->phase(), Phase::kFailed);
  EXPECT_EQ(seen.back(), std::make_pair(Phase::kLoad, Phase::kFailed));
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("load failed"), HasSubstr("node n2"),
                                              HasSubstr("not enough memory for the plan")));
}

class FakeFactory : public AgentClientFactory {
 public:
  explicit FakeFactory(std::map<std::string, std::shared_ptr<LoadAgent>>* agents)
      : agents_(agents) {}
  absl::StatusOr<std::shared_ptr<AgentClient>> Create(const NodeEndpoint& node) override {
    auto it = agents_->find(node.name);
    if (it == agents_->end()) return absl::UnavailableError("agent '" + node.name + "' is gone");
    return std::shared_ptr<AgentClient>(it->second);
  }

 private:
  std::map<std::string, std::shared_ptr<LoadAgent>>* agents_;
};

TEST_F(LoadStepTest, StopShardsStopsEveryReachableNode) {
  agents_.erase("n4");
  FakeFactory factory(&agents_);
  int stopped = 0;
  std::vector<std::string> lines =
      StopShards(ctx_.topology, &factory, std::chrono::seconds(1), &stopped);
  EXPECT_EQ(stopped, 3);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "n1: stopped: freed layers 0-1");
  EXPECT_EQ(lines[3], "n4: agent 'n4' is gone");
  for (const auto& [name, a] : agents_) EXPECT_EQ(a->stops, 1) << name;
}

}  // namespace
}  // namespace glm::orchestrate
