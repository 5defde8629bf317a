// Self-consistency of the model on random weights: the two MLA forms, chunked prefill, decode
// through the paged cache, batching, and the MTP layer. Agreement with the reference
// implementation is tested by tests/golden.
#include "engine/model/glm_moe_dsa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/random_weights.h"

namespace glm::engine {
namespace {

struct Fixture {
  ModelConfig config;
  InMemoryWeights weights;
  std::unique_ptr<Backend> backend = CreateCpuBackend(2);
};

std::unique_ptr<Model> MakeModel(Fixture& f, bool expanded, int num_blocks = 64) {
  ModelLoadOptions o;
  o.kv = {4, num_blocks};  // small blocks so sequences span several
  o.expanded_prefill = expanded;
  auto m = CreateGlmMoeDsa(f.config, f.weights, f.backend.get(), o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + seed * 11 + 5) % 256;
  return t;
}

// Runs `tokens` through the model in chunks of `chunk`, blocks [first_block, ...); returns the
// logits of every position [n, vocab].
std::vector<float> RunChunked(Model& m, const std::vector<int32_t>& tokens, int chunk,
                              int first_block = 0) {
  const int bs = m.kv_geometry().block_size;
  std::vector<int32_t> table;
  for (int b = 0; b * bs < static_cast<int>(tokens.size()); ++b) table.push_back(first_block + b);
  std::vector<float> all;
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    ForwardBatch batch;
    SequenceSlice s;
    s.seq_id = 1;
    const size_t end = std::min(tokens.size(), start + chunk);
    s.token_ids.assign(tokens.begin() + start, tokens.begin() + end);
    s.start_pos = static_cast<int32_t>(start);
    s.block_table = table;
    s.all_logits = true;
    batch.seqs.push_back(s);
    ForwardResult r;
    absl::Status st = m.Forward(batch, &r);
    EXPECT_TRUE(st.ok()) << st;
    all.insert(all.end(), r.seqs[0].logits.begin(), r.seqs[0].logits.end());
  }
  return all;
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(b[i])));
  }
  return max_abs > 0 ? max_diff / max_abs : max_diff;
}

class ModelTest : public ::testing::TestWithParam<bool /*index_share*/> {
 protected:
  void SetUp() override {
    f_.config = SmallTestConfig(4, 1, GetParam());
    MakeRandomWeights(f_.config, 1234, &f_.weights);
  }
  Fixture f_;
};

TEST_P(ModelTest, ExpandedAndAbsorbedAttentionAgree) {
  auto expanded = MakeModel(f_, true);
  auto absorbed = MakeModel(f_, false);
  const auto prompt = Prompt(23, 1);  // > index_topk: the DSA mask is active
  const auto a = RunChunked(*expanded, prompt, 23);
  const auto b = RunChunked(*absorbed, prompt, 23);
  const double rel = MaxRelDiff(a, b);
  EXPECT_LT(rel, 1e-5);
  std::printf("expanded vs absorbed max rel diff %.3g\n", rel);
}

TEST_P(ModelTest, ChunkedPrefillAndDecodeMatchWholePrefill) {
  auto m = MakeModel(f_, true);
  const auto prompt = Prompt(21, 2);
  const auto whole = RunChunked(*m, prompt, 21);
  for (int chunk : {1, 5, 8}) {
    const auto chunked = RunChunked(*m, prompt, chunk, /*first_block=*/10);
    EXPECT_LT(MaxRelDiff(chunked, whole), 1e-5) << "chunk " << chunk;
  }
}

TEST_P(ModelTest, IndexerSelectionChangesTheAnswer) {
  auto sparse = MakeModel(f_, true);
  const auto prompt = Prompt(23, 3);
  const auto a = RunChunked(*sparse, prompt, 23);
  f_.config.index_topk = 1000;  // every key selected: dense attention
  auto dense = MakeModel(f_, true);
  const auto b = RunChunked(*dense, prompt, 23);
  const size_t v = f_.config.vocab_size;
  // Positions < index_topk see all their keys either way; later ones differ.
  std::vector<float> a_head(a.begin(), a.begin() + 4 * v), b_head(b.begin(), b.begin() + 4 * v);
  EXPECT_LT(MaxRelDiff(a_head, b_head), 1e-6);
  EXPECT_GT(MaxRelDiff(a, b), 1e-3);
}

