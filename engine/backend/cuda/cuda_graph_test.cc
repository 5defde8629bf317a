// Decode steps as CUDA graphs (engine/model/decode_graphs.h) against the same steps run eagerly:
// two copies of one model, each on its own CUDA backend, one with cuda_graphs off and one with
// it on, fed the same greedy tokens. Logits must be bitwise identical at every step, for batch
// sizes 1, 3 and 8, on the tiny golden fixtures and on a random small model, including after
// the context crossed a key bucket (a new graph), after a large prefill grew the backend's
// scratch (graphs recaptured), and the graph model must actually replay (decode_graph_stats).
// Also: the memory plan (gpu_memory_fraction) and its error, and the decode step time eager
// (pointer checks on / off) vs graph, printed. And a bf16 model's W_UK beside the indexer, graph
// against eager. Skips (printing why) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/random_weights.h"
#include "kernels/cuda_util.h"

#ifndef GLM_GOLDEN_DIR
#define GLM_GOLDEN_DIR "tests/golden"
#endif

namespace glm::engine {
namespace {

std::string GoldenDir() {
  const char* env = std::getenv("GLM_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : GLM_GOLDEN_DIR;
}

int32_t ArgMax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

constexpr int kBlockSize = 16;
constexpr int kBlocksPerSeq = 80;  // 1280 positions per sequence

// A model on its own CUDA backend.
struct GpuModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

ModelLoadOptions Options(bool graphs, int num_seqs) {
  ModelLoadOptions o;
  o.kv = {kBlockSize, kBlocksPerSeq * num_seqs};
  o.cuda_graphs = graphs;
  return o;
}

absl::StatusOr<GpuModel> RandomModel(const ModelConfig& config, const InMemoryWeights& weights,
                                     const ModelLoadOptions& o) {
  GpuModel m;
  auto be = CreateCudaBackend(0);
  if (!be.ok()) return be.status();
  m.backend = std::move(*be);
  InMemoryWeights copy = weights;
  auto model = CreateGlmMoeDsa(config, copy, m.backend.get(), o);
  if (!model.ok()) return model.status();
  m.model = std::move(*model);
  return m;
}

absl::StatusOr<GpuModel> FixtureModel(const std::string& name, ModelLoadOptions o) {
  o.model_dir = GoldenDir() + "/" + name;
  o.backend = "cuda";
  GpuModel m;
  auto model = LoadGlmMoeDsa(o);
  if (!model.ok()) return model.status();
  m.model = std::move(*model);
  return m;
}

// B sequences decoding in lockstep on two models; the eager model's greedy token feeds both.
class Lockstep {
 public:
  Lockstep(Model* eager, Model* graph, int num_seqs, int vocab)
      : eager_(eager), graph_(graph), vocab_(vocab) {
    seqs_.resize(num_seqs);
    for (int i = 0; i < num_seqs; ++i) {
      for (int b = 0; b < kBlocksPerSeq; ++b) {
        // Interleaved block ids: sequences' slots are not contiguous.
        seqs_[i].table.push_back(b * num_seqs + (num_seqs - 1 - i));
      }
    }
  }

  // Prefills sequence i with `prompt` (one batch for all sequences given).
  void Prefill(const std::vector<std::vector<int32_t>>& prompts) {
    ForwardBatch batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SequenceSlice s;
      s.seq_id = static_cast<int64_t>(i);
      s.token_ids = prompts[i];
      s.start_pos = 0;
      s.block_table = seqs_[i].table;
      batch.seqs.push_back(s);
      seqs_[i].pos = static_cast<int32_t>(prompts[i].size());
    }
    ForwardResult re, rg;
    ASSERT_TRUE(eager_->Forward(batch, &re).ok());
    ASSERT_TRUE(graph_->Forward(batch, &rg).ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(re.seqs[i].logits.size(), static_cast<size_t>(vocab_));
      seqs_[i].next = ArgMax(re.seqs[i].logits);
    }
  }

  // One decode step of every sequence; returns how many sequences' logits differ bitwise.
  int Step(const std::string& what) {
    ForwardBatch batch;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      SequenceSlice s;
      s.seq_id = static_cast<int64_t>(i);
      s.token_ids = {seqs_[i].next};
      s.start_pos = seqs_[i].pos;
      s.block_table = seqs_[i].table;
      s.want_hidden = i == 0;
      batch.seqs.push_back(s);
    }
    ForwardResult re, rg;
    const absl::Status se = eager_->Forward(batch, &re);
    const absl::Status sg = graph_->Forward(batch, &rg);
    EXPECT_TRUE(se.ok()) << what << ": " << se;
    EXPECT_TRUE(sg.ok()) << what << ": " << sg;
    if (!se.ok() || !sg.ok()) return static_cast<int>(seqs_.size());
    int mismatches = 0;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      const auto& a = re.seqs[i].logits;
      const auto& b = rg.seqs[i].logits;
      if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0 ||
          re.seqs[i].hidden != rg.seqs[i].hidden) {
        ++mismatches;
        ADD_FAILURE() << what << ": sequence " << i << " at position " << seqs_[i].pos
                      << ": graph logits differ from eager";
      }
      seqs_[i].next = ArgMax(a);
      ++seqs_[i].pos;
    }
    return mismatches;
  }

  int32_t max_pos() const {
    int32_t m = 0;
    for (const Seq& s : seqs_) m = std::max(m, s.pos);
    return m;
  }

 private:
  struct Seq {
    std::vector<int32_t> table;
    int32_t pos = 0;
    int32_t next = 0;
  };
  Model* eager_;
  Model* graph_;
  int vocab_;
  std::vector<Seq> seqs_;
};

