#include "engine/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "engine/sched/fake_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

struct Output {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int num_finished_events = 0;
  absl::Status error;
  std::vector<float> prompt_logits;
  // Per token event (requests with SamplingParams::logprobs).
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
};

// Drives a Scheduler over a FakeModel, collecting events and checking block-manager integrity
// after every step.
class Harness {
 public:
  Harness(FakeModel::Options mo, SchedulerOptions so) : model_(mo) {
    sched_ = std::make_unique<Scheduler>(&model_, so, [this](int64_t id, TokenEvent ev) {
      Output& o = out_[id];
      EXPECT_EQ(o.num_finished_events, 0) << "event after finish for " << id;
      if (ev.token_id >= 0) {
        o.tokens.push_back(ev.token_id);
        o.logprobs.push_back(ev.logprob);
        o.top_logprobs.push_back(std::move(ev.top_logprobs));
      }
      if (!ev.prompt_logits.empty()) o.prompt_logits = std::move(ev.prompt_logits);
      if (ev.finished) {
        ++o.num_finished_events;
        o.reason = ev.finish_reason;
        o.error = ev.error;
      }
    });
  }
  void Add(int64_t id, Request r, uint64_t seed = 1) {
    ASSERT_TRUE(sched_->Validate(r).ok()) << sched_->Validate(r);
    ASSERT_TRUE(sched_->Add(id, std::move(r), seed).ok());
  }
  void StepOnce() {
    ASSERT_TRUE(sched_->Step().ok());
    ASSERT_TRUE(sched_->block_manager().CheckIntegrity().ok())
        << sched_->block_manager().CheckIntegrity();
  }
  void RunToCompletion() {
    for (int i = 0; i < 100000 && sched_->HasWork(); ++i) {
      StepOnce();
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_FALSE(sched_->HasWork());
    EXPECT_EQ(sched_->block_manager().NumFreeBlocks(), sched_->block_manager().num_blocks());
    EXPECT_EQ(model_.unwritten_reads(), 0);
    EXPECT_EQ(model_.mtp_kv_mismatches(), 0);
  }
  FakeModel& model() { return model_; }
  Scheduler& sched() { return *sched_; }
  std::map<int64_t, Output>& out() { return out_; }

 private:
  FakeModel model_;
  std::unique_ptr<Scheduler> sched_;
  std::map<int64_t, Output> out_;
};

std::vector<int32_t> Prompt(int len, int salt, int vocab = 97) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((i * 31 + salt * 17 + i * i) % vocab);
  return p;
}

