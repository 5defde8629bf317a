// The canary against fake agents whose Generate plays a scripted model: resolving model.canary
// (ids, text through a tokenizer, the default prompt, text without a tokenizer), passing
// replicas, a diff naming the replica and the first differing token, non-finite logprobs, a
// replica that disagrees with itself or with the others, the reference kept across calls, the
// Canary step holding a failing replica out of service; and RestartReplica's order of calls.
#include "controller/orchestrate/canary.h"

#include <cmath>
#include <limits>
#include <mutex>

#include "controller/orchestrate/replica_restart.h"
#include "controller/orchestrate/testing/fake_agent_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::orchestrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A "model": the output continues the prompt's last id by +1, +2, ... (plus `offset`).
std::function<std::vector<glm::v1::TokenEvent>(const glm::v1::GenerateRequest&)> Counting(
    int offset = 0, float logprob = -0.5f) {
  return [offset, logprob](const glm::v1::GenerateRequest& req) {
    std::vector<glm::v1::TokenEvent> out;
    int32_t last = req.prompt_token_ids(req.prompt_token_ids_size() - 1);
    for (int i = 0; i < req.max_tokens(); ++i) {
      glm::v1::TokenEvent ev;
      ev.add_token_ids(last + 1 + i + offset);
      ev.add_logprobs()->set_logprob(logprob);
      if (i + 1 == req.max_tokens()) {
        ev.set_finished(true);
        ev.set_finish_reason("length");
      }
      out.push_back(ev);
    }
    return out;
  };
}

// Text tokenizer: one id per character (its code).
CanaryTokenizer CharTokenizer() {
  CanaryTokenizer t;
  t.encode = [](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
    return std::vector<int32_t>(text.begin(), text.end());
  };
  t.decode = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s.push_back(static_cast<char>(id));
    return s;
  };
  return t;
}

class CanaryTest : public ::testing::Test {
 protected:
  CanaryTest()
      : state_(&clock_), ctx_(&state_, [this](const glm::v1::UpEvent& e) {
          std::lock_guard<std::mutex> lock(mu_);
          events_.push_back(e);
        }) {
    ctx_.topology.cluster_name = "t";
    // Two replicas of TP2: r0 = n0 (head), n1; r1 = n2 (head), n3.
    for (int i = 0; i < 4; ++i) {
      NodeEndpoint n;
      n.name = "n" + std::to_string(i);
      n.replica = i / 2;
      n.tp_rank = i % 2;
      n.layer_end = 2;
      ctx_.topology.nodes.push_back(n);
      agents_[i] = factory_.Add(n.name);
      agents_[i]->generate_reply = Counting();
      ctx_.SetAgent(n.name, agents_[i]);
    }
    ctx_.topology.replicas = {{"n0", "n1"}, {"n2", "n3"}};
    state_.Reset(ctx_.topology);
    state_.SetReplicas(ctx_.topology.replicas);
  }

  std::vector<std::string> Messages() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& e : events_) out.push_back(e.message());
    return out;
  }

  FakeClock clock_;
  ClusterState state_;
  std::mutex mu_;
  std::vector<glm::v1::UpEvent> events_;
  BringUpContext ctx_;
  FakeAgentClientFactory factory_;
  std::shared_ptr<FakeAgentClient> agents_[4];
  CanaryReference reference_;
};

TEST(ResolveCanaryTest, IdsTextAndDefaults) {
  CanarySettings s;
  s.prompt_ids = {5, 6};
  s.expect_ids = {7, 8, 9};
  auto r = ResolveCanary(s, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompt_ids, ElementsAre(5, 6));
  EXPECT_EQ(r->max_tokens, 3);  // len(expect_ids)

  CanarySettings text;
  text.prompt = "ab";
  r = ResolveCanary(text, CharTokenizer());
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->prompt_ids, ElementsAre('a', 'b'));
  EXPECT_EQ(r->max_tokens, 8);

  r = ResolveCanary(text, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("model.canary.prompt_ids"));

  r = ResolveCanary(CanarySettings(), {});
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->prompt_ids, ElementsAre(1, 2, 3, 4));
  r = ResolveCanary(CanarySettings(), CharTokenizer());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_ids.size(), 5u);  // "Hello"
}

TEST_F(CanaryTest, PassesAndSendsGreedyRequestsTwicePerReplica) {
  ctx_.topology.canary.prompt_ids = {10, 11};
  ctx_.topology.canary.expect_ids = {12, 13, 14};
  ASSERT_TRUE(RunCanary(ctx_, {0, 1}, {}, &reference_, std::chrono::seconds(5)).ok());
  EXPECT_EQ(agents_[0]->CallCount("Generate"), 2);
  EXPECT_EQ(agents_[2]->CallCount("Generate"), 2);
  EXPECT_EQ(agents_[1]->CallCount("Generate"), 0);  // not a head
  glm::v1::GenerateRequest req = agents_[0]->last_generate();
  EXPECT_EQ(req.temperature(), 0.0f);
  EXPECT_TRUE(req.ignore_eos());
  EXPECT_TRUE(req.return_logprobs());
  EXPECT_EQ(req.max_tokens(), 3);
  ASSERT_TRUE(reference_.Get().has_value());
  EXPECT_THAT(*reference_.Get(), ElementsAre(12, 13, 14));
  EXPECT_THAT(Messages(), ::testing::Contains(HasSubstr("replica 1: canary passed")));
}