TEST_P(ModelTest, BatchOfMixedSlicesMatchesSeparateRuns) {
  auto m = MakeModel(f_, true);
  const auto p1 = Prompt(9, 4), p2 = Prompt(14, 5), p3 = Prompt(6, 6);
  const auto r1 = RunChunked(*m, p1, 9, 0), r2 = RunChunked(*m, p2, 14, 10),
             r3 = RunChunked(*m, p3, 6, 20);
  const size_t v = f_.config.vocab_size;
  // Now the same in one batch at other blocks: seq 1 prefills all, seq 2 decodes its last token
  // after a prefill of the rest, seq 3 prefills a chunk after its first 2 tokens.
  auto blocks = [](int first, int n) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
  };
  {
    ForwardBatch pre;
    SequenceSlice s2{2, {p2.begin(), p2.end() - 1}, 0, blocks(40, 4), false, false};
    SequenceSlice s3{3, {p3.begin(), p3.begin() + 2}, 0, blocks(50, 2), false, false};
    pre.seqs = {s2, s3};
    ForwardResult r;
    ASSERT_TRUE(m->Forward(pre, &r).ok());
  }
  ForwardBatch batch;
  batch.seqs.push_back({1, p1, 0, blocks(30, 3), true, false});
  batch.seqs.push_back({2, {p2.back()}, 13, blocks(40, 4), false, false});
  batch.seqs.push_back({3, {p3.begin() + 2, p3.end()}, 2, blocks(50, 2), true, true});
  ForwardResult r;
  ASSERT_TRUE(m->Forward(batch, &r).ok());
  ASSERT_EQ(r.seqs.size(), 3u);
  EXPECT_LT(MaxRelDiff(r.seqs[0].logits, r1), 1e-5);
  EXPECT_LT(MaxRelDiff(r.seqs[1].logits, std::vector<float>(r2.end() - v, r2.end())), 1e-5);
  EXPECT_LT(MaxRelDiff(r.seqs[2].logits, std::vector<float>(r3.begin() + 2 * v, r3.end())), 1e-5);
  EXPECT_EQ(r.seqs[2].hidden.size(), 4u * f_.config.hidden_size);
  EXPECT_TRUE(r.seqs[0].hidden.empty());
}

TEST_P(ModelTest, MtpDraftIsChunkInvariant) {
  auto m = MakeModel(f_, true);
  const auto prompt = Prompt(12, 7);
  const int64_t H = f_.config.hidden_size;
  // Main model hidden rows for every prompt position.
  ForwardBatch b;
  b.seqs.push_back({1, prompt, 0, {0, 1, 2}, true, true});
  ForwardResult main;
  ASSERT_TRUE(m->Forward(b, &main).ok());
  ASSERT_EQ(main.seqs[0].hidden.size(), prompt.size() * H);
  // MTP over positions 0..10: hidden at t with token t+1.
  auto run = [&](int chunk) {
    std::vector<float> out;
    for (int start = 0; start < 11; start += chunk) {
      const int end = std::min(11, start + chunk);
      ForwardBatch mb;
      mb.seqs.push_back({1, {prompt.begin() + start + 1, prompt.begin() + end + 1}, start,
                         {5, 6, 7}, true, false});
      std::vector<std::vector<float>> hidden = {std::vector<float>(
          main.seqs[0].hidden.begin() + start * H, main.seqs[0].hidden.begin() + end * H)};
      ForwardResult r;
      absl::Status st = m->ForwardMtp(mb, hidden, &r);
      EXPECT_TRUE(st.ok()) << st;
      out.insert(out.end(), r.seqs[0].logits.begin(), r.seqs[0].logits.end());
    }
    return out;
  };
  const auto whole = run(11), chunked = run(3);
  ASSERT_EQ(whole.size(), 11u * f_.config.vocab_size);
  for (float x : whole) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LT(MaxRelDiff(chunked, whole), 1e-5);
}