std::vector<int32_t> Prompt(int n, int seed, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + seed * 11 + 5) % vocab;
  return t;
}

class CudaGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << avail.message();
  }
};

// Prompts of 40 + 2i tokens (at most 55 keys at the first decode step), then `steps` >= 30 decode
// steps: the longest context crosses the 64-key bucket boundary (a second graph) for every batch.
void RunLockstep(Model* eager, Model* graph, int num_seqs, int vocab, int steps,
                 const std::string& what) {
  Lockstep ls(eager, graph, num_seqs, vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < num_seqs; ++i) prompts.push_back(Prompt(40 + 2 * i, i, vocab));
  ls.Prefill(prompts);
  int mismatches = 0;
  for (int s = 0; s < steps; ++s) mismatches += ls.Step(absl::StrCat(what, " step ", s));
  EXPECT_EQ(mismatches, 0) << what;
  EXPECT_GT(ls.max_pos(), 64) << what << ": the context must cross the 64-key bucket";
}

TEST_F(CudaGraphTest, RandomModelGraphEqualsEagerBitwise) {
  ModelConfig config = SmallTestConfig(4, 1, /*index_share=*/true);
  InMemoryWeights weights;
  MakeRandomWeights(config, 99, &weights);
  for (int num_seqs : {1, 3, 8}) {
    SCOPED_TRACE(absl::StrCat("batch ", num_seqs));
    auto eager = RandomModel(config, weights, Options(false, num_seqs));
    ASSERT_TRUE(eager.ok()) << eager.status();
    auto graph = RandomModel(config, weights, Options(true, num_seqs));
    ASSERT_TRUE(graph.ok()) << graph.status();
    const int steps = 30;
    RunLockstep(eager->model.get(), graph->model.get(), num_seqs,
                static_cast<int>(config.vocab_size), steps, "random");
    const DecodeGraphStats ge = eager->model->decode_graph_stats();
    const DecodeGraphStats gg = graph->model->decode_graph_stats();
    EXPECT_EQ(ge.captures, 0);
    EXPECT_EQ(ge.replays, 0);
    EXPECT_EQ(ge.eager_steps, steps);
    // One capture per key bucket visited (64 and 128), every other step replays.
    EXPECT_EQ(gg.captures, 2);
    EXPECT_EQ(gg.replays, steps - gg.captures);
    EXPECT_EQ(gg.decode_steps, steps);
    std::printf("random batch %d: decode_steps=%lld captures=%lld replays=%lld\n", num_seqs,
                static_cast<long long>(gg.decode_steps), static_cast<long long>(gg.captures),
                static_cast<long long>(gg.replays));
  }
}