Request MakeRequest(std::vector<int32_t> prompt, int max_tokens, float temperature = 0.0f,
                    std::optional<uint64_t> seed = std::nullopt) {
  Request r;
  r.prompt_ids = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

// The output of `r` run alone on a roomy cache, no chunking limits, no MTP.
Output RunAlone(const Request& r) {
  FakeModel::Options mo;
  mo.num_blocks = 512;
  SchedulerOptions so;
  so.max_num_batched_tokens = 4096;
  Harness h(mo, so);
  h.Add(0, r);
  h.RunToCompletion();
  return h.out()[0];
}

TEST(SchedulerTest, SingleGreedyRequestMatchesReference) {
  Harness h({}, {});
  const auto prompt = Prompt(11, 1);
  h.Add(7, MakeRequest(prompt, 20));
  h.RunToCompletion();
  EXPECT_EQ(h.out()[7].tokens, h.model().Greedy(prompt, 20));
  EXPECT_EQ(h.out()[7].reason, FinishReason::kLength);
  EXPECT_EQ(h.out()[7].num_finished_events, 1);
}

std::vector<Request> MixedRequests() {
  std::vector<Request> rs;
  rs.push_back(MakeRequest(Prompt(3, 1), 25));
  rs.push_back(MakeRequest(Prompt(17, 2), 9));
  rs.push_back(MakeRequest(Prompt(30, 3), 14, 0.8f, 1234));
  rs.push_back(MakeRequest(Prompt(8, 4), 30));
  rs.push_back(MakeRequest(Prompt(1, 5), 5, 1.2f, 99));
  rs.push_back(MakeRequest(Prompt(22, 6), 18));
  rs.back().sampling.top_k = 5;
  rs.back().sampling.temperature = 1.0f;
  rs.back().sampling.seed = 7;
  return rs;
}

void ExpectSameAsAlone(Harness& h, const std::vector<Request>& rs) {
  for (size_t i = 0; i < rs.size(); ++i) {
    const Output alone = RunAlone(rs[i]);
    EXPECT_EQ(h.out()[i].tokens, alone.tokens) << "request " << i;
    EXPECT_EQ(h.out()[i].reason, alone.reason) << "request " << i;
    EXPECT_EQ(h.out()[i].num_finished_events, 1) << "request " << i;
  }
}

TEST(SchedulerTest, ConcurrentChunkedPrefillMatchesRunningAlone) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 7;  // forces prompts to be split across steps
  so.max_num_seqs = 3;
  Harness h({}, so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.RunToCompletion();
  ExpectSameAsAlone(h, rs);
  EXPECT_LE(h.model().max_batch_tokens(), 7);
  EXPECT_EQ(h.out()[0].tokens, h.model().Greedy(rs[0].prompt_ids, 25));
}

TEST(SchedulerTest, PreemptionByRecomputeKeepsOutputs) {
  FakeModel::Options mo;
  mo.num_blocks = 24;  // 96 positions for six requests of up to 48 tokens
  SchedulerOptions so;
  so.max_num_batched_tokens = 16;
  so.enable_prefix_caching = false;
  Harness h(mo, so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.RunToCompletion();
  EXPECT_GT(h.sched().Stats().num_preemptions, 0);
  ExpectSameAsAlone(h, rs);
  // The model was told about every preemption and every finish (its per-sequence state, e.g.
  // the key-slot arena's regions, is dropped at once).
  const std::vector<int64_t>& released = h.model().released();
  EXPECT_EQ(static_cast<int64_t>(released.size()),
            h.sched().Stats().num_preemptions + static_cast<int64_t>(rs.size()));
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_NE(std::find(released.begin(), released.end(), static_cast<int64_t>(i)),
              released.end())
        << i;
  }
}

TEST(SchedulerTest, PreemptionWithPrefixCachingKeepsOutputs) {
  FakeModel::Options mo;
  mo.num_blocks = 24;
  SchedulerOptions so;
  so.max_num_batched_tokens = 16;
  Harness h(mo, so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.RunToCompletion();
  EXPECT_GT(h.sched().Stats().num_preemptions, 0);
  ExpectSameAsAlone(h, rs);
}

// A Forward that fails without harming the model (Model::AfterFailedStep OK: the key-slot table
// could not grow) fails exactly the sequences of that step, once each, with the model's error;
// every other request runs to the output it has alone, blocks are all freed, and a request added
// afterwards is served. A failure the model calls fatal is Step's error (the engine stops).
TEST(SchedulerTest, ContainedForwardFailureFailsOnlyThatStepsSequences) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 8;
  FakeModel::Options mo;
  mo.fail_forward_at = 4;
  mo.failure_contained = true;
  Harness h(mo, so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.RunToCompletion();
  const std::vector<int64_t>& failed = h.model().failed_batch();
  ASSERT_FALSE(failed.empty());
  EXPECT_EQ(h.sched().Stats().num_failed_steps, 1);
  for (size_t i = 0; i < rs.size(); ++i) {
    const Output& o = h.out()[i];
    EXPECT_EQ(o.num_finished_events, 1) << i;
    if (std::find(failed.begin(), failed.end(), int64_t(i)) != failed.end()) {
      EXPECT_EQ(o.reason, FinishReason::kError) << i;
      EXPECT_EQ(o.error.code(), absl::StatusCode::kResourceExhausted) << o.error;
      EXPECT_NE(o.error.message().find("key-slot table"), std::string::npos) << o.error;
    } else {
      EXPECT_TRUE(o.error.ok()) << i << ": " << o.error;
      EXPECT_EQ(o.tokens, RunAlone(rs[i]).tokens) << i;
    }
  }
  h.Add(100, rs[1]);
  h.RunToCompletion();
  EXPECT_EQ(h.out()[100].tokens, RunAlone(rs[1]).tokens);

  mo.failure_contained = false;
  Harness fatal(mo, so);
  for (size_t i = 0; i < rs.size(); ++i) fatal.Add(i, rs[i]);
  absl::Status st;
  for (int i = 0; i < 10 && st.ok(); ++i) st = fatal.sched().Step();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
}

TEST(SchedulerTest, AbortEmitsOneFinalEventAndFreesBlocks) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 8;
  Harness h({}, so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  for (int i = 0; i < 5; ++i) h.StepOnce();
  const size_t released_before = h.model().released().size();
  EXPECT_TRUE(h.sched().Abort(3));  // running or waiting, either way
  EXPECT_TRUE(h.sched().Abort(5));
  EXPECT_FALSE(h.sched().Abort(5));
  EXPECT_FALSE(h.sched().Abort(42));
  ASSERT_TRUE(h.sched().block_manager().CheckIntegrity().ok());
  // Each abort told the model once; the failed ones did not.
  const std::vector<int64_t>& released = h.model().released();
  EXPECT_EQ(std::vector<int64_t>(released.begin() + released_before, released.end()),
            (std::vector<int64_t>{3, 5}));
  h.RunToCompletion();
  EXPECT_EQ(h.out()[3].reason, FinishReason::kAborted);
  EXPECT_EQ(h.out()[5].reason, FinishReason::kAborted);
  EXPECT_EQ(h.out()[3].num_finished_events, 1);
  for (int i : {0, 1, 2, 4}) {
    EXPECT_EQ(h.out()[i].tokens, RunAlone(rs[i]).tokens) << i;
  }
}

TEST(SchedulerTest, PrefixCacheHitsSkipComputeAndKeepOutputs) {
  SchedulerOptions so;
  Harness h({}, so);
  auto shared = Prompt(21, 9);
  auto a = shared;
  a.push_back(3);
  auto b = shared;
  b.push_back(50);
  b.push_back(51);
  h.Add(1, MakeRequest(a, 6));
  h.RunToCompletion();
  const int64_t computed_before = h.model().num_tokens_computed();
  h.Add(2, MakeRequest(b, 6));
  h.Add(3, MakeRequest(a, 6));  // the whole prompt but its last token is cached
  h.RunToCompletion();
  const auto stats = h.sched().Stats();
  EXPECT_EQ(stats.num_cached_prompt_tokens, 20 + 20);  // 5 full blocks of 4 each time
  // b computes 3 prompt tokens + 5 decode tokens; a computes 2 + 5.
  EXPECT_EQ(h.model().num_tokens_computed() - computed_before, (3 + 5) + (2 + 5));
  EXPECT_EQ(h.out()[2].tokens, RunAlone(MakeRequest(b, 6)).tokens);
  EXPECT_EQ(h.out()[3].tokens, h.out()[1].tokens);
}

TEST(SchedulerTest, StopTokensMinTokensAndEos) {
  FakeModel::Options mo;
  const auto prompt = Prompt(5, 2);
  FakeModel ref(mo);
  const auto greedy = ref.Greedy(prompt, 10);
  {
    Harness h(mo, {});
    Request r = MakeRequest(prompt, 10);
    r.sampling.stop_token_ids = {greedy[3]};
    h.Add(0, r);
    h.RunToCompletion();
    // Stops at the first occurrence of the stop token, which is emitted.
    size_t first = std::find(greedy.begin(), greedy.end(), greedy[3]) - greedy.begin();
    EXPECT_EQ(h.out()[0].tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + first + 1));
    EXPECT_EQ(h.out()[0].reason, FinishReason::kStop);
  }
  {
    mo.eos_token_ids = {greedy[0]};
    Harness h(mo, {});
    h.Add(0, MakeRequest(prompt, 10));
    Request r = MakeRequest(prompt, 10);
    r.sampling.min_tokens = 2;  // EOS masked for the first two tokens
    h.Add(1, r);
    r.sampling.min_tokens = 0;
    r.sampling.ignore_eos = true;
    h.Add(2, r);
    h.RunToCompletion();
    EXPECT_EQ(h.out()[0].tokens, std::vector<int32_t>{greedy[0]});
    EXPECT_EQ(h.out()[0].reason, FinishReason::kStop);
    ASSERT_GE(h.out()[1].tokens.size(), 2u);
    EXPECT_NE(h.out()[1].tokens[0], greedy[0]);
    EXPECT_EQ(h.out()[2].tokens, greedy);
    EXPECT_EQ(h.out()[2].reason, FinishReason::kLength);
  }
}

TEST(SchedulerTest, PromptLogitsCoverEveryPosition) {
  FakeModel::Options mo;
  SchedulerOptions so;
  so.max_num_batched_tokens = 5;
  Harness h(mo, so);
  const auto prompt = Prompt(13, 4);
  h.Add(0, MakeRequest(prompt, 3));  // populates the prefix cache
  h.RunToCompletion();
  Request r = MakeRequest(prompt, 3);
  r.return_prompt_logits = true;
  h.Add(1, r);
  h.RunToCompletion();
  const auto& logits = h.out()[1].prompt_logits;
  ASSERT_EQ(logits.size(), prompt.size() * 97);
  // Row p's argmax is the greedy continuation of prompt[0..p].
  for (size_t p = 0; p < prompt.size(); ++p) {
    std::vector<int32_t> prefix(prompt.begin(), prompt.begin() + p + 1);
    int best = 0;
    for (int v = 1; v < 97; ++v) if (logits[p * 97 + v] > logits[p * 97 + best]) best = v;
    EXPECT_EQ(best, h.model().Greedy(prefix, 1)[0]) << p;
  }
  EXPECT_EQ(h.out()[1].tokens, h.out()[0].tokens);
}

// log_softmax of a row by hand, in double.
std::vector<double> LogSoftmax(const std::vector<float>& row) {
  double max = row[0];
  for (float x : row) max = std::max<double>(max, x);
  double sum = 0;
  for (float x : row) sum += std::exp(x - max);
  std::vector<double> out;
  for (float x : row) out.push_back(x - max - std::log(sum));
  return out;
}

// Every token of `o` carries the raw log_softmax of the row it was drawn from (the fake's logits
// after prompt + the tokens before it) and the k most likely ids, logprob descending, ties lower
// id first.
void ExpectRawLogprobs(const FakeModel& model, const std::vector<int32_t>& prompt,
                       const Output& o, int k) {
  ASSERT_EQ(o.logprobs.size(), o.tokens.size());
  ASSERT_EQ(o.top_logprobs.size(), o.tokens.size());
  std::vector<int32_t> context = prompt;
  for (size_t i = 0; i < o.tokens.size(); ++i) {
    const std::vector<double> want = LogSoftmax(model.LogitsAfter(context));
    EXPECT_NEAR(o.logprobs[i], want[o.tokens[i]], 1e-5) << "token " << i;
    std::vector<int32_t> order(want.size());
    for (size_t v = 0; v < order.size(); ++v) order[v] = static_cast<int32_t>(v);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return want[a] > want[b]; });
    ASSERT_EQ(o.top_logprobs[i].size(), static_cast<size_t>(k)) << "token " << i;
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(o.top_logprobs[i][j].first, order[j]) << "token " << i << " rank " << j;
      EXPECT_NEAR(o.top_logprobs[i][j].second, want[order[j]], 1e-5) << "token " << i;
    }
    context.push_back(o.tokens[i]);
  }
}