TEST_F(CanaryTest, ExpectationMismatchNamesReplicaTokenAndText) {
  ctx_.topology.canary.prompt = "ab";
  ctx_.topology.canary.expect = "cdX";
  absl::Status s = RunCanary(ctx_, {0, 1}, CharTokenizer(), &reference_, std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("replica 0: canary failed"));
  EXPECT_THAT(s.message(), HasSubstr("replica 1: canary failed"));
  EXPECT_THAT(s.message(), HasSubstr("does not start with model.canary.expect \"cdX\""));

  ctx_.topology.canary = {};
  ctx_.topology.canary.prompt_ids = {10};
  ctx_.topology.canary.expect_ids = {11, 12, 99};
  s = RunCanary(ctx_, {1}, CharTokenizer(), nullptr, std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("replica 1: canary failed: output differs from "
                                     "model.canary.expect_ids: token 2 differs (expected 99, "
                                     "got 13)"));
}

TEST_F(CanaryTest, NonFiniteLogprobsFail) {
  agents_[2]->generate_reply = Counting(0, std::numeric_limits<float>::quiet_NaN());
  absl::Status s = RunCanary(ctx_, {0, 1}, {}, &reference_, std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("replica 1: canary failed: run 1: non-finite logits"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("replica 0")));
}

TEST_F(CanaryTest, ReplicasMustAgreeWithEachOtherAndWithTheReference) {
  agents_[2]->generate_reply = Counting(/*offset=*/1);
  absl::Status s = RunCanary(ctx_, {0, 1}, {}, &reference_, std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("replica 1: canary failed: output differs from the other "
                                     "replicas'"));
  // A later canary of replica 1 alone (a restart) still compares with the reference.
  s = RunCanary(ctx_, {1}, {}, &reference_, std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  agents_[2]->generate_reply = Counting();
  EXPECT_TRUE(RunCanary(ctx_, {1}, {}, &reference_, std::chrono::seconds(5)).ok());
}

TEST_F(CanaryTest, NondeterministicReplicaFails) {
  auto calls = std::make_shared<int>(0);
  agents_[0]->generate_reply = [calls](const glm::v1::GenerateRequest& req) {
    return Counting((*calls)++)(req);
  };
  absl::Status s = RunCanary(ctx_, {0}, {}, nullptr, std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("two greedy runs disagree"));
}

TEST_F(CanaryTest, StepHoldsFailingReplicaOutOfService) {
  agents_[2]->generate_status = absl::UnavailableError("connection refused");
  CanaryStep step({}, &reference_);
  absl::Status s = step.Run(ctx_);
  ASSERT_FALSE(s.ok());
  glm::v1::ClusterStatus snap = state_.Snapshot();
  EXPECT_EQ(state_.replica_mode(0), ReplicaMode::kServe);
  EXPECT_EQ(state_.replica_mode(1), ReplicaMode::kHeld);
  EXPECT_EQ(snap.replicas(1).state(), glm::v1::REPLICA_STATE_FAILED);
  EXPECT_THAT(snap.replicas(1).message(), HasSubstr("canary failed: run 1: connection refused"));
}

TEST_F(CanaryTest, RestartReplicaDrainsStopsLoadsStartsAndChecksOnlyThatReplica) {
  for (auto& a : agents_) a->calls();
  ReplicaRestartOptions opts;
  opts.reason = "rolling restart";
  std::vector<ReplicaMode> modes;
  absl::Status s = RestartReplica(ctx_.topology, 1, &factory_, &state_, {}, &reference_, opts,
                                  [&](const glm::v1::UpEvent&) {
                                    modes.push_back(state_.replica_mode(1));
                                  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(agents_[2]->calls(),
              ElementsAre("DrainShard", "StopShard", "LoadShard", "StartShard", "Generate",
                          "Generate"));
  EXPECT_THAT(agents_[3]->calls(), ElementsAre("StopShard", "LoadShard", "StartShard"));
  EXPECT_TRUE(agents_[0]->calls().empty());
  EXPECT_EQ(modes.front(), ReplicaMode::kDraining);
  EXPECT_EQ(modes.back(), ReplicaMode::kRestarting);  // the caller re-admits it

  // --processes: each agent restarts; the fake keeps its instance id, so the wait times out.
  opts.processes = true;
  opts.process_timeout = std::chrono::milliseconds(300);
  s = RestartReplica(ctx_.topology, 1, &factory_, &state_, {}, &reference_, opts, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("did not come back"));

  s = RestartReplica(ctx_.topology, 7, &factory_, &state_, {}, &reference_, opts, nullptr);
  EXPECT_THAT(s.message(), HasSubstr("replica 7 does not exist"));
}

}  // namespace
}  // namespace glm::orchestrate