TEST_F(CudaGraphTest, ScratchGrowthInvalidatesGraphsAndReplayStillEqualsEager) {
  ModelConfig config = SmallTestConfig(4, 1, /*index_share=*/false);
  InMemoryWeights weights;
  MakeRandomWeights(config, 7, &weights);
  const int num_seqs = 3, vocab = static_cast<int>(config.vocab_size);
  ModelLoadOptions oe = Options(false, num_seqs + 1), og = Options(true, num_seqs + 1);
  auto eager = RandomModel(config, weights, oe);
  ASSERT_TRUE(eager.ok()) << eager.status();
  auto graph = RandomModel(config, weights, og);
  ASSERT_TRUE(graph.ok()) << graph.status();
  Lockstep ls(eager->model.get(), graph->model.get(), num_seqs, vocab);
  ls.Prefill({Prompt(20, 1, vocab), Prompt(25, 2, vocab), Prompt(30, 3, vocab)});
  for (int s = 0; s < 4; ++s) EXPECT_EQ(ls.Step(absl::StrCat("before growth ", s)), 0);
  const int64_t epoch_before = graph->backend->scratch_epoch();
  const DecodeGraphStats before = graph->model->decode_graph_stats();
  // A long prefill of a fourth sequence (its own blocks at the end of the cache): the indexer's
  // score scratch ([rows, keys] floats) outgrows everything a decode step needed.
  {
    ForwardBatch batch;
    SequenceSlice s;
    s.seq_id = 9;
    s.token_ids = Prompt(1100, 9, vocab);
    for (int b = 0; b < kBlocksPerSeq; ++b) s.block_table.push_back(num_seqs * kBlocksPerSeq + b);
    batch.seqs.push_back(s);
    ForwardResult r;
    ASSERT_TRUE(eager->model->Forward(batch, &r).ok());
    ASSERT_TRUE(graph->model->Forward(batch, &r).ok());
  }
  ASSERT_NE(graph->backend->scratch_epoch(), epoch_before) << "the prefill did not grow scratch";
  for (int s = 0; s < 4; ++s) EXPECT_EQ(ls.Step(absl::StrCat("after growth ", s)), 0);
  const DecodeGraphStats after = graph->model->decode_graph_stats();
  EXPECT_EQ(after.invalidations, before.invalidations + 1);
  EXPECT_EQ(after.captures, before.captures + 1);
  EXPECT_EQ(after.replays, before.replays + 3);
}

// The key-slot arena outgrows its buffer (many live sequences at once): the buffer moves, every
// decode graph that recorded its address is dropped and recaptured, and replay still equals eager.
TEST_F(CudaGraphTest, SlotArenaGrowthDropsGraphsAndReplayStillEqualsEager) {
  ModelConfig config = SmallTestConfig(4, 1, /*index_share=*/false);
  InMemoryWeights weights;
  MakeRandomWeights(config, 11, &weights);
  const int num_seqs = 3, vocab = static_cast<int>(config.vocab_size);
  // One more sequence's worth of blocks for the fillers below.
  auto eager = RandomModel(config, weights, Options(false, num_seqs + 1));
  ASSERT_TRUE(eager.ok()) << eager.status();
  auto graph = RandomModel(config, weights, Options(true, num_seqs + 1));
  ASSERT_TRUE(graph.ok()) << graph.status();
  Lockstep ls(eager->model.get(), graph->model.get(), num_seqs, vocab);
  ls.Prefill({Prompt(20, 1, vocab), Prompt(25, 2, vocab), Prompt(30, 3, vocab)});
  for (int s = 0; s < 4; ++s) EXPECT_EQ(ls.Step(absl::StrCat("before growth ", s)), 0);
  const auto arena_before = SlotArenaStatsOf(*graph->model);
  ASSERT_TRUE(arena_before.has_value());
  const DecodeGraphStats before = graph->model->decode_graph_stats();
  ASSERT_GE(before.replays, 1);
  // Fillers: short sequences of one block each, all live at once. Each takes a region of at
  // least 512 slots, so together they pass the buffer's initial 1.25 x the cache's positions.
  const int64_t fillers = arena_before->capacity_slots / 512 + 1;
  ASSERT_LE(fillers, kBlocksPerSeq) << "the fillers need a block each";
  {
    ForwardBatch batch;
    for (int64_t f = 0; f < fillers; ++f) {
      SequenceSlice s;
      s.seq_id = 100 + f;
      s.token_ids = Prompt(5, static_cast<int>(f), vocab);
      s.block_table = {static_cast<int32_t>(num_seqs * kBlocksPerSeq + f)};
      batch.seqs.push_back(s);
    }
    ForwardResult r;
    ASSERT_TRUE(eager->model->Forward(batch, &r).ok());
    ASSERT_TRUE(graph->model->Forward(batch, &r).ok());
  }
  const auto arena_after = SlotArenaStatsOf(*graph->model);
  ASSERT_GT(arena_after->buffer_grows, arena_before->buffer_grows) << "the arena did not grow";
  for (int s = 0; s < 4; ++s) EXPECT_EQ(ls.Step(absl::StrCat("after growth ", s)), 0);
  const DecodeGraphStats after = graph->model->decode_graph_stats();
  EXPECT_GE(after.invalidations, before.invalidations + 1);
  EXPECT_EQ(after.captures, before.captures + 1);
  EXPECT_EQ(after.replays, before.replays + 3);
}