TEST(SchedulerTest, LogprobsAreTheRawLogSoftmaxOfEachTokensRow) {
  FakeModel::Options mo;
  const auto p_greedy = Prompt(9, 1), p_sampled = Prompt(14, 2), p_masked = Prompt(6, 3);
  const auto greedy_masked = FakeModel(mo).Greedy(p_masked, 1);
  SchedulerOptions so;
  so.max_num_batched_tokens = 6;  // chunked prefill, requests sharing steps
  Harness h(mo, so);
  Request greedy = MakeRequest(p_greedy, 12);
  greedy.sampling.logprobs = 3;
  Request sampled = MakeRequest(p_sampled, 15, 0.8f, 1234);
  sampled.sampling.top_k = 6;
  sampled.sampling.logprobs = 5;
  // The first two tokens are drawn with the greedy choice masked (min_tokens); the logprobs are
  // still those of the unmasked row, so the top-1 is a token that was not emitted.
  Request masked = MakeRequest(p_masked, 6);
  masked.sampling.stop_token_ids = {greedy_masked[0]};
  masked.sampling.min_tokens = 2;
  masked.sampling.logprobs = 0;
  Request sampled_plain = sampled;
  sampled_plain.sampling.logprobs.reset();
  h.Add(0, greedy);
  h.Add(1, sampled);
  h.Add(2, masked);
  h.Add(3, sampled_plain);
  h.RunToCompletion();

  ExpectRawLogprobs(h.model(), p_greedy, h.out()[0], 3);
  ExpectRawLogprobs(h.model(), p_sampled, h.out()[1], 5);
  ExpectRawLogprobs(h.model(), p_masked, h.out()[2], 0);
  // Greedy: the token is the row's most likely, so its logprob is the row's max.
  EXPECT_EQ(h.out()[0].tokens, h.model().Greedy(p_greedy, 12));
  for (size_t i = 0; i < h.out()[0].tokens.size(); ++i) {
    EXPECT_EQ(h.out()[0].top_logprobs[i][0].first, h.out()[0].tokens[i]);
    EXPECT_EQ(h.out()[0].top_logprobs[i][0].second, h.out()[0].logprobs[i]);
  }
  // Asking for logprobs changes no token; requests without them carry none.
  EXPECT_EQ(h.out()[1].tokens, h.out()[3].tokens);
  EXPECT_NE(h.out()[2].tokens[0], greedy_masked[0]);
  const std::vector<double> first_row = LogSoftmax(h.model().LogitsAfter(p_masked));
  EXPECT_LT(h.out()[2].logprobs[0], first_row[greedy_masked[0]]);
  for (const auto& top : h.out()[3].top_logprobs) EXPECT_TRUE(top.empty());
}

