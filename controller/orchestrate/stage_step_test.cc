// The Stage phase against fake agents: request contents (shard, peers, manifest), progress
// forwarded into the Up stream, NCCL skipped, a failure naming node, file and fix, and the
// machine passing Plan -> Stage -> Ready (or Failed).
#include "controller/orchestrate/stage_step.h"

#include "controller/orchestrate/steps.h"
#include "controller/orchestrate/testing/fake_agent_client.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

// Every node's agent skips NCCL (none configured) and sends three byte-progress messages while
// staging its weights.
void ScriptStaging(FakeAgentClient& agent) {
  glm::v1::Progress skip;
  skip.set_step("skip");
  skip.set_message("nccl: cluster.yaml names no NCCL library; skipped");
  skip.set_done(true);
  agent.stage_nccl.progress = {skip};
  for (int64_t done : {0, 512, 1024}) {
    agent.stage_weights.progress.push_back(
        BytesProgress("fetch", "weights: model-00002-of-00002.safetensors", done, 1024));
  }
}

class StageStepTest : public ::testing::Test {
 protected:
  StageStepTest() : state_(&clock_), ctx_(&state_, [this](const glm::v1::UpEvent& e) {
                      events_.push_back(e);
                    }) {
    ctx_.topology.cluster_name = "t";
    ctx_.topology.model_dir = "/models/tiny";
    NodeEndpoint n1{"n1", "127.0.0.1:1"};
    n1.layer_begin = 0;
    n1.layer_end = 2;
    n1.first_stage = true;
    n1.last_stage = false;
    NodeEndpoint n2{"n2", "127.0.0.1:2"};
    n2.layer_begin = 2;
    n2.layer_end = 4;
    n2.first_stage = false;
    n2.last_stage = true;
    ctx_.topology.nodes = {n1, n2};
    int port = 7001;
    for (auto& n : ctx_.topology.nodes) {
      std::shared_ptr<FakeAgentClient> a = factory_.Add(n.name);
      ScriptStaging(*a);
      ctx_.agents[n.name] = a;
      glm::v1::InfoResponse info;
      info.set_node(n.name);
      info.set_fabric_ip("127.0.0.1");
      info.set_stage_port(port++);
      ctx_.infos[n.name] = info;
    }
    state_.Reset(ctx_.topology);
  }

  FakeClock clock_;
  ClusterState state_;
  std::vector<glm::v1::UpEvent> events_;
  BringUpContext ctx_;
  FakeAgentClientFactory factory_;
};

TEST_F(StageStepTest, StagesNcclThenWeightsOnEveryNodeAndForwardsByteProgress) {
  StageStep step([](const ClusterTopology&) -> absl::StatusOr<std::string> {
    return std::string("{\"files\":[]}");
  });
  ASSERT_TRUE(step.Run(ctx_).ok());
  for (auto& [name, a] : factory_.agents) {
    EXPECT_EQ(a->calls(), (std::vector<std::string>{"StageNccl", "StageWeights"})) << name;
    const glm::v1::StageWeightsRequest r = a->last_stage_weights();
    EXPECT_EQ(r.model_dir(), "/models/tiny");
    EXPECT_EQ(r.manifest_json(), "{\"files\":[]}");
    EXPECT_TRUE(a->last_stage_nccl().library_path().empty());
    // The other node is the only peer.
    ASSERT_EQ(r.peers_size(), 1) << name;
    EXPECT_NE(r.peers(0).node(), name);
    EXPECT_EQ(r.peers(0).host(), "127.0.0.1");
  }
  const glm::v1::StageWeightsRequest r1 = factory_.agents["n1"]->last_stage_weights();
  const glm::v1::StageWeightsRequest r2 = factory_.agents["n2"]->last_stage_weights();
  EXPECT_EQ(r1.layer_begin(), 0);
  EXPECT_EQ(r1.layer_end(), 2);
  EXPECT_TRUE(r1.first_stage());
  EXPECT_FALSE(r1.last_stage());
  EXPECT_EQ(r2.layer_begin(), 2);
  EXPECT_TRUE(r2.last_stage());
  EXPECT_EQ(r1.peers(0).port(), 7002);

  int byte_events = 0, skip_lines = 0;
  for (const auto& e : events_) {
    EXPECT_EQ(e.phase(), glm::v1::BRING_UP_PHASE_STAGE);
    if (e.has_progress()) {
      ++byte_events;
      EXPECT_EQ(e.progress().total_bytes(), 1024);
    }
    if (e.message().find("names no NCCL library") != std::string::npos) ++skip_lines;
  }
  EXPECT_EQ(byte_events, 6);  // 3 per node
  EXPECT_EQ(skip_lines, 2);
}

