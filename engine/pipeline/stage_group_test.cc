// The head (PipelinedModel) and a follower (StageFollower) of a two-stage replica over fake stage
// models, one thread each, Gloo on 127.0.0.1: a follower that stalls fails the head's step after
// op_timeout, one whose model fails fails it at once, and both errors name the rank.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/dist/in_process_rendezvous.h"
#include "engine/pipeline/pipelined_model.h"
#include "engine/pipeline/stage_follower.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine::pipeline {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr int kHidden = 4, kVocab = 5;

ModelConfig TwoLayerConfig() {
  ModelConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.num_hidden_layers = 2;
  c.index_topk = 2;
  c.indexer_types = {IndexerType::kFull, IndexerType::kFull};
  c.max_position_embeddings = 64;
  return c;
}

// Stage 0 returns a residual of token + position per row; stage 1 returns logits whose argmax
// is (residual[0] + 1) % vocab. Forward can be made to block (a stalled rank) or fail.
class StageModel : public Model {
 public:
  explicit StageModel(bool last) : last_(last), config_(TwoLayerConfig()) {
    geometry_.block_size = 4;
    geometry_.num_blocks = 16;
  }
  const ModelConfig& config() const override { return config_; }
  const KvCacheGeometry& kv_geometry() const override { return geometry_; }
  absl::Status Forward(const ForwardBatch& batch, ForwardResult* result) override {
    ++num_started_;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return !stall_; });
      if (!fail_.ok()) return fail_;
    }
    result->seqs.assign(batch.seqs.size(), SequenceOutput{});
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SequenceSlice& s = batch.seqs[i];
      SequenceOutput& out = result->seqs[i];
      if (!last_) {
        for (size_t t = 0; t < s.token_ids.size(); ++t) {
          for (int h = 0; h < kHidden; ++h) {
            out.residual.push_back(static_cast<float>(s.token_ids[t] + s.start_pos + t));
          }
        }
      } else {
        const float r = s.input_residual.at(s.input_residual.size() - kHidden);
        out.logits.assign(kVocab, 0.0f);
        out.logits[(static_cast<int>(r) + 1) % kVocab] = 1.0f;
      }
    }
    return absl::OkStatus();
  }
  absl::Status ForwardMtp(const ForwardBatch&, const std::vector<std::vector<float>>&,
                          ForwardResult*) override {
    return absl::UnimplementedError("no MTP");
  }
  void Stall(bool on) {
    {
      std::lock_guard<std::mutex> l(mu_);
      stall_ = on;
    }
    cv_.notify_all();
  }
  // Forward calls begun so far (a stalled one included). Any thread.
  int num_started() const { return num_started_.load(); }
  void FailWith(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    fail_ = std::move(s);
  }

 private:
  const bool last_;
  ModelConfig config_;
  KvCacheGeometry geometry_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stall_ = false;
  absl::Status fail_;
  std::atomic<int> num_started_{0};
};

struct TwoStages {
  InProcessRendezvous rendezvous;
  std::unique_ptr<PipelinedModel> head;
  StageModel* head_model = nullptr;  // owned by head
  std::unique_ptr<StageModel> model1;
  StageModel* follower_model = nullptr;  // model1
  std::unique_ptr<StageFollower> follower;  // declared last: goes before model1
};