TEST(SchedulerTest, ValidateRejectsWhatCanNeverRun) {
  FakeModel::Options mo;
  mo.num_blocks = 4;
  mo.max_position_embeddings = 64;
  SchedulerOptions so;
  so.enable_chunked_prefill = false;
  so.max_num_batched_tokens = 8;
  Harness h(mo, so);
  EXPECT_EQ(h.sched().Validate(MakeRequest({}, 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.sched().Validate(MakeRequest({97}, 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.sched().Validate(MakeRequest(Prompt(9, 1), 1)).code(),
            absl::StatusCode::kInvalidArgument);  // over the budget without chunking
  EXPECT_EQ(h.sched().Validate(MakeRequest(Prompt(8, 1), 20)).code(),
            absl::StatusCode::kResourceExhausted);  // 28 tokens > 16 cache positions
  EXPECT_TRUE(h.sched().Validate(MakeRequest(Prompt(8, 1), 8)).ok());
  Request too_many = MakeRequest(Prompt(8, 1), 8);
  too_many.sampling.logprobs = 21;
  const absl::Status s = h.sched().Validate(too_many);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("logprobs"));
}

// MTP: outputs identical to no-MTP for greedy and seeded sampling, KV of the draft layer exact.
class MtpTest : public ::testing::TestWithParam<int> {};

TEST_P(MtpTest, SpeculativeOutputEqualsPlainDecoding) {
  const int k = GetParam();
  SchedulerOptions so;
  so.num_draft_tokens = k;
  so.max_num_batched_tokens = 9;
  so.max_num_seqs = 4;
  FakeModel::Options mo;
  mo.num_blocks = 18;  // tight: preemption happens with drafts in flight
  Harness h(mo, so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.RunToCompletion();
  ExpectSameAsAlone(h, rs);
  const auto st = h.sched().Stats();
  EXPECT_GT(st.num_draft_tokens, 0);
  // Half the requests sample (drafts are greedy guesses), so acceptance is well below 1.
  EXPECT_GT(st.draft_acceptance_rate(), 0.1) << st.draft_acceptance_rate();
  EXPECT_LT(st.draft_acceptance_rate(), 0.95) << st.draft_acceptance_rate();
  EXPECT_GT(h.model().num_mtp_calls(), 0);
  EXPECT_GT(st.num_preemptions, 0);
  std::printf("k=%d acceptance=%.3f drafts=%lld accepted=%lld preemptions=%lld steps=%lld\n", k,
              st.draft_acceptance_rate(), static_cast<long long>(st.num_draft_tokens),
              static_cast<long long>(st.num_accepted_draft_tokens),
              static_cast<long long>(st.num_preemptions), static_cast<long long>(st.num_steps));
}

TEST_P(MtpTest, GreedyAcceptanceMatchesDrafterQuality) {
  // The fake's draft is right for 70% of contexts; with k drafts the expected fraction of drafts
  // accepted is (p + p^2 + ... + p^k) / k, p = 0.7.
  const int k = GetParam();
  SchedulerOptions so;
  so.num_draft_tokens = k;
  Harness h({}, so);
  for (int i = 0; i < 8; ++i) h.Add(i, MakeRequest(Prompt(5 + i, i), 60));
  h.RunToCompletion();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(h.out()[i].tokens, h.model().Greedy(Prompt(5 + i, i), 60));
  double want = 0, pk = 1;
  for (int j = 1; j <= k; ++j) want += (pk *= 0.7);
  want /= k;
  const double got = h.sched().Stats().draft_acceptance_rate();
  std::printf("greedy k=%d acceptance=%.3f expected~%.3f\n", k, got, want);
  EXPECT_NEAR(got, want, 0.08);
}

TEST_P(MtpTest, PerfectDrafterIsAlwaysAcceptedForGreedy) {
  SchedulerOptions so;
  so.num_draft_tokens = GetParam();
  FakeModel::Options mo;
  mo.mtp_miss_percent = 0;
  Harness h(mo, so);
  const auto prompt = Prompt(9, 3);
  h.Add(0, MakeRequest(prompt, 31));
  h.RunToCompletion();
  EXPECT_EQ(h.out()[0].tokens, h.model().Greedy(prompt, 31));
  EXPECT_DOUBLE_EQ(h.sched().Stats().draft_acceptance_rate(), 1.0);
  // 1 prefill step, then k+1 tokens per step.
  EXPECT_EQ(h.sched().Stats().num_steps, 1 + (30 + GetParam()) / (GetParam() + 1));
}

TEST_P(MtpTest, PrefixCacheHitsKeepDraftKvExact) {
  SchedulerOptions so;
  so.num_draft_tokens = GetParam();
  Harness h({}, so);
  // a and b diverge right after 6 full blocks: block 5's last MTP entry depends on that token.
  auto shared = Prompt(24, 5);
  auto a = shared;
  a.insert(a.end(), {1, 7, 7});
  auto b = shared;
  b.insert(b.end(), {2, 7, 7});
  h.Add(0, MakeRequest(a, 12));
  h.RunToCompletion();
  h.Add(1, MakeRequest(b, 12));
  h.Add(2, MakeRequest(a, 12));
  h.RunToCompletion();  // checks mtp_kv_mismatches == 0
  EXPECT_GT(h.sched().Stats().num_cached_prompt_tokens, 0);
  EXPECT_EQ(h.out()[1].tokens, h.model().Greedy(b, 12));
  EXPECT_EQ(h.out()[2].tokens, h.out()[0].tokens);
}

// Accepted drafts carry the logprobs of the rows they were verified against: the same values as
// plain decoding.
TEST_P(MtpTest, LogprobsOfAcceptedDraftsEqualPlainDecoding) {
  SchedulerOptions so;
  so.num_draft_tokens = GetParam();
  so.max_num_batched_tokens = 9;
  Harness h({}, so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].sampling.logprobs = static_cast<int>(i % 3) * 2;
    h.Add(i, rs[i]);
  }
  h.RunToCompletion();
  EXPECT_GT(h.sched().Stats().num_accepted_draft_tokens, 0);
  for (size_t i = 0; i < rs.size(); ++i) {
    ExpectRawLogprobs(h.model(), rs[i].prompt_ids, h.out()[i], *rs[i].sampling.logprobs);
    const Output alone = RunAlone(rs[i]);
    EXPECT_EQ(h.out()[i].tokens, alone.tokens) << "request " << i;
    EXPECT_EQ(h.out()[i].logprobs, alone.logprobs) << "request " << i;
  }
}

// A request may ask for fewer drafts (SamplingParams::num_draft_tokens, at most k): its output
// does not change, and with 0 it is never drafted for (the draft layer's KV is still kept).
TEST_P(MtpTest, PerRequestDraftTokensCapTheDraftsAndKeepTheOutput) {
  const int k = GetParam();
  SchedulerOptions so;
  so.num_draft_tokens = k;
  {
    Harness h({}, so);
    for (int i = 0; i < 4; ++i) {
      Request r = MakeRequest(Prompt(6 + i, i), 30);
      r.sampling.num_draft_tokens = 0;
      h.Add(i, r);
    }
    h.RunToCompletion();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(h.out()[i].tokens, h.model().Greedy(Prompt(6 + i, i), 30));
    EXPECT_EQ(h.sched().Stats().num_draft_tokens, 0);
    EXPECT_EQ(h.sched().Stats().num_drafts, 0);
    EXPECT_GT(h.model().num_mtp_calls(), 0);  // the draft layer's KV is kept in step
  }
  {
    FakeModel::Options mo;
    mo.mtp_miss_percent = 0;  // every draft accepted: each verify step carries exactly the cap
    Harness h(mo, so);
    Request r = MakeRequest(Prompt(7, 2), 1 + 10 * k);
    r.sampling.num_draft_tokens = 1;
    h.Add(0, r);
    h.RunToCompletion();
    EXPECT_EQ(h.out()[0].tokens, h.model().Greedy(Prompt(7, 2), 1 + 10 * k));
    const SchedulerStats st = h.sched().Stats();
    EXPECT_GT(st.num_drafts, 0);
    EXPECT_EQ(st.num_draft_tokens, st.num_drafts);  // one draft per verify step
  }
  Harness h({}, so);
  Request over = MakeRequest(Prompt(5, 1), 8);
  over.sampling.num_draft_tokens = k + 1;
  const absl::Status s = h.sched().Validate(over);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("mtp_draft_tokens"));
  over.sampling.num_draft_tokens = -1;
  EXPECT_EQ(h.sched().Validate(over).code(), absl::StatusCode::kInvalidArgument);
  over.sampling.num_draft_tokens = k;
  EXPECT_TRUE(h.sched().Validate(over).ok());
}

// Accepted drafts by position: a run stops at its first rejection, so the counts never grow with
// the position, and they sum to the accepted total.
TEST_P(MtpTest, AcceptedCountsPerPositionAddUp) {
  const int k = GetParam();
  SchedulerOptions so;
  so.num_draft_tokens = k;
  Harness h({}, so);
  for (int i = 0; i < 6; ++i) h.Add(i, MakeRequest(Prompt(5 + i, i), 40));
  h.RunToCompletion();
  const SchedulerStats st = h.sched().Stats();
  ASSERT_EQ(st.num_accepted_per_position.size(), static_cast<size_t>(k));
  int64_t sum = 0;
  for (int i = 0; i < k; ++i) {
    sum += st.num_accepted_per_position[i];
    if (i > 0) {
      EXPECT_LE(st.num_accepted_per_position[i], st.num_accepted_per_position[i - 1]);
    }
  }
  EXPECT_EQ(sum, st.num_accepted_draft_tokens);
  EXPECT_GT(st.num_accepted_per_position[0], 0);
  EXPECT_LE(st.num_accepted_per_position[0], st.num_drafts);
  EXPECT_LE(st.num_draft_tokens, st.num_drafts * k);
}

INSTANTIATE_TEST_SUITE_P(DraftTokens, MtpTest, ::testing::Values(1, 2, 3, 5));

// Sampling with drafts keeps the target distribution. The MTP draft is a deterministic guess d,
// i.e. a draft distribution q that is one-hot at d; the speculative-sampling rule (accept d with
// probability min(1, p(d) / q(d)) = p(d), else draw from max(p - q, 0) renormalised = p without d)
// is what verification does: draw the target's token x ~ p with the request's seeded stream and
// accept d when x == d. A model with one fixed next-token distribution p over 5 tokens, whose
// draft is always token 1: over 4000 seeded requests the tokens at every position follow p
// (chi-square, 4 degrees of freedom, well past the 1e-4 tail) and drafts are accepted at rate p(1).
class FixedDistributionModel : public Model {
 public:
  static constexpr int kVocab = 5;
  static constexpr int kHidden = 2;
  static constexpr int kDraft = 1;
  FixedDistributionModel() {
    config_.vocab_size = kVocab;
    config_.hidden_size = kHidden;
    config_.num_hidden_layers = 1;
    config_.num_nextn_predict_layers = 1;
    config_.max_position_embeddings = 64;
    geometry_.block_size = 4;
    geometry_.num_blocks = 4096;
  }
  static std::vector<float> Probabilities() { return {0.40f, 0.25f, 0.20f, 0.10f, 0.05f}; }
  const ModelConfig& config() const override { return config_; }
  const KvCacheGeometry& kv_geometry() const override { return geometry_; }
  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) override {
    return Rows(batch, /*draft=*/false, result);
  }
  absl::Status ForwardMtp(const ForwardBatch& batch, const std::vector<std::vector<float>>&,
                          ForwardResult* result) override {
    return Rows(batch, /*draft=*/true, result);
  }

 private:
  absl::Status Rows(const ForwardBatch& batch, bool draft, ForwardResult* result) {
    result->seqs.clear();
    for (const SequenceSlice& s : batch.seqs) {
      SequenceOutput out;
      const int rows = s.all_logits ? static_cast<int>(s.token_ids.size()) : 1;
      for (int r = 0; r < rows; ++r) {
        for (int v = 0; v < kVocab; ++v) {
          out.logits.push_back(draft ? (v == kDraft ? 10.0f : 0.0f)
                                     : std::log(Probabilities()[v]));
        }
      }
      if (s.want_hidden) out.hidden.assign(static_cast<size_t>(rows) * kHidden, 0.0f);
      result->seqs.push_back(std::move(out));
    }
    return absl::OkStatus();
  }
  ModelConfig config_;
  KvCacheGeometry geometry_;
};

TEST(MtpSamplingTest, DraftsKeepTheTargetDistributionAndAcceptAtTheDraftsProbability) {
  constexpr int kRequests = 4000, kTokens = 4;
  FixedDistributionModel model;
  SchedulerOptions so;
  so.num_draft_tokens = 3;
  so.max_num_seqs = 64;
  so.max_num_batched_tokens = 512;
  std::map<int64_t, std::vector<int32_t>> out;
  Scheduler sched(&model, so, [&](int64_t id, TokenEvent ev) {
    if (ev.token_id >= 0) out[id].push_back(ev.token_id);
  });
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(sched.Add(i, MakeRequest({0, 2}, kTokens, /*temperature=*/1.0f), 1000 + i).ok());
  }
  for (int i = 0; i < 100000 && sched.HasWork(); ++i) ASSERT_TRUE(sched.Step().ok());
  ASSERT_FALSE(sched.HasWork());
  const std::vector<float> p = FixedDistributionModel::Probabilities();
  for (int pos = 0; pos < kTokens; ++pos) {
    std::vector<int> counts(FixedDistributionModel::kVocab, 0);
    for (const auto& [id, tokens] : out) {
      ASSERT_EQ(tokens.size(), static_cast<size_t>(kTokens)) << "request " << id;
      ++counts[tokens[pos]];
    }
    double chi2 = 0;
    for (int v = 0; v < FixedDistributionModel::kVocab; ++v) {
      const double expected = p[v] * kRequests;
      chi2 += (counts[v] - expected) * (counts[v] - expected) / expected;
    }
    std::printf("position %d: chi2=%.2f counts=%d,%d,%d,%d,%d\n", pos, chi2, counts[0], counts[1],
                counts[2], counts[3], counts[4]);
    EXPECT_LT(chi2, 23.5) << "position " << pos;  // P(chi2_4 > 23.5) ~ 1e-4
  }
  const SchedulerStats st = sched.Stats();
  ASSERT_GT(st.num_drafts, 2000);
  // The first draft of every verify step is accepted with probability p(1); binomial sd < 0.01.
  const double rate = static_cast<double>(st.num_accepted_per_position[0]) / st.num_drafts;
  std::printf("first-draft acceptance %.4f over %lld verify steps (p(draft) = %.2f)\n", rate,
              static_cast<long long>(st.num_drafts), p[FixedDistributionModel::kDraft]);
  EXPECT_NEAR(rate, p[FixedDistributionModel::kDraft], 0.04);
}