TEST_F(StageStepTest, FailureNamesNodeFileAndFix) {
  factory_.agents["n2"]->stage_weights.status = absl::UnavailableError(
      "agent 'n2': no peer could supply model-00002-of-00002.safetensors");
  StageStep step;
  absl::Status s = step.Run(ctx_);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("node n2"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("model-00002-of-00002.safetensors"), absl::string_view::npos);
  EXPECT_NE(s.message().find("Fix:"), absl::string_view::npos);
  EXPECT_EQ(s.message().find("node n1"), absl::string_view::npos);
  EXPECT_EQ(state_.node_state("n2"), glm::v1::NODE_STATE_FAILED);
  EXPECT_TRUE(factory_.agents["n2"]->last_stage_weights().manifest_json().empty());
}

TEST_F(StageStepTest, ManifestErrorStopsBeforeAnyAgentCall) {
  StageStep step([](const ClusterTopology&) -> absl::StatusOr<std::string> {
    return absl::NotFoundError("config.json unreadable");
  });
  absl::Status s = step.Run(ctx_);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/models/tiny"), absl::string_view::npos);
  EXPECT_TRUE(factory_.agents["n1"]->calls().empty());
}

TEST_F(StageStepTest, PeersUseTheFabricStagePortElseTheAgentAddress) {
  ctx_.infos["n1"].set_fabric_ip("192.168.100.1");
  ctx_.infos["n2"].set_stage_port(0);  // serves FetchFile on its agent port only
  auto n1 = StagePeerFor(ctx_.topology.nodes[0], ctx_.infos);
  ASSERT_TRUE(n1.has_value());
  EXPECT_EQ(n1->host(), "192.168.100.1");
  EXPECT_EQ(n1->port(), 7001);
  EXPECT_EQ(n1->tls_name(), "127.0.0.1");  // its certificate names the agent host
  auto n2 = StagePeerFor(ctx_.topology.nodes[1], ctx_.infos);
  ASSERT_TRUE(n2.has_value());
  EXPECT_EQ(n2->host(), "127.0.0.1");
  EXPECT_EQ(n2->port(), 2);
  EXPECT_EQ(n2->tls_name(), "");
}

glm::v1::PreflightResponse NcclResponse(const std::string& path, bool present,
                                        const std::string& hash, const std::string& version,
                                        glm::v1::CheckStatus status, const std::string& message) {
  glm::v1::PreflightResponse r;
  r.set_ok(status != glm::v1::CHECK_STATUS_FAIL);
  auto* c = r.add_checks();
  c->set_id("nccl.version");
  c->set_status(status);
  c->set_message(message);
  auto* n = r.mutable_nccl();
  n->set_path(path);
  n->set_present(present);
  n->set_xxh3_128(hash);
  n->set_size(present ? 4096 : 0);
  n->set_version(version);
  return r;
}

const std::string kLib = "/opt/nccl/libnccl.so.2";
const std::string kHash(32, 'a');
const std::string kMissing =
    kLib + " is missing; will be staged from a node holding the pinned build (hash and version "
           "are verified in the Stage phase)";