// Two pipeline stages (residual + IndexShare top-k handed over) give the one-stage answer, for
// prefill and for a decode step after it.
TEST_P(ModelTest, PipelineStagesMatchOneStage) {
  auto whole = MakeModel(f_, true);
  const auto prompt = Prompt(17, 8);
  const auto ref = RunChunked(*whole, prompt, 17);
  const size_t v = f_.config.vocab_size;
  for (int split : {1, 2}) {  // layer 2 is "shared" when index_share: top-k crosses the stage
    ModelLoadOptions o;
    o.kv = {4, 64};
    o.first_layer = 0;
    o.last_layer = split - 1;
    auto s0 = CreateGlmMoeDsa(f_.config, f_.weights, f_.backend.get(), o);
    o.first_layer = split;
    o.last_layer = -1;
    auto s1 = CreateGlmMoeDsa(f_.config, f_.weights, f_.backend.get(), o);
    ASSERT_TRUE(s0.ok() && s1.ok()) << s0.status() << s1.status();
    std::vector<float> got;
    for (auto [start, n] : {std::pair<int, int>{0, 16}, {16, 1}}) {
      ForwardBatch b;
      b.seqs.push_back({1, {prompt.begin() + start, prompt.begin() + start + n}, start,
                        {3, 4, 5, 6, 7}, true, false});
      ForwardResult r0, r1;
      ASSERT_TRUE((*s0)->Forward(b, &r0).ok());
      ASSERT_TRUE(r0.seqs[0].logits.empty());
      ASSERT_EQ(r0.seqs[0].residual.size(), n * static_cast<size_t>(f_.config.hidden_size));
      const bool shared_next = !f_.config.HasIndexer(split);
      ASSERT_EQ(r0.seqs[0].topk.size(), shared_next ? n * f_.config.index_topk : 0u);
      b.seqs[0].input_residual = r0.seqs[0].residual;
      b.seqs[0].input_topk = r0.seqs[0].topk;
      absl::Status st = (*s1)->Forward(b, &r1);
      ASSERT_TRUE(st.ok()) << st;
      got.insert(got.end(), r1.seqs[0].logits.begin(), r1.seqs[0].logits.end());
      if (shared_next) {  // the second stage refuses to run without the top-k
        b.seqs[0].input_topk.clear();
        EXPECT_EQ((*s1)->Forward(b, &r1).code(), absl::StatusCode::kInvalidArgument);
      }
    }
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(MaxRelDiff(got, ref), 1e-6) << "split at " << split;
    (void)v;
  }
}

TEST_P(ModelTest, KvBytesPerTokenCountsLayersIndexersAndMtp) {
  const ModelConfig& c = f_.config;
  ModelLoadOptions o;
  const int64_t latent = (c.kv_lora_rank + c.qk_rope_head_dim) * 4, index = c.index_head_dim * 4;
  const int64_t full_layers = GetParam() ? 3 : 4;  // layer 2 shared with IndexShare; MTP is full
  EXPECT_EQ(KvCacheBytesPerToken(c, o), 5 * latent + (full_layers + 1) * index);
  o.load_mtp = false;
  o.first_layer = 1;
  o.last_layer = 1;
  EXPECT_EQ(KvCacheBytesPerToken(c, o), latent + index);
}

TEST_P(ModelTest, RejectsBadBlockTables) {
  auto m = MakeModel(f_, true, /*num_blocks=*/8);
  ForwardBatch b;
  b.seqs.push_back({1, Prompt(6, 1), 0, {0}, false, false});  // 6 tokens need 2 blocks of 4
  ForwardResult r;
  EXPECT_EQ(m->Forward(b, &r).code(), absl::StatusCode::kInvalidArgument);
  b.seqs[0].block_table = {0, 8};  // block 8 is outside [0, 8)
  EXPECT_EQ(m->Forward(b, &r).code(), absl::StatusCode::kInvalidArgument);
  b.seqs[0].token_ids[0] = 999;  // outside the vocabulary
  b.seqs[0].block_table = {0, 1};
  EXPECT_EQ(m->Forward(b, &r).code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(IndexShare, ModelTest, ::testing::Bool());

// Slot ids are int32: a KV geometry of more than 2^31 - 1 positions is refused at load with a
// message naming the limit (before anything is allocated).
TEST(GlmMoeDsaLoadTest, KvGeometryBeyondInt32SlotsIsAClearError) {
  Fixture f;
  f.config = SmallTestConfig(1, 0, false);
  MakeRandomWeights(f.config, 3, &f.weights);
  ModelLoadOptions o;
  o.kv = {1 << 16, 1 << 16};  // 2^32 positions
  auto m = CreateGlmMoeDsa(f.config, f.weights, f.backend.get(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("int32"), absl::string_view::npos) << m.status();
}

}  // namespace
}  // namespace glm::engine