// Random arrivals and aborts under a tight cache and budget; every finished request must equal
// its solo run.
TEST(SchedulerTest, RandomizedLoadMatchesSoloRuns) {
  for (int k : {0, 2}) {
    std::mt19937 rng(100 + k);
    SchedulerOptions so;
    so.max_num_batched_tokens = 12;
    so.max_num_seqs = 5;
    so.num_draft_tokens = k;
    FakeModel::Options mo;
    mo.num_blocks = 30;
    Harness h(mo, so);
    std::map<int64_t, Request> reqs;
    std::set<int64_t> aborted;
    int64_t next = 0;
    for (int step = 0; step < 400; ++step) {
      if (rng() % 3 == 0 && next < 40) {
        // Prompts share prefixes often (two families).
        auto p = Prompt(1 + rng() % 20, rng() % 2);
        p.resize(1 + rng() % p.size());
        Request r = MakeRequest(p, 1 + rng() % 25, rng() % 2 ? 0.0f : 0.9f, rng());
        reqs[next] = r;
        h.Add(next++, r);
      }
      if (rng() % 25 == 0 && next > 0) {
        const int64_t id = rng() % next;
        if (h.sched().Abort(id)) aborted.insert(id);
      }
      if (h.sched().HasWork()) h.StepOnce();
      if (::testing::Test::HasFatalFailure()) return;
    }
    h.RunToCompletion();
    for (auto& [id, r] : reqs) {
      if (aborted.count(id)) continue;
      EXPECT_EQ(h.out()[id].tokens, RunAlone(r).tokens) << "k=" << k << " id=" << id;
    }
  }
}