// Greedy decode of `num_seqs` sequences on one model: every step's logits, in order.
std::vector<std::vector<float>> GreedyLogits(Model* model, int num_seqs, int vocab, int steps) {
  std::vector<std::vector<float>> out;
  ForwardBatch batch;
  for (int i = 0; i < num_seqs; ++i) {
    SequenceSlice s;
    s.seq_id = i;
    s.token_ids = Prompt(40 + 2 * i, i, vocab);
    for (int b = 0; b < kBlocksPerSeq; ++b) s.block_table.push_back(i * kBlocksPerSeq + b);
    batch.seqs.push_back(s);
  }
  for (int step = 0; step <= steps; ++step) {
    ForwardResult r;
    const absl::Status st = model->Forward(batch, &r);
    EXPECT_TRUE(st.ok()) << "step " << step << ": " << st;
    if (!st.ok()) return out;
    for (int i = 0; i < num_seqs; ++i) {
      SequenceSlice& s = batch.seqs[i];
      s.start_pos += static_cast<int32_t>(s.token_ids.size());
      s.token_ids = {ArgMax(r.seqs[i].logits)};
      out.push_back(std::move(r.seqs[i].logits));
    }
  }
  return out;
}

// A bf16 model absorbs W_UK with AbsorbPerHeadBesidePrevious right after the indexer: where the
// device has programmatic dependent launch, the narrow kernel runs beside the indexer's last
// kernel (PerHeadNarrowArgs::beside_previous). The path must actually run, and graph decode must
// equal eager decode bitwise. (That the product beside equals the product in order, bit for bit,
// with a slow kernel in between, is launch_test's PerHeadNarrowBesideThePreviousKernel.)
TEST_F(CudaGraphTest, AbsorbBesideIndexerGraphEqualsEagerBitwise) {
  ModelConfig config = SmallTestConfig(4, 1, /*index_share=*/true);
  InMemoryWeights weights;
  MakeRandomWeights(config, 5, &weights);
  const int vocab = static_cast<int>(config.vocab_size), steps = 30;
  const bool pdl = kernels::PdlLaunches();
  for (int num_seqs : {1, 3}) {
    SCOPED_TRACE(absl::StrCat("batch ", num_seqs));
    std::vector<std::vector<float>> logits[2];  // eager, graph
    int64_t beside_launches[2] = {0, 0};
    for (int run = 0; run < 2; ++run) {
      ModelLoadOptions o = Options(run == 1, num_seqs);
      o.weight_dtype = "bf16";
      auto m = RandomModel(config, weights, o);
      ASSERT_TRUE(m.ok()) << m.status();
      const int64_t before = CudaAbsorbBesideLaunches();
      logits[run] = GreedyLogits(m->model.get(), num_seqs, vocab, steps);
      beside_launches[run] = CudaAbsorbBesideLaunches() - before;
      if (run == 1) EXPECT_GE(m->model->decode_graph_stats().replays, steps - 2);
    }
    ASSERT_EQ(logits[0].size(), static_cast<size_t>((steps + 1) * num_seqs));
    ASSERT_EQ(logits[1].size(), logits[0].size());
    int differ = 0;
    for (size_t i = 0; i < logits[0].size(); ++i) {
      const std::vector<float>& a = logits[0][i];
      const std::vector<float>& b = logits[1][i];
      differ +=
          a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0;
    }
    EXPECT_EQ(differ, 0) << "rows of logits where graph decode differs from eager";
    // Decode steps only (prefill has more rows than the absorbed decode kernel takes): eager
    // launches it once per step per indexer layer; a graph once per capture. None without PDL.
    if (pdl) {
      EXPECT_GE(beside_launches[0], steps);
      EXPECT_GE(beside_launches[1], 1);
    } else {
      EXPECT_EQ(beside_launches[0] + beside_launches[1], 0);
    }
    std::printf("absorb beside batch %d: beside launches eager %lld, graph %lld\n", num_seqs,
                static_cast<long long>(beside_launches[0]),
                static_cast<long long>(beside_launches[1]));
  }
}

TEST_F(CudaGraphTest, TinyFixturesGraphEqualsEagerBitwise) {
  for (const char* name : {"tiny-sparse", "tiny-moe", "tiny-dense", "tiny-mtp"}) {
    for (int num_seqs : {1, 3, 8}) {
      SCOPED_TRACE(absl::StrCat(name, " batch ", num_seqs));
      auto eager = FixtureModel(name, Options(false, num_seqs));
      ASSERT_TRUE(eager.ok()) << eager.status();
      auto graph = FixtureModel(name, Options(true, num_seqs));
      ASSERT_TRUE(graph.ok()) << graph.status();
      const int vocab = static_cast<int>(eager->model->config().vocab_size);
      RunLockstep(eager->model.get(), graph->model.get(), num_seqs, vocab, 30, name);
      const DecodeGraphStats gg = graph->model->decode_graph_stats();
      EXPECT_EQ(gg.captures, 2);
      EXPECT_EQ(gg.replays, 28);
    }
  }
}

