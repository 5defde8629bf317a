// A replica spread over pipeline (and tensor) parallel ranks, one thread per rank in this
// process, InProcessRendezvous + Gloo on 127.0.0.1, on the golden fixtures (tests/golden): the
// head serves exactly the tokens of the single-process engine, with uneven partitions and
// boundaries before IndexShare "shared" layers; followers refuse requests and report progress;
// a follower that goes away fails the head's requests within seconds.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/dist/in_process_rendezvous.h"
#include "engine/engine.h"
#include "engine/golden_fixtures_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using Partition = std::vector<std::pair<int, int>>;  // inclusive [first, last] per pp stage

golden::Fixture FixtureNamed(const std::string& name) {
  for (auto& fx : golden::LoadFixtures()) {
    if (fx.name == name) return fx;
  }
  ADD_FAILURE() << "fixture " << name << " not found in " << golden::Dir();
  return {};
}

// Small chunks so that prompts span several steps and requests of different lengths share
// steps (as engine_golden_test's ConcurrentChunkedGreedyMatchesReference).
EngineOptions SmallChunks(const std::string& dir, int mtp = 0) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.backend = "cpu";
  eo.kv_block_size = 4;
  eo.kv_num_blocks = 256;
  eo.max_num_batched_tokens = 7;
  eo.max_num_seqs = 4;
  eo.num_threads = 1;
  eo.mtp_draft_tokens = mtp;
  return eo;
}

std::string UniqueGroupKey() {
  static std::atomic<int> next{0};
  return absl::StrCat("test/replica", next++, "/epoch1");
}

// One replica's ranks, created together (Create blocks until every rank has joined).
struct Replica {
  std::unique_ptr<InProcessRendezvous> rendezvous = std::make_unique<InProcessRendezvous>();
  std::vector<std::unique_ptr<Engine>> ranks;  // world-rank order; [0] is the head
  std::vector<absl::Status> create_status;
  Engine& head() { return *ranks[0]; }
};

std::unique_ptr<Replica> StartReplica(
    const EngineOptions& base, const Partition& stages, int tp_size = 1,
    std::chrono::milliseconds op_timeout = std::chrono::seconds(3)) {
  auto replica = std::make_unique<Replica>();
  const int pp_size = static_cast<int>(stages.size());
  const int world = pp_size * tp_size;
  replica->ranks.resize(world);
  replica->create_status.resize(world);
  const std::string key = UniqueGroupKey();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      EngineOptions eo = base;
      ShardTopology& t = eo.shard;
      t.pp_rank = r / tp_size;
      t.pp_size = pp_size;
      t.tp_rank = r % tp_size;
      t.tp_size = tp_size;
      t.first_layer = stages[t.pp_rank].first;
      t.last_layer = stages[t.pp_rank].second;
      t.rendezvous = replica->rendezvous.get();
      t.group_key = key;
      t.connect_timeout = std::chrono::seconds(20);
      t.op_timeout = op_timeout;
      auto engine = Engine::Create(eo);
      replica->create_status[r] = engine.status();
      if (engine.ok()) replica->ranks[r] = *std::move(engine);
    });
  }
  for (auto& t : threads) t.join();
  return replica;
}

// Polls `done` until it holds or `limit` passes (followers count a step just after handing its
// result on, so the head can see the step finish first).
template <typename Pred>
bool WaitFor(Pred done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void ExpectStarted(const Replica& replica) {
  for (size_t r = 0; r < replica.ranks.size(); ++r) {
    ASSERT_TRUE(replica.create_status[r].ok()) << "rank " << r << ": " << replica.create_status[r];
  }
}

// Submits every case of the fixture at once (different prompt lengths, chunked prefill) plus a
// truncated prompt, and returns each request's tokens.
std::vector<std::vector<int32_t>> RunConcurrent(Engine& engine, const golden::Fixture& fx) {
  std::vector<std::vector<int32_t>> prompts;
  for (const golden::Case& c : fx.cases) prompts.push_back(c.prompt);
  const auto& m = fx.main().prompt;
  prompts.emplace_back(m.begin(), m.begin() + m.size() / 2);
  std::vector<RequestHandle> handles;
  for (const auto& p : prompts) {
    auto h = engine.Submit(golden::GreedyRequest(p, 24));
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) handles.push_back(*h);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& h : handles) {
    TokenEvent last;
    out.push_back(h.stream->CollectTokens(&last));
    EXPECT_EQ(last.finish_reason, FinishReason::kLength) << last.error;
  }
  return out;
}