// Steps in flight: a FakeModel that runs each step only when it is collected (a pipeline's
// deferred execution) and counts breaches of Model::Submit's contract. Outputs equal the solo
// runs, so micro-batching changes neither tokens nor KV.
class InFlightTest : public ::testing::TestWithParam<int> {
 protected:
  FakeModel::Options Deferred(int num_blocks = 64) const {
    FakeModel::Options mo;
    mo.num_blocks = num_blocks;
    mo.max_steps_in_flight = GetParam();
    return mo;
  }
};

TEST_P(InFlightTest, MicroBatchesOverDisjointSequencesMatchRunningAlone) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 7;
  so.max_num_seqs = 4;
  Harness h(Deferred(), so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.RunToCompletion();
  ExpectSameAsAlone(h, rs);
  EXPECT_EQ(h.model().contract_violations(), 0);
  EXPECT_EQ(h.sched().max_steps_in_flight(), GetParam());
  EXPECT_EQ(h.model().max_outstanding(), GetParam());
  const SchedulerStats st = h.sched().Stats();
  EXPECT_EQ(st.max_steps_in_flight_observed, GetParam());
  EXPECT_EQ(st.num_steps_completed, st.num_steps);
  EXPECT_EQ(st.num_steps_in_flight, 0);
  EXPECT_LE(h.model().max_batch_tokens(), 7);
}