std::unique_ptr<TwoStages> Start(std::chrono::milliseconds op_timeout) {
  auto s = std::make_unique<TwoStages>();
  const ModelConfig config = TwoLayerConfig();
  std::unique_ptr<StageGroup> groups[2];
  absl::Status status[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ShardTopology t;
      t.pp_rank = r;
      t.pp_size = 2;
      t.first_layer = r;
      t.last_layer = r;
      t.rendezvous = &s->rendezvous;
      t.group_key = "stage_group_test";
      t.connect_timeout = std::chrono::seconds(20);
      t.op_timeout = op_timeout;
      auto g = StageGroup::Create(t, config);
      status[r] = g.status();
      if (!g.ok()) return;
      auto blocks = (*g)->AgreeKvBlocks(16);
      status[r] = blocks.status();
      if (blocks.ok()) groups[r] = *std::move(g);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  if (!groups[0] || !groups[1]) return nullptr;
  auto head_model = std::make_unique<StageModel>(false);
  s->head_model = head_model.get();
  s->head = std::make_unique<PipelinedModel>(std::move(head_model), std::move(groups[0]), 16);
  s->model1 = std::make_unique<StageModel>(true);
  s->follower_model = s->model1.get();
  s->follower = std::make_unique<StageFollower>(s->model1.get(), std::move(groups[1]));
  return s;
}

ForwardBatch OneSlice(int32_t token, int32_t start_pos) {
  ForwardBatch b;
  SequenceSlice s;
  s.seq_id = 1;
  s.token_ids = {token};
  s.start_pos = start_pos;
  s.block_table = {0, 1};
  b.seqs.push_back(s);
  return b;
}

int Argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST(StageGroupTest, StepsCrossTheStagesAndTheFollowerStopsWithTheHead) {
  auto s = Start(std::chrono::seconds(5));
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < 3; ++i) {
    ForwardResult r;
    ASSERT_TRUE(s->head->Forward(OneSlice(2, i), &r).ok());
    ASSERT_EQ(r.seqs.size(), 1u);
    EXPECT_EQ(Argmax(r.seqs[0].logits), (2 + i + 1) % kVocab);
  }
  s->head->ReleaseSequence(1);
  s->head->Stop();
  for (int i = 0; i < 500 && !s->follower->done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(s->follower->done());
  EXPECT_TRUE(s->follower->status().ok()) << s->follower->status();
  EXPECT_EQ(s->follower->num_steps(), 3);
  EXPECT_EQ(s->follower->num_messages(), 4);  // 3 steps and the stop
}

// A slice that asks for logprobs is drawn on the last stage: the head gets the token, its logprob
// and the k pairs, not the vocab row; slices without stay logits; a greedy draw is the argmax.
TEST(StageGroupTest, LogprobSlicesComeBackAsTokenAndPairsNotTheRow) {
  auto s = Start(std::chrono::seconds(5));
  ASSERT_NE(s, nullptr);
  ForwardBatch batch = OneSlice(2, 0);
  batch.seqs.push_back(OneSlice(3, 0).seqs[0]);
  batch.seqs[1].seq_id = 2;
  batch.seqs[1].block_table = {2, 3};
  batch.seqs[0].sample.logprobs = 2;  // greedy (temperature 0)
  ForwardResult r;
  ASSERT_TRUE(s->head->Forward(batch, &r).ok());
  ASSERT_EQ(r.seqs.size(), 2u);
  const SequenceOutput& drawn = r.seqs[0];
  EXPECT_TRUE(drawn.logits.empty());
  EXPECT_EQ(drawn.sampled_token, 3);  // the stage's argmax: (2 + 0 + 1) % vocab
  // Logits {0, 0, 0, 1, 0}: log_softmax = 1 - log(4 + e) at the peak, -log(4 + e) elsewhere.
  const double lse = std::log(4.0 + std::exp(1.0));
  EXPECT_NEAR(drawn.sampled_logprob, 1.0 - lse, 1e-6);
  ASSERT_EQ(drawn.top_logprobs.size(), 2u);
  EXPECT_EQ(drawn.top_logprobs[0].first, 3);
  EXPECT_EQ(drawn.top_logprobs[0].second, drawn.sampled_logprob);
  EXPECT_EQ(drawn.top_logprobs[1].first, 0);  // the ties below it: lowest id first
  EXPECT_NEAR(drawn.top_logprobs[1].second, -lse, 1e-6);
  EXPECT_EQ(Argmax(r.seqs[1].logits), (3 + 1) % kVocab);
  EXPECT_EQ(r.seqs[1].sampled_token, -1);
  EXPECT_TRUE(r.seqs[1].top_logprobs.empty());
}

// Two steps outstanding (max_steps_in_flight = pp_size = 2): both go out before either result is
// collected, results come back in submission order, and the head refuses a third or an
// out-of-order collect without failing the group.
TEST(StageGroupTest, TwoStepsInFlightComeBackInOrder) {
  auto s = Start(std::chrono::seconds(5));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->head->max_steps_in_flight(), 2);
  ForwardBatch b = OneSlice(3, 0);
  b.seqs[0].seq_id = 2;
  b.seqs[0].block_table = {2, 3};
  absl::StatusOr<int64_t> first = s->head->Submit(OneSlice(2, 0));
  absl::StatusOr<int64_t> second = s->head->Submit(b);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(s->head->num_steps_in_flight(), 2);
  EXPECT_EQ(s->head->Submit(OneSlice(1, 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ForwardResult r;
  EXPECT_EQ(s->head->Collect(*second, &r).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s->head->Collect(*first, &r).ok());
  EXPECT_EQ(Argmax(r.seqs.at(0).logits), (2 + 1) % kVocab);
  ASSERT_TRUE(s->head->Collect(*second, &r).ok());
  EXPECT_EQ(Argmax(r.seqs.at(0).logits), (3 + 1) % kVocab);
  s->head->Stop();
  for (int i = 0; i < 500 && !s->follower->done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(s->follower->status().ok()) << s->follower->status();
  EXPECT_EQ(s->follower->num_steps(), 2);
}


// The stages overlap: while stage 1 is inside step 1 (stalled), the head runs stage 0 of step 2.
TEST(StageGroupTest, StageZeroRunsTheNextStepWhileStageOneWorks) {
  auto s = Start(std::chrono::seconds(10));
  ASSERT_NE(s, nullptr);
  s->follower_model->Stall(true);
  absl::StatusOr<int64_t> first = s->head->Submit(OneSlice(2, 0));
  ASSERT_TRUE(first.ok()) << first.status();
  for (int i = 0; i < 500 && s->follower_model->num_started() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(s->follower_model->num_started(), 1);  // stage 1 is inside step 1
  ForwardBatch b = OneSlice(3, 0);
  b.seqs[0].seq_id = 2;
  b.seqs[0].block_table = {2, 3};
  absl::StatusOr<int64_t> second;
  std::thread submit([&] { second = s->head->Submit(b); });
  for (int i = 0; i < 500 && s->head_model->num_started() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s->head_model->num_started(), 2);  // stage 0 ran step 2 ...
  EXPECT_EQ(s->follower_model->num_started(), 1);  // ... while stage 1 still works on step 1
  s->follower_model->Stall(false);
  submit.join();
  ASSERT_TRUE(second.ok()) << second.status();
  ForwardResult r;
  ASSERT_TRUE(s->head->Collect(*first, &r).ok());
  EXPECT_EQ(Argmax(r.seqs.at(0).logits), (2 + 1) % kVocab);
  ASSERT_TRUE(s->head->Collect(*second, &r).ok());
  EXPECT_EQ(Argmax(r.seqs.at(0).logits), (3 + 1) % kVocab);
  s->head->Stop();
}


TEST(StageGroupTest, AStalledFollowerFailsTheStepAfterOpTimeout) {
  const auto op_timeout = std::chrono::milliseconds(1000);
  auto s = Start(op_timeout);
  ASSERT_NE(s, nullptr);
  s->follower_model->Stall(true);
  const auto t0 = Clock::now();
  ForwardResult r;
  absl::Status st = s->head->Forward(OneSlice(1, 0), &r);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(st.message(), HasSubstr("world rank 1 (pp 1, tp 0)"));
  EXPECT_GE(took, op_timeout);
  EXPECT_LT(took, op_timeout * 3);
  // The head closed its side: the follower fails as soon as it wakes up.
  s->follower_model->Stall(false);
  for (int i = 0; i < 500 && !s->follower->done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(s->follower->done());
  EXPECT_FALSE(s->follower->status().ok());
  // Later steps return the first error.
  EXPECT_EQ(s->head->Forward(OneSlice(1, 1), &r).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(StageGroupTest, AFollowerModelFailureFailsTheHeadAtOnce) {
  auto s = Start(std::chrono::seconds(30));
  ASSERT_NE(s, nullptr);
  s->follower_model->FailWith(absl::InternalError("fake device fault"));
  const auto t0 = Clock::now();
  ForwardResult r;
  absl::Status st = s->head->Forward(OneSlice(1, 0), &r);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("rank 1"));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5)) << "waited for the op timeout";
  for (int i = 0; i < 500 && !s->follower->done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(s->follower->status().message(), HasSubstr("fake device fault"));
  EXPECT_THAT(s->follower->status().message(), HasSubstr("pp stage 1"));
}

}  // namespace
}  // namespace glm::engine::pipeline
