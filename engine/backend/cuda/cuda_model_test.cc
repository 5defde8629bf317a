// The whole GlmMoeDsa model on the CUDA backend against the same model on the CPU backend, on
// random weights (engine/model/random_weights.h): chunked prefill in both MLA forms with more
// keys than index_topk (DSA sparsity on), IndexShare, grouped routing, a batch of two sequences
// (prefill + decode in one step), greedy decode through the paged cache, and the MTP layer.
// fp32 on both sides: logits agree to ~1e-6 of the largest logit; the test allows 1e-4.
// Skips (printing why) without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/random_weights.h"

namespace glm::engine {
namespace {

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double max_diff = 0, max_abs = 1e-30;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - want[i]));
    max_abs = std::max(max_abs, std::abs(static_cast<double>(want[i])));
  }
  return max_diff / max_abs;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + seed * 11 + 5) % 256;
  return t;
}

int32_t ArgMax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

struct Param {
  bool index_share;
  bool expanded;
  int n_group, topk_group;
};

class CudaModelTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << avail.message();
    const Param p = GetParam();
    config_ = SmallTestConfig(4, 1, p.index_share);
    config_.n_group = p.n_group;
    config_.topk_group = p.topk_group;
    MakeRandomWeights(config_, 4321, &weights_);
    cpu_backend_ = CreateCpuBackend(4);
    auto gpu = CreateCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_backend_ = std::move(*gpu);
    ModelLoadOptions o;
    o.kv = {4, 64};
    o.expanded_prefill = p.expanded;
    auto c = CreateGlmMoeDsa(config_, weights_, cpu_backend_.get(), o);
    ASSERT_TRUE(c.ok()) << c.status();
    cpu_ = std::move(*c);
    auto g = CreateGlmMoeDsa(config_, weights_, gpu_backend_.get(), o);
    ASSERT_TRUE(g.ok()) << g.status();
    gpu_ = std::move(*g);
  }
  void TearDown() override {
    gpu_.reset();
    cpu_.reset();
  }

  // Runs the same batch on both models; expects OK and logits (and hidden) within 1e-4.
  void Both(const ForwardBatch& batch, ForwardResult* cpu, ForwardResult* gpu,
            const std::string& what) {
    ASSERT_TRUE(cpu_->Forward(batch, cpu).ok());
    const absl::Status st = gpu_->Forward(batch, gpu);
    ASSERT_TRUE(st.ok()) << what << ": " << st;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const double rel = MaxRelDiff(gpu->seqs[i].logits, cpu->seqs[i].logits);
      EXPECT_LT(rel, 1e-4) << what << " seq " << i;
      max_rel_ = std::max(max_rel_, rel);
      if (batch.seqs[i].want_hidden) {
        EXPECT_LT(MaxRelDiff(gpu->seqs[i].hidden, cpu->seqs[i].hidden), 1e-4) << what;
      }
    }
  }

  ModelConfig config_;
  InMemoryWeights weights_;
  std::unique_ptr<Backend> cpu_backend_, gpu_backend_;
  std::unique_ptr<Model> cpu_, gpu_;
  double max_rel_ = 0;
};