TEST_F(StageStepTest, NcclMissingOnANodeIsStagedFromTheHolder) {
  ctx_.topology.nccl_library = kLib;
  ctx_.topology.nccl_expected_version = "2.30.4";
  std::map<std::string, glm::v1::PreflightResponse> responses;
  responses["n1"] = NcclResponse(kLib, true, kHash, "2.30.4", glm::v1::CHECK_STATUS_PASS,
                                 kLib + " is NCCL 2.30.4 as expected");
  responses["n2"] = NcclResponse(kLib, false, "", "", glm::v1::CHECK_STATUS_WARN, kMissing);
  // No copy on the controller's host: n1's copy (loads as 2.30.4) is the pinned build.
  NcclStagePlan plan = ApplyNcclStaging(ctx_.topology, std::nullopt, &responses);
  EXPECT_EQ(plan.expected_hash, kHash);
  EXPECT_EQ(plan.size, 4096u);
  EXPECT_EQ(plan.holders, std::vector<std::string>{"n1"});
  EXPECT_NE(plan.source.find("n1's copy"), std::string::npos);
  const glm::v1::Check& c = responses["n2"].checks(0);
  EXPECT_EQ(c.status(), glm::v1::CHECK_STATUS_WARN);
  EXPECT_NE(c.message().find(kLib + " is missing; will be staged from n1"), std::string::npos)
      << c.message();
  EXPECT_TRUE(responses["n2"].ok());

  // The Stage requests: n2 gets the hash, the size and n1 as its peer; n1 checks in place.
  glm::v1::StageNcclRequest r2 =
      BuildStageNcclRequest(ctx_.topology, ctx_.topology.nodes[1], ctx_.infos, plan);
  EXPECT_EQ(r2.library_path(), kLib);
  EXPECT_EQ(r2.expected_version(), "2.30.4");
  EXPECT_EQ(r2.expected_hash(), kHash);
  EXPECT_EQ(r2.peer_size(), 4096);
  EXPECT_TRUE(r2.peer_path().empty());  // the peer's own library
  ASSERT_EQ(r2.peers_size(), 1);
  EXPECT_EQ(r2.peers(0).node(), "n1");
  EXPECT_EQ(r2.peers(0).port(), 7001);
  glm::v1::StageNcclRequest r1 =
      BuildStageNcclRequest(ctx_.topology, ctx_.topology.nodes[0], ctx_.infos, plan);
  EXPECT_EQ(r1.expected_hash(), kHash);
  EXPECT_EQ(r1.peers_size(), 0);

  // The controller's copy wins when there is one; a node with another build is replaced.
  std::map<std::string, glm::v1::PreflightResponse> again;
  again["n1"] = NcclResponse(kLib, true, kHash, "2.30.4", glm::v1::CHECK_STATUS_PASS, "ok");
  again["n2"] = NcclResponse(kLib, true, std::string(32, 'b'), "2.30.4",
                             glm::v1::CHECK_STATUS_PASS, "ok");
  plan = ApplyNcclStaging(ctx_.topology, NcclSourceFile{"/srv/libnccl.so.2", kHash, 4096}, &again);
  EXPECT_NE(plan.source.find("the controller's copy /srv/libnccl.so.2"), std::string::npos);
  EXPECT_EQ(plan.holders, std::vector<std::string>{"n1"});
  EXPECT_EQ(again["n2"].checks(0).status(), glm::v1::CHECK_STATUS_WARN);
  EXPECT_NE(again["n2"].checks(0).message().find("differs from the pinned build"),
            std::string::npos);
}