struct PipelineCase {
  std::string fixture;
  Partition stages;
  int mtp = 0;
};

void PrintTo(const PipelineCase& pc, std::ostream* os) {
  *os << pc.fixture << " stages";
  for (const auto& [first, last] : pc.stages) *os << " [" << first << "," << last << "]";
  if (pc.mtp > 0) *os << " mtp " << pc.mtp;
}

std::string CaseName(const ::testing::TestParamInfo<PipelineCase>& info) {
  std::string name = info.param.fixture + "_pp" + std::to_string(info.param.stages.size());
  for (const auto& [first, last] : info.param.stages) {
    name += absl::StrCat("_", first, "to", last);
  }
  if (info.param.mtp > 0) name += absl::StrCat("_mtp", info.param.mtp);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

class PipelineGoldenTest : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(PipelineGoldenTest, GreedyTokensEqualTheSingleProcessEngine) {
  const PipelineCase& pc = GetParam();
  const golden::Fixture fx = FixtureNamed(pc.fixture);
  ASSERT_FALSE(fx.name.empty());
  const EngineOptions options = SmallChunks(fx.dir, pc.mtp);

  std::vector<std::vector<int32_t>> want;
  {
    auto single = Engine::Create(options);
    ASSERT_TRUE(single.ok()) << single.status();
    want = RunConcurrent(**single, fx);
  }
  // The single-process engine itself matches transformers (engine_golden_test); check the
  // 24-token prefix here too so a broken baseline cannot hide a broken pipeline.
  for (size_t i = 0; i < fx.cases.size(); ++i) {
    ASSERT_EQ(want[i], std::vector<int32_t>(fx.cases[i].greedy.begin(),
                                            fx.cases[i].greedy.begin() + 24))
        << "single-process case " << i;
  }

  auto replica = StartReplica(options, pc.stages);
  ExpectStarted(*replica);
  EXPECT_TRUE(replica->head().is_head());
  const std::vector<std::vector<int32_t>> got = RunConcurrent(replica->head(), fx);
  EXPECT_EQ(got, want);
  if (pc.mtp > 0) {
    EXPECT_GT(replica->head().Stats().num_draft_tokens, 0);
  }
  ASSERT_TRUE(replica->head().Drain().ok());
  // Every follower served every step the head ran.
  const int64_t head_steps = replica->head().Stats().num_steps;
  for (size_t r = 1; r < replica->ranks.size(); ++r) {
    EXPECT_FALSE(replica->ranks[r]->is_head());
    Engine& follower = *replica->ranks[r];
    EXPECT_TRUE(WaitFor([&] { return follower.Stats().num_steps >= head_steps; }))
        << "rank " << r << " served " << follower.Stats().num_steps << " of " << head_steps;
    EXPECT_TRUE(replica->ranks[r]->status().ok()) << replica->ranks[r]->status();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Partitions, PipelineGoldenTest,
    ::testing::Values(
        // tiny-sparse: layers 2 and 4 are IndexShare "shared" (reuse the previous full top-k).
        PipelineCase{"tiny-sparse", {{0, 1}, {2, 4}}},               // boundary before shared 2
        PipelineCase{"tiny-sparse", {{0, 0}, {1, 3}, {4, 4}}},       // before shared 4
        PipelineCase{"tiny-sparse", {{0, 1}, {2, 2}, {3, 3}, {4, 4}}},  // shared, full, shared
        PipelineCase{"tiny-moe", {{0, 0}, {1, 1}, {2, 3}, {4, 4}}},
        PipelineCase{"tiny-moe", {{0, 2}, {3, 4}}},
        PipelineCase{"tiny-dense", {{0, 0}, {1, 1}, {2, 2}}},
        // MTP drafts: the MTP layer lives on the last stage; hidden rows travel to the head
        // and back.
        PipelineCase{"tiny-mtp", {{0, 1}, {2, 2}}, 2}),
    CaseName);

// A request's stream with its logprobs.
struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top;
  std::vector<float> prompt_logits;
  FinishReason reason = FinishReason::kNone;
};

Collected Collect(const RequestHandle& h) {
  Collected c;
  TokenEvent ev;
  while (h.stream->Next(&ev)) {
    if (ev.token_id >= 0) {
      c.tokens.push_back(ev.token_id);
      c.logprobs.push_back(ev.logprob);
      c.top.push_back(ev.top_logprobs);
    }
    if (!ev.prompt_logits.empty()) c.prompt_logits = ev.prompt_logits;
    if (ev.finished) {
      c.reason = ev.finish_reason;
      EXPECT_TRUE(ev.error.ok()) << ev.error;
      break;
    }
  }
  return c;
}

// Greedy with logprobs (and the prompt's logits, to check the first token's row by hand),
// seeded sampling with 20 alternatives, and greedy without logprobs, all at once.
std::vector<Collected> RunLogprobRequests(Engine& engine, const golden::Fixture& fx) {
  std::vector<Request> rs;
  rs.push_back(golden::GreedyRequest(fx.main().prompt, 16));
  rs.back().sampling.logprobs = 5;
  rs.back().return_prompt_logits = true;
  const golden::Case& other = fx.cases.size() > 1 ? fx.cases[1] : fx.main();
  rs.push_back(golden::GreedyRequest(other.prompt, 16));
  rs.back().sampling.temperature = 0.9f;
  rs.back().sampling.top_p = 0.95f;
  rs.back().sampling.seed = 7;
  rs.back().sampling.logprobs = 20;
  rs.push_back(golden::GreedyRequest(fx.main().prompt, 16));
  std::vector<RequestHandle> hs;
  for (Request& r : rs) {
    auto h = engine.Submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) hs.push_back(*h);
  }
  std::vector<Collected> out;
  for (const RequestHandle& h : hs) out.push_back(Collect(h));
  return out;
}