TEST_P(CudaModelTest, ChunkedPrefillBatchedDecodeAndMtpMatchCpu) {
  const int64_t V = config_.vocab_size;
  // Sequence 1: 37 prompt tokens in chunks of 7 (index_topk is 4: sparse from the 5th key).
  const std::vector<int32_t> prompt = Prompt(37, 1);
  std::vector<int32_t> table1(16), table2(16);
  for (int b = 0; b < 16; ++b) {
    table1[b] = b;
    table2[b] = 63 - b;  // the other sequence's blocks, descending (non-contiguous slots)
  }
  std::vector<float> main_hidden;
  for (size_t start = 0; start < prompt.size(); start += 7) {
    ForwardBatch batch;
    SequenceSlice s;
    s.seq_id = 1;
    s.token_ids.assign(prompt.begin() + start, prompt.begin() + std::min(prompt.size(), start + 7));
    s.start_pos = static_cast<int32_t>(start);
    s.block_table = table1;
    s.all_logits = true;
    s.want_hidden = true;
    batch.seqs.push_back(s);
    ForwardResult cr, gr;
    Both(batch, &cr, &gr, absl::StrCat("prefill chunk at ", start));
    main_hidden.insert(main_hidden.end(), cr.seqs[0].hidden.begin(), cr.seqs[0].hidden.end());
  }
  // One step with two sequences: sequence 2's whole 19-token prompt and sequence 1's decode.
  const std::vector<int32_t> prompt2 = Prompt(19, 2);
  int32_t next1 = 0;
  {
    ForwardBatch batch;
    SequenceSlice a;
    a.seq_id = 2;
    a.token_ids = prompt2;
    a.block_table = table2;
    SequenceSlice b;
    b.seq_id = 1;
    b.token_ids = {static_cast<int32_t>((prompt.back() + 1) % V)};
    b.start_pos = static_cast<int32_t>(prompt.size());
    b.block_table = table1;
    batch.seqs = {a, b};
    ForwardResult cr, gr;
    Both(batch, &cr, &gr, "mixed prefill + decode");
    next1 = ArgMax(cr.seqs[1].logits.data(), V);
  }
  // Greedy decode of sequence 1 for 8 steps: identical ids.
  int32_t pos = static_cast<int32_t>(prompt.size()) + 1;
  int32_t tok_cpu = next1, tok_gpu = next1;
  for (int step = 0; step < 8; ++step, ++pos) {
    ForwardBatch bc, bg;
    SequenceSlice s;
    s.seq_id = 1;
    s.start_pos = pos;
    s.block_table = table1;
    s.token_ids = {tok_cpu};
    bc.seqs.push_back(s);
    s.token_ids = {tok_gpu};
    bg.seqs.push_back(s);
    ForwardResult cr, gr;
    ASSERT_TRUE(cpu_->Forward(bc, &cr).ok());
    ASSERT_TRUE(gpu_->Forward(bg, &gr).ok()) << gpu_backend_->status();
    tok_cpu = ArgMax(cr.seqs[0].logits.data(), V);
    tok_gpu = ArgMax(gr.seqs[0].logits.data(), V);
    ASSERT_EQ(tok_gpu, tok_cpu) << "greedy step " << step;
    max_rel_ = std::max(max_rel_, MaxRelDiff(gr.seqs[0].logits, cr.seqs[0].logits));
  }
  // MTP over prompt positions 0..35 (hidden at t, token t+1), in two chunks.
  const int64_t H = config_.hidden_size;
  for (int64_t start : {0, 20}) {
    const int64_t end = start == 0 ? 20 : 36;
    ForwardBatch batch;
    SequenceSlice s;
    s.seq_id = 1;
    s.token_ids.assign(prompt.begin() + start + 1, prompt.begin() + end + 1);
    s.start_pos = static_cast<int32_t>(start);
    s.block_table = table1;
    s.all_logits = true;
    s.want_hidden = true;
    batch.seqs.push_back(s);
    std::vector<std::vector<float>> hidden = {std::vector<float>(
        main_hidden.begin() + start * H, main_hidden.begin() + end * H)};
    ForwardResult cr, gr;
    ASSERT_TRUE(cpu_->ForwardMtp(batch, hidden, &cr).ok());
    const absl::Status st = gpu_->ForwardMtp(batch, hidden, &gr);
    ASSERT_TRUE(st.ok()) << st;
    const double rel = MaxRelDiff(gr.seqs[0].logits, cr.seqs[0].logits);
    EXPECT_LT(rel, 1e-4) << "mtp chunk at " << start;
    EXPECT_LT(MaxRelDiff(gr.seqs[0].hidden, cr.seqs[0].hidden), 1e-4);
    max_rel_ = std::max(max_rel_, rel);
  }
  std::printf("max logits rel diff cuda vs cpu: %.3g\n", max_rel_);
  EXPECT_TRUE(gpu_backend_->status().ok()) << gpu_backend_->status();
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaModelTest,
                         ::testing::Values(Param{false, true, 1, 1}, Param{true, true, 1, 1},
                                           Param{true, false, 1, 1}, Param{false, true, 4, 2}),
                         [](const auto& p) {
                           return absl::StrCat(p.param.index_share ? "IndexShare" : "AllFull",
                                               p.param.expanded ? "Expanded" : "Absorbed",
                                               "Groups", p.param.n_group, "Keep",
                                               p.param.topk_group);
                         });

}  // namespace
}  // namespace glm::engine