TEST_F(StageStepTest, NcclNobodyHoldsFailsAndAWrongPinnedBuildFailsNamingBothVersions) {
  ctx_.topology.nccl_library = kLib;
  ctx_.topology.nccl_expected_version = "2.30.4";
  std::map<std::string, glm::v1::PreflightResponse> responses;
  responses["n1"] = NcclResponse(kLib, false, "", "", glm::v1::CHECK_STATUS_WARN, kMissing);
  responses["n2"] = NcclResponse(kLib, false, "", "", glm::v1::CHECK_STATUS_WARN, kMissing);
  NcclStagePlan plan = ApplyNcclStaging(ctx_.topology, std::nullopt, &responses);
  EXPECT_TRUE(plan.expected_hash.empty());
  for (const auto& [name, r] : responses) {
    EXPECT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.checks(0).status(), glm::v1::CHECK_STATUS_FAIL);
    EXPECT_NE(r.checks(0).message().find("no node holds the pinned build"), std::string::npos)
        << r.checks(0).message();
    EXPECT_NE(r.checks(0).fix().find("install NCCL 2.30.4 at " + kLib), std::string::npos);
  }

  // The controller's copy is 2.27.7 and n1 holds that very build: staging cannot fix n1.
  std::map<std::string, glm::v1::PreflightResponse> wrong;
  wrong["n1"] = NcclResponse(
      kLib, true, kHash, "2.27.7", glm::v1::CHECK_STATUS_WARN,
      "NCCL library " + kLib + " is version 2.27.7 (code 22707), expected 2.30.4 (code 23004); "
      "will be replaced by the pinned build in the Stage phase");
  wrong["n1"].mutable_checks(0)->set_fix("stage NCCL 2.30.4 at that path");
  wrong["n2"] = NcclResponse(kLib, false, "", "", glm::v1::CHECK_STATUS_WARN, kMissing);
  plan = ApplyNcclStaging(ctx_.topology, NcclSourceFile{kLib, kHash, 4096}, &wrong);
  const glm::v1::Check& c = wrong["n1"].checks(0);
  EXPECT_EQ(c.status(), glm::v1::CHECK_STATUS_FAIL);
  EXPECT_NE(c.message().find("n1: NCCL library " + kLib + " is version 2.27.7 (code 22707), "
                                                        "expected 2.30.4 (code 23004)"),
            std::string::npos)
      << c.message();
  EXPECT_NE(c.message().find("staging cannot fix it"), std::string::npos);
  EXPECT_EQ(c.fix(), "stage NCCL 2.30.4 at that path");
  EXPECT_FALSE(wrong["n1"].ok());
}

// A step that does nothing, for the phases before Stage.
struct NopStep : BringUpStep {
  explicit NopStep(Phase p) : p_(p) {}
  Phase phase() const override { return p_; }
  absl::Status Run(BringUpContext&) override { return absl::OkStatus(); }
  Phase p_;
};

std::unique_ptr<BringUpMachine> MachineWithStage(std::vector<std::pair<Phase, Phase>>* seen) {
  std::vector<std::unique_ptr<BringUpStep>> steps;
  for (Phase p : {Phase::kValidate, Phase::kConnect, Phase::kPreflight, Phase::kPlan}) {
    steps.push_back(std::make_unique<NopStep>(p));
  }
  steps.push_back(std::make_unique<StageStep>());
  auto m = BringUpMachine::Create(std::move(steps), [seen](Phase from, Phase to,
                                                           const std::string&) {
    seen->emplace_back(from, to);
  });
  return m.ok() ? *std::move(m) : nullptr;
}

TEST_F(StageStepTest, MachinePassesThroughStageToReady) {
  std::vector<std::pair<Phase, Phase>> seen;
  auto m = MachineWithStage(&seen);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Run(ctx_).ok());
  EXPECT_EQ(m->phase(), Phase::kReady);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen[seen.size() - 2], std::make_pair(Phase::kPlan, Phase::kStage));
  EXPECT_EQ(seen.back(), std::make_pair(Phase::kStage, Phase::kReady));
}

TEST_F(StageStepTest, MachineFailsInStage) {
  factory_.agents["n1"]->stage_weights.status =
      absl::DataLossError("hash mismatch in model.safetensors");
  std::vector<std::pair<Phase, Phase>> seen;
  auto m = MachineWithStage(&seen);
  ASSERT_NE(m, nullptr);
  absl::Status s = m->Run(ctx_);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(m->phase(), Phase::kFailed);
  EXPECT_EQ(seen.back(), std::make_pair(Phase::kStage, Phase::kFailed));
  EXPECT_NE(s.message().find("node n1"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace glm::orchestrate