class PipelineLogprobsTest : public ::testing::TestWithParam<PipelineCase> {};

// Asking for logprobs changes no greedy token; a greedy token's logprob is the max of its row's
// log_softmax (the first row checked by hand against the prompt logits); a PP replica, whose
// last stage draws the token and sends only the (id, logprob) pairs to the head, returns the
// single-process engine's tokens and logprobs.
TEST_P(PipelineLogprobsTest, EqualTheSingleProcessEngine) {
  const PipelineCase& pc = GetParam();
  const golden::Fixture fx = FixtureNamed(pc.fixture);
  ASSERT_FALSE(fx.name.empty());
  const EngineOptions options = SmallChunks(fx.dir, pc.mtp);
  std::vector<Collected> want;
  {
    auto single = Engine::Create(options);
    ASSERT_TRUE(single.ok()) << single.status();
    want = RunLogprobRequests(**single, fx);
  }
  ASSERT_EQ(want.size(), 3u);
  const Collected& greedy = want[0];
  EXPECT_EQ(greedy.tokens, std::vector<int32_t>(fx.main().greedy.begin(),
                                                fx.main().greedy.begin() + 16));
  EXPECT_EQ(greedy.tokens, want[2].tokens);
  ASSERT_EQ(greedy.logprobs.size(), greedy.tokens.size());
  for (size_t i = 0; i < greedy.tokens.size(); ++i) {
    ASSERT_EQ(greedy.top[i].size(), 5u) << i;
    EXPECT_EQ(greedy.top[i][0].first, greedy.tokens[i]) << i;
    EXPECT_EQ(greedy.top[i][0].second, greedy.logprobs[i]) << i;
    for (size_t j = 1; j < 5; ++j) EXPECT_GE(greedy.top[i][j - 1].second, greedy.top[i][j].second);
  }
  // The first token's row is the prompt's last logits row: log_softmax by hand.
  const size_t num_prompt = fx.main().prompt.size();
  const size_t vocab = greedy.prompt_logits.size() / num_prompt;
  ASSERT_GT(vocab, 0u);
  const float* row = greedy.prompt_logits.data() + (num_prompt - 1) * vocab;
  double max = row[0], sum = 0;
  for (size_t v = 0; v < vocab; ++v) max = std::max<double>(max, row[v]);
  for (size_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
  double best = -1e30;
  for (size_t v = 0; v < vocab; ++v) best = std::max(best, row[v] - max - std::log(sum));
  EXPECT_NEAR(greedy.logprobs[0], best, 1e-5);
  EXPECT_NEAR(greedy.logprobs[0], row[greedy.tokens[0]] - max - std::log(sum), 1e-5);
  // Sampling: a token the seed picked, with 20 alternatives.
  ASSERT_EQ(want[1].tokens.size(), 16u);
  for (const auto& top : want[1].top) EXPECT_EQ(top.size(), 20u);
  for (const auto& top : want[2].top) EXPECT_TRUE(top.empty());

  auto replica = StartReplica(options, pc.stages);
  ExpectStarted(*replica);
  const std::vector<Collected> got = RunLogprobRequests(replica->head(), fx);
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].tokens, want[r].tokens) << "request " << r;
    ASSERT_EQ(got[r].logprobs.size(), want[r].logprobs.size()) << "request " << r;
    for (size_t i = 0; i < want[r].logprobs.size(); ++i) {
      EXPECT_NEAR(got[r].logprobs[i], want[r].logprobs[i], 1e-5) << r << " token " << i;
      ASSERT_EQ(got[r].top[i].size(), want[r].top[i].size()) << "request " << r << " token " << i;
      for (size_t j = 0; j < want[r].top[i].size(); ++j) {
        EXPECT_EQ(got[r].top[i][j].first, want[r].top[i][j].first) << r << " " << i << " " << j;
        EXPECT_NEAR(got[r].top[i][j].second, want[r].top[i][j].second, 1e-5)
            << r << " " << i << " " << j;
      }
    }
  }
  ASSERT_TRUE(replica->head().Drain().ok());
}

