#include "engine/engine.h"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/sched/fake_model.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

std::vector<int32_t> Prompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((i * 13 + salt * 7 + i * i) % 97);
  return p;
}

Request Greedy(std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.prompt_ids = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  return r;
}

std::unique_ptr<Engine> MakeEngine(FakeModel::Options mo, EngineOptions eo, FakeModel** fake) {
  auto model = std::make_unique<FakeModel>(mo);
  if (fake) *fake = model.get();
  auto e = Engine::CreateWithModel(std::move(model), eo);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

TEST(EngineTest, ConcurrentSubmitsFromManyThreads) {
  FakeModel::Options mo;
  mo.num_blocks = 48;
  EngineOptions eo;
  eo.max_num_batched_tokens = 10;
  eo.max_num_seqs = 4;
  FakeModel* fake = nullptr;
  auto engine = MakeEngine(mo, eo, &fake);
  FakeModel reference(mo);
  std::vector<std::thread> threads;
  std::vector<std::vector<int32_t>> got(8), want(8);
  for (int t = 0; t < 8; ++t) {
    want[t] = reference.Greedy(Prompt(3 + 4 * t, t), 12 + t);
    threads.emplace_back([&, t] {
      auto h = engine->Submit(Greedy(Prompt(3 + 4 * t, t), 12 + t));
      ASSERT_TRUE(h.ok()) << h.status();
      TokenEvent last;
      got[t] = h->stream->CollectTokens(&last);
      EXPECT_EQ(last.finish_reason, FinishReason::kLength);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(got[t], want[t]) << t;
  ASSERT_TRUE(engine->Drain().ok());
  const EngineStats st = engine->Stats();
  EXPECT_EQ(st.num_requests_submitted, 8);
  EXPECT_EQ(st.num_requests_finished, 8);
  EXPECT_EQ(st.kv_num_free_blocks, st.kv_num_blocks);
  EXPECT_GT(st.num_steps, 0);
}

// A fake whose Forward waits until the test allows another step (no sleeps, no races).
class GatedModel : public FakeModel {
 public:
  explicit GatedModel(const Options& o) : FakeModel(o) {}
  absl::Status Forward(const ForwardBatch& b, ForwardResult* r) override {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return allowed_ > 0; });
      --allowed_;
    }
    return FakeModel::Forward(b, r);
  }
  void Allow(int64_t steps) {
    {
      std::lock_guard<std::mutex> l(mu_);
      allowed_ += steps;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t allowed_ = 0;
};

TEST(EngineTest, AbortEndsTheStream) {
  auto model = std::make_unique<GatedModel>(FakeModel::Options{});
  GatedModel* gate = model.get();
  auto engine = Engine::CreateWithModel(std::move(model), {});
  ASSERT_TRUE(engine.ok());
  auto h = (*engine)->Submit(Greedy(Prompt(5, 1), 200));
  ASSERT_TRUE(h.ok());
  gate->Allow(1);
  TokenEvent ev;
  ASSERT_TRUE(h->stream->Next(&ev));  // the prefill step's token; no further step can finish
  EXPECT_EQ(ev.token_id, FakeModel(FakeModel::Options{}).Greedy(Prompt(5, 1), 1)[0]);
  (*engine)->Abort(h->id);
  gate->Allow(1 << 20);
  TokenEvent last;
  const auto rest = h->stream->CollectTokens(&last);
  // The abort lands before step 2 starts or while it waits in Forward: at most one more token.
  EXPECT_LE(rest.size(), 1u);
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.finish_reason, FinishReason::kAborted);
  EXPECT_FALSE(h->stream->Next(&ev));
  (*engine)->Abort(12345);  // unknown: ignored
  EXPECT_TRUE((*engine)->Drain().ok());
  EXPECT_EQ((*engine)->Stats().kv_num_free_blocks, (*engine)->Stats().kv_num_blocks);
}

TEST(EngineTest, DrainStopsAdmissionAndWaits) {
  auto engine = MakeEngine({}, {}, nullptr);
  auto a = engine->Submit(Greedy(Prompt(4, 2), 20));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(engine->Drain().ok());
  TokenEvent ev;
  int n = 0;
  while (a->stream->TryNext(&ev)) ++n;
  EXPECT_EQ(n, 20);  // everything was delivered before Drain returned
  auto b = engine->Submit(Greedy(Prompt(4, 2), 2));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
}

TEST(EngineTest, SubmitRejectsInvalidRequests) {
  auto engine = MakeEngine({}, {}, nullptr);
  EXPECT_EQ(engine->Submit(Greedy({}, 2)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(Greedy({500}, 2)).status().code(), absl::StatusCode::kInvalidArgument);
  Request r = Greedy({1}, 2);
  r.sampling.top_p = 2;
  EXPECT_EQ(engine->Submit(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(Greedy({1}, 100000)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(EngineTest, MtpGivesSameTokensAndReportsAcceptance) {
  FakeModel::Options mo;
  FakeModel reference(mo);
  EngineOptions eo;
  eo.mtp_draft_tokens = 3;
  auto engine = MakeEngine(mo, eo, nullptr);
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 4; ++i) {
    auto h = engine->Submit(Greedy(Prompt(6 + i, i), 40));
    ASSERT_TRUE(h.ok());
    hs.push_back(*h);
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(hs[i].stream->CollectTokens(), reference.Greedy(Prompt(6 + i, i), 40));
  }
  ASSERT_TRUE(engine->Drain().ok());
  const EngineStats st = engine->Stats();
  EXPECT_GT(st.num_draft_tokens, 0);
  EXPECT_GT(st.draft_acceptance_rate, 0.3);
  EXPECT_LT(st.draft_acceptance_rate, 0.8);
}

TEST(EngineTest, MtpNeedsAnMtpLayer) {
  FakeModel::Options mo;
  mo.has_mtp = false;
  EngineOptions eo;
  eo.mtp_draft_tokens = 2;
  auto e = Engine::CreateWithModel(std::make_unique<FakeModel>(mo), eo);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

// A model whose Forward fails from the Nth call on.
class FailingModel : public FakeModel {
 public:
  FailingModel(const Options& o, int fail_at) : FakeModel(o), fail_at_(fail_at) {}
  absl::Status Forward(const ForwardBatch& b, ForwardResult* r) override {
    if (++calls_ >= fail_at_) return absl::InternalError("device lost");
    return FakeModel::Forward(b, r);
  }

 private:
  int fail_at_;
  int calls_ = 0;
};

// Submits a 50-token greedy request to an engine whose model fails its third Forward; checks that
// it ends in an error after the two tokens of the first two steps and returns its last event.
TokenEvent RequestFailingAtTheThirdStep(Engine& e) {
  TokenEvent last;
  auto h = e.Submit(Greedy(Prompt(4, 1), 50));
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return last;
  const auto toks = h->stream->CollectTokens(&last);
  EXPECT_EQ(last.finish_reason, FinishReason::kError);
  EXPECT_EQ(toks.size(), 2u);
  return last;
}

TEST(EngineTest, ModelFailureFailsRequestsAndLaterSubmits) {
  auto e = Engine::CreateWithModel(std::make_unique<FailingModel>(FakeModel::Options{}, 3), {});
  ASSERT_TRUE(e.ok());
  const TokenEvent last = RequestFailingAtTheThirdStep(**e);
  EXPECT_NE(last.error.message().find("device lost"), std::string::npos) << last.error;
  EXPECT_FALSE((*e)->Drain().ok());
  EXPECT_FALSE((*e)->Submit(Greedy(Prompt(4, 1), 5)).ok());
  EXPECT_TRUE((*e)->Stats().failed);
}

// A step failure the model contains (FakeModel: ResourceExhausted, AfterFailedStep OK) fails the
// requests of that step and nothing else: the engine is not failed and serves the next request.
TEST(EngineTest, ContainedStepFailureFailsThatStepAndKeepsServing) {
  FakeModel::Options mo;
  mo.fail_forward_at = 3;
  mo.failure_contained = true;
  auto e = Engine::CreateWithModel(std::make_unique<FakeModel>(mo), {});
  ASSERT_TRUE(e.ok());
  TokenEvent last = RequestFailingAtTheThirdStep(**e);
  EXPECT_EQ(last.error.code(), absl::StatusCode::kResourceExhausted) << last.error;
  auto h2 = (*e)->Submit(Greedy(Prompt(4, 1), 5));
  ASSERT_TRUE(h2.ok()) << h2.status();
  const auto toks = h2->stream->CollectTokens(&last);
  EXPECT_EQ(last.finish_reason, FinishReason::kLength) << last.error;
  EXPECT_EQ(toks.size(), 5u);
  EXPECT_TRUE((*e)->Drain().ok());
  EXPECT_FALSE((*e)->Stats().failed);
  EXPECT_EQ((*e)->Stats().num_failed_steps, 1);
}

TEST(EngineTest, DestructionAbortsInFlightRequests) {
  RequestHandle h;
  {
    EngineOptions eo;
    eo.max_num_batched_tokens = 2;
    auto engine = MakeEngine({}, eo, nullptr);
    auto r = engine->Submit(Greedy(Prompt(30, 3), 200));
    ASSERT_TRUE(r.ok());
    h = *r;
  }
  TokenEvent last;
  h.stream->CollectTokens(&last);
  EXPECT_TRUE(last.finished);
  EXPECT_TRUE(last.finish_reason == FinishReason::kAborted ||
              last.finish_reason == FinishReason::kLength);
}

}  // namespace
}  // namespace glm::engine