// Decode step wall time (Forward incl. table upload and logits copy), tiny-sparse, batch 1 and 8:
// eager with per-launch pointer checks (the old hot path), eager without, graph replay.
TEST_F(CudaGraphTest, DecodeStepTime) {
  for (int num_seqs : {1, 8}) {
    double us[3] = {0, 0, 0};
    const char* names[3] = {"eager+pointer-checks", "eager", "graph"};
    for (int mode = 0; mode < 3; ++mode) {
      ModelLoadOptions o = Options(mode == 2, num_seqs);
      o.debug_pointer_checks = mode == 0;
      auto m = FixtureModel("tiny-sparse", o);
      ASSERT_TRUE(m.ok()) << m.status();
      const int vocab = static_cast<int>(m->model->config().vocab_size);
      std::vector<int32_t> table;
      ForwardBatch batch;
      for (int i = 0; i < num_seqs; ++i) {
        SequenceSlice s;
        s.seq_id = i;
        s.token_ids = Prompt(40, i, vocab);
        for (int b = 0; b < kBlocksPerSeq; ++b) s.block_table.push_back(i * kBlocksPerSeq + b);
        batch.seqs.push_back(s);
      }
      ForwardResult r;
      ASSERT_TRUE(m->model->Forward(batch, &r).ok());
      // Steps at positions 40..: warm 5 (captures), time 100 (same bucket: all replay).
      auto step = [&](int k) {
        for (auto& s : batch.seqs) {
          s.start_pos = 40 + k;
          s.token_ids = {static_cast<int32_t>((k * 7 + s.seq_id) % vocab)};
        }
        return m->model->Forward(batch, &r);
      };
      for (int k = 0; k < 5; ++k) ASSERT_TRUE(step(k).ok());
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 5; k < 20; ++k) ASSERT_TRUE(step(k).ok());
      const auto t1 = std::chrono::steady_clock::now();
      us[mode] = std::chrono::duration<double, std::micro>(t1 - t0).count() / 15;
    }
    std::printf("decode step tiny-sparse batch %d: %s %.1f us, %s %.1f us, %s %.1f us\n",
                num_seqs, names[0], us[0], names[1], us[1], names[2], us[2]);
  }
}

TEST_F(CudaGraphTest, MemoryPlanFromFraction) {
  ModelLoadOptions o = Options(true, 1);
  o.kv.num_blocks = 0;
  o.gpu_memory_fraction = 0.5;
  o.plan_max_num_seqs = 8;
  o.plan_max_batched_tokens = 256;
  auto m = FixtureModel("tiny-sparse", o);
  ASSERT_TRUE(m.ok()) << m.status();
  const MemoryPlan p = m->model->memory_plan();
  std::printf("memory plan tiny-sparse fraction 0.5: %s\n", p.ToString().c_str());
  EXPECT_TRUE(p.measured);
  EXPECT_GT(p.weights_bytes, 0);
  EXPECT_GT(p.activation_bytes, 0);
  EXPECT_GT(p.kv_num_blocks, 0);
  EXPECT_EQ(p.kv_num_blocks, m->model->kv_geometry().num_blocks);
  EXPECT_EQ(p.max_tokens, int64_t{p.kv_num_blocks} * kBlockSize);
  EXPECT_EQ(p.source, "memory_fraction");
  // Half the device minus what is in use: the plan, key-slot table included, stays within the
  // budget (tiny-sparse's KV blocks are small: the table is ~0.7 % of the KV bytes here).
  EXPECT_GT(p.slot_table_bytes, 0);
  EXPECT_LE(p.kv_bytes + p.slot_table_bytes + p.weights_bytes + p.activation_bytes,
            static_cast<int64_t>(0.5 * static_cast<double>(p.device_total_bytes)));
  // The planned model decodes.
  ForwardBatch batch;
  SequenceSlice s;
  s.token_ids = {1, 2, 3};
  s.block_table = {0};
  batch.seqs.push_back(s);
  ForwardResult r;
  ASSERT_TRUE(m->model->Forward(batch, &r).ok());

  // A fraction below what is already in use names the shortfall and the fix.
  ModelLoadOptions tiny = o;
  tiny.gpu_memory_fraction = 1e-6;
  auto bad = FixtureModel("tiny-sparse", tiny);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kResourceExhausted) << bad.status();
  EXPECT_NE(bad.status().message().find("short by"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("Fix:"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace glm::engine