INSTANTIATE_TEST_SUITE_P(
    Partitions, PipelineLogprobsTest,
    ::testing::Values(PipelineCase{"tiny-dense", {{0, 1}, {2, 2}}},
                      // MTP: every row comes back as logits; accepted drafts get logprobs too.
                      PipelineCase{"tiny-mtp", {{0, 1}, {2, 2}}, 2}),
    CaseName);

TEST(PipelineEngineTest, FollowersRefuseRequestsReportProgressAndStopWithTheHead) {
  const golden::Fixture fx = FixtureNamed("tiny-dense");
  ASSERT_FALSE(fx.name.empty());
  // A short op_timeout: the head's idle heartbeats (op_timeout / 4) must keep the group alive
  // through idle spells longer than it.
  auto replica = StartReplica(SmallChunks(fx.dir), {{0, 1}, {2, 2}}, 1,
                              std::chrono::milliseconds(800));
  ExpectStarted(*replica);
  Engine& follower = *replica->ranks[1];
  auto refused = follower.Submit(golden::GreedyRequest(fx.main().prompt, 4));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("not the head shard"));

  // Idle for two op_timeouts (8 heartbeats of op_timeout / 4): nothing fails.
  EXPECT_TRUE(WaitFor([&] { return follower.Stats().num_group_messages >= 8; }));
  EXPECT_EQ(follower.Stats().num_steps, 0);
  EXPECT_FALSE(follower.Stats().failed) << follower.status();

  auto h = replica->head().Submit(golden::GreedyRequest(fx.main().prompt, 8));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->stream->CollectTokens(),
            std::vector<int32_t>(fx.main().greedy.begin(), fx.main().greedy.begin() + 8));
  EXPECT_TRUE(WaitFor([&] { return follower.Stats().num_steps >= 8; }));

  replica->ranks[0].reset();  // the head goes: followers stop cleanly
  EXPECT_TRUE(WaitFor([&] { return follower.Stats().group_done; }));
  EXPECT_TRUE(follower.status().ok()) << follower.status();
  EXPECT_FALSE(follower.Stats().failed);
}