// Equal decoding sequences split into micro-batches of equal size (balanced by tokens).
TEST_P(InFlightTest, DecodeMicroBatchesAreBalanced) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 64;
  so.max_num_seqs = 8;
  Harness h(Deferred(), so);
  for (int i = 0; i < 6; ++i) h.Add(i, MakeRequest(Prompt(2, i), 12));
  h.RunToCompletion();
  EXPECT_EQ(h.model().contract_violations(), 0);
  // Each micro-batch runs at most ceil(6 / in-flight) decoding sequences, except the first,
  // whose prompts share the budget with nothing in flight.
  EXPECT_LE(h.model().max_batch_tokens(), 2 * ((6 + GetParam() - 1) / GetParam()) + 2);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(h.out()[i].tokens, RunAlone(MakeRequest(Prompt(2, i), 12)).tokens);
}

TEST_P(InFlightTest, PreemptionWaitsForQueuedStepsAndKeepsOutputs) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 16;
  so.enable_prefix_caching = false;
  Harness h(Deferred(24), so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.RunToCompletion();
  EXPECT_GT(h.sched().Stats().num_preemptions, 0);
  ExpectSameAsAlone(h, rs);
  EXPECT_EQ(h.model().contract_violations(), 0);
  EXPECT_GE(h.model().max_outstanding(), 2);
}