TEST(PipelineEngineTest, AFollowerThatGoesAwayFailsTheHeadsRequestsWithinSeconds) {
  const golden::Fixture fx = FixtureNamed("tiny-sparse");
  ASSERT_FALSE(fx.name.empty());
  auto replica = StartReplica(SmallChunks(fx.dir), {{0, 1}, {2, 3}, {4, 4}});
  ExpectStarted(*replica);
  std::vector<RequestHandle> hs;
  for (const golden::Case& c : fx.cases) {
    auto h = replica->head().Submit(golden::GreedyRequest(c.prompt, 400));
    ASSERT_TRUE(h.ok()) << h.status();
    hs.push_back(*h);
  }
  // Mid-generation: the first request has produced tokens.
  TokenEvent ev;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(hs[0].stream->Next(&ev) && !ev.finished);
  }

  // Steps are in flight (micro-batches, max_steps_in_flight = pp_size) when the stage goes.
  EXPECT_GE(replica->head().Stats().max_steps_in_flight_observed, 2);
  const auto killed_at = Clock::now();
  replica->ranks[1].reset();  // the middle stage leaves; its sockets close
  for (auto& h : hs) {
    TokenEvent last;
    h.stream->CollectTokens(&last);
    EXPECT_EQ(last.finish_reason, FinishReason::kError);
    EXPECT_THAT(last.error.message(), HasSubstr("rank"));
  }
  const auto took = Clock::now() - killed_at;
  EXPECT_LT(took, std::chrono::seconds(3)) << "the head saw the failure only after "
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_FALSE(replica->head().status().ok());
  EXPECT_TRUE(replica->head().Stats().failed);
  auto later = replica->head().Submit(golden::GreedyRequest(fx.main().prompt, 2));
  EXPECT_FALSE(later.ok());
  // The last stage lost its neighbour too: its loop ended with the error.
  Engine& last_stage = *replica->ranks[2];
  EXPECT_TRUE(WaitFor([&] { return last_stage.Stats().group_done; }));
  EXPECT_TRUE(last_stage.Stats().failed);
  EXPECT_FALSE(last_stage.status().ok());
}