// An abort of a sequence whose step is outstanding ends its stream at once; the model releases
// it only once that step is collected (no rank frees blocks a queued step uses).
TEST_P(InFlightTest, AbortMidFlightReleasesAfterTheStepComesBack) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 8;
  Harness h(Deferred(), so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  h.StepOnce();  // one micro-batch outstanding
  ASSERT_EQ(h.sched().Stats().num_steps_in_flight, 1);
  EXPECT_TRUE(h.sched().Abort(0));  // in the outstanding step
  EXPECT_TRUE(h.sched().Abort(0));  // already aborted: no second event
  EXPECT_EQ(h.out()[0].reason, FinishReason::kAborted);
  EXPECT_EQ(h.out()[0].num_finished_events, 1);
  const auto& released = h.model().released();
  EXPECT_EQ(std::find(released.begin(), released.end(), 0), released.end());
  h.RunToCompletion();
  EXPECT_NE(std::find(released.begin(), released.end(), 0), released.end());
  EXPECT_EQ(h.model().contract_violations(), 0);
  EXPECT_EQ(h.out()[0].num_finished_events, 1);
  for (size_t i = 1; i < rs.size(); ++i) EXPECT_EQ(h.out()[i].tokens, RunAlone(rs[i]).tokens) << i;
}

TEST_P(InFlightTest, AbortAllCollectsOutstandingStepsFirst) {
  SchedulerOptions so;
  so.max_num_batched_tokens = 8;
  Harness h(Deferred(), so);
  auto rs = MixedRequests();
  for (size_t i = 0; i < rs.size(); ++i) h.Add(i, rs[i]);
  for (int i = 0; i < GetParam(); ++i) h.StepOnce();
  ASSERT_GE(h.sched().Stats().num_steps_in_flight, 1);
  h.sched().AbortAll();
  EXPECT_FALSE(h.sched().HasWork());
  EXPECT_EQ(h.sched().Stats().num_steps_in_flight, 0);
  EXPECT_EQ(h.model().contract_violations(), 0);
  EXPECT_EQ(h.sched().block_manager().NumFreeBlocks(), h.sched().block_manager().num_blocks());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(h.out()[i].reason, FinishReason::kAborted) << i;
    EXPECT_EQ(h.out()[i].num_finished_events, 1) << i;
  }
}

TEST_P(InFlightTest, MtpKeepsOneStepInFlight) {
  SchedulerOptions so;
  so.num_draft_tokens = 2;
  Harness h(Deferred(), so);
  h.Add(0, MakeRequest(Prompt(9, 3), 20));
  h.Add(1, MakeRequest(Prompt(5, 4), 20));
  h.RunToCompletion();
  EXPECT_EQ(h.sched().max_steps_in_flight(), 1);
  EXPECT_EQ(h.model().max_outstanding(), 1);
  EXPECT_EQ(h.out()[0].tokens, h.model().Greedy(Prompt(9, 3), 20));
}

TEST_P(InFlightTest, RandomizedLoadWithAbortsMatchesSoloRuns) {
  std::mt19937 rng(7 + GetParam());
  SchedulerOptions so;
  so.max_num_batched_tokens = 12;
  so.max_num_seqs = 5;
  Harness h(Deferred(30), so);
  std::map<int64_t, Request> reqs;
  std::set<int64_t> aborted;
  int64_t next = 0;
  for (int step = 0; step < 400; ++step) {
    if (rng() % 3 == 0 && next < 40) {
      auto p = Prompt(1 + rng() % 20, rng() % 2);
      p.resize(1 + rng() % p.size());
      Request r = MakeRequest(p, 1 + rng() % 25, rng() % 2 ? 0.0f : 0.9f, rng());
      reqs[next] = r;
      h.Add(next++, r);
    }
    if (rng() % 25 == 0 && next > 0) {
      const int64_t id = rng() % next;
      if (h.sched().Abort(id)) aborted.insert(id);
    }
    if (h.sched().HasWork()) h.StepOnce();
    if (::testing::Test::HasFatalFailure()) return;
  }
  h.RunToCompletion();
  EXPECT_EQ(h.model().contract_violations(), 0);
  EXPECT_GE(h.model().max_outstanding(), 2);
  for (auto& [id, r] : reqs) {
    if (aborted.count(id)) {
      EXPECT_EQ(h.out()[id].num_finished_events, 1) << id;
      continue;
    }
    EXPECT_EQ(h.out()[id].tokens, RunAlone(r).tokens) << "id=" << id;
  }
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, InFlightTest, ::testing::Values(2, 3));

}  // namespace
}  // namespace glm::engine