TEST(PipelineEngineTest, StagesThatDoNotTileTheModelFailCreateOnEveryRank) {
  const golden::Fixture fx = FixtureNamed("tiny-moe");
  ASSERT_FALSE(fx.name.empty());
  // Layer 2 is held by nobody.
  auto replica = StartReplica(SmallChunks(fx.dir), {{0, 1}, {3, 4}});
  EXPECT_EQ(replica->create_status[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(replica->create_status[1].message(), HasSubstr("starts at layer 3"));
  EXPECT_FALSE(replica->create_status[0].ok());
  EXPECT_THAT(replica->create_status[0].message(), HasSubstr("world rank 1"));
}

// Tensor parallel ranks in a stage (the TP group all-reduces inside the layers) and TP inside
// every stage of a pipeline.
class TensorParallelGoldenTest : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(TensorParallelGoldenTest, GreedyTokensEqualTheReference) {
  const PipelineCase& pc = GetParam();
  const golden::Fixture fx = FixtureNamed(pc.fixture);
  ASSERT_FALSE(fx.name.empty());
  auto replica = StartReplica(SmallChunks(fx.dir, pc.mtp), pc.stages, /*tp_size=*/2);
  ExpectStarted(*replica);
  const std::vector<std::vector<int32_t>> got = RunConcurrent(replica->head(), fx);
  ASSERT_GE(got.size(), fx.cases.size());
  for (size_t i = 0; i < fx.cases.size(); ++i) {
    EXPECT_EQ(got[i], std::vector<int32_t>(fx.cases[i].greedy.begin(),
                                           fx.cases[i].greedy.begin() + 24))
        << "case " << i;
  }
  ASSERT_TRUE(replica->head().Drain().ok());
  for (size_t r = 1; r < replica->ranks.size(); ++r) {
    EXPECT_TRUE(replica->ranks[r]->status().ok()) << "rank " << r << ": "
                                                  << replica->ranks[r]->status();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Partitions, TensorParallelGoldenTest,
    ::testing::Values(PipelineCase{"tiny-moe", {{0, 4}}},                 // TP 2
                      PipelineCase{"tiny-sparse", {{0, 1}, {2, 4}}}),     // TP 2 x PP 2
    CaseName);

// Micro-batches in flight (EngineOptions::max_steps_in_flight): the same greedy ids as the
// single-process engine with one step in flight and with pp_size, and with pp_size the head
// really keeps several steps outstanding.
class PipelineInFlightTest : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(PipelineInFlightTest, GreedyTokensEqualTheSingleProcessEngineAtEveryDepth) {
  const PipelineCase& pc = GetParam();
  const golden::Fixture fx = FixtureNamed(pc.fixture);
  ASSERT_FALSE(fx.name.empty());
  const int tp_size = pc.mtp;  // this suite's third field is the TP size
  EngineOptions options = SmallChunks(fx.dir);
  std::vector<std::vector<int32_t>> want;
  {
    auto single = Engine::Create(options);
    ASSERT_TRUE(single.ok()) << single.status();
    want = RunConcurrent(**single, fx);
  }
  const int pp_size = static_cast<int>(pc.stages.size());
  for (int depth : {1, pp_size}) {
    SCOPED_TRACE(absl::StrCat("max_steps_in_flight ", depth));
    options.max_steps_in_flight = depth;
    auto replica = StartReplica(options, pc.stages, tp_size);
    ExpectStarted(*replica);
    EXPECT_EQ(RunConcurrent(replica->head(), fx), want);
    ASSERT_TRUE(replica->head().Drain().ok());
    const EngineStats st = replica->head().Stats();
    EXPECT_EQ(st.max_steps_in_flight_observed, depth);
    EXPECT_EQ(st.num_steps_completed, st.num_steps);
    EXPECT_EQ(st.num_steps_in_flight, 0);
    for (size_t r = 1; r < replica->ranks.size(); ++r) {
      Engine& follower = *replica->ranks[r];
      EXPECT_TRUE(WaitFor([&] { return follower.Stats().num_steps >= st.num_steps; }))
          << "rank " << r << " served " << follower.Stats().num_steps << " of " << st.num_steps;
      EXPECT_TRUE(follower.status().ok()) << "rank " << r << ": " << follower.status();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Partitions, PipelineInFlightTest,
    ::testing::Values(PipelineCase{"tiny-sparse", {{0, 1}, {2, 4}}, 1},          // PP 2
                      PipelineCase{"tiny-sparse", {{0, 0}, {1, 3}, {4, 4}}, 1},  // PP 3, uneven,
                                                                                 // before shared 4
                      PipelineCase{"tiny-sparse", {{0, 1}, {2, 4}}, 2}),         // TP 2 x PP 2
    [](const ::testing::TestParamInfo<PipelineCase>& info) {
      std::string name = absl::StrCat(info.param.fixture, "_pp", info.param.stages.size(), "_tp",
                                       info.param.mtp);
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

// An abort of a request whose step is outstanding ends its stream with kAborted; the others keep
// their greedy ids and the replica stays healthy.
TEST(PipelineEngineTest, AbortMidFlightLeavesTheOtherRequestsExact) {
  const golden::Fixture fx = FixtureNamed("tiny-sparse");
  ASSERT_FALSE(fx.name.empty());
  auto replica = StartReplica(SmallChunks(fx.dir), {{0, 0}, {1, 3}, {4, 4}});
  ExpectStarted(*replica);
  std::vector<RequestHandle> hs;
  for (const golden::Case& c : fx.cases) {
    auto h = replica->head().Submit(golden::GreedyRequest(c.prompt, 24));
    ASSERT_TRUE(h.ok()) << h.status();
    hs.push_back(*h);
  }
  ASSERT_GE(hs.size(), 2u);
  TokenEvent ev;
  ASSERT_TRUE(hs[0].stream->Next(&ev) && !ev.finished);
  replica->head().Abort(hs[0].id);
  TokenEvent last;
  hs[0].stream->CollectTokens(&last);
  EXPECT_EQ(last.finish_reason, FinishReason::kAborted);
  for (size_t i = 1; i < hs.size(); ++i) {
    EXPECT_EQ(hs[i].stream->CollectTokens(&last),
              std::vector<int32_t>(fx.cases[i].greedy.begin(), fx.cases[i].greedy.begin() + 24))
        << "case " << i;
    EXPECT_EQ(last.finish_reason, FinishReason::kLength) << last.error;
  }
  ASSERT_TRUE(replica->head().Drain().ok());
  EXPECT_GE(replica->head().Stats().max_steps_in_flight_observed, 2);
  EXPECT_EQ(replica->head().Stats().kv_num_free_blocks, replica->head().Stats().kv_num_blocks);
  for (size_t r = 1; r < replica->ranks.size(); ++r) {
    EXPECT_TRUE(replica->ranks[r]->status().ok()) << "rank " << r;
  }
}

}  // namespace
}  // namespace glm::engine
