// Backend::Sample and the model's LogitsOutput against engine/sample SampleToken: the CPU backend
// picks the same token as the host sampler for every row (same rule), sampled rows return no
// logits, the others return their logits unchanged; and on a GPU the CUDA backend's kernel picks
// the same tokens as the CPU backend from the same logits.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/create_backend.h"
#include "engine/model/logits_output.h"
#include "engine/sample/sampler.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

struct Rows {
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingParams> params;
  std::vector<uint64_t> seeds;
  std::vector<int64_t> index;
};

Rows MakeRows(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  Rows r;
  r.logits.resize(static_cast<size_t>(rows * vocab));
  for (float& x : r.logits) x = nd(rng);
  for (int64_t i = 0; i < rows; ++i) {
    if (i % 5 == 1) {  // coarse logits: ties
      for (int64_t c = 0; c < vocab; ++c) r.logits[i * vocab + c] = std::round(r.logits[i * vocab + c]);
    }
    SamplingParams p;
    const float temps[] = {0.0f, 0.8f, 1.0f, 1.4f};
    const int ks[] = {0, 0, 3, 40};
    const float ps[] = {1.0f, 0.9f, 0.5f, 1.0f, 0.97f};
    p.temperature = temps[i % 4];
    p.top_k = ks[(i / 4) % 4];
    p.top_p = ps[(i / 3) % 5];
    r.params.push_back(p);
    r.seeds.push_back(1000 + 7 * i);
    r.index.push_back(i % 11);
  }
  return r;
}

// Runs Backend::Sample over all rows of `r` on `backend`.
std::vector<int32_t> SampleOn(Backend& backend, const Rows& r, int64_t rows, int64_t vocab) {
  auto x = backend.Allocate(r.logits.size() * sizeof(float));
  auto t = backend.Allocate(rows * 4), k = backend.Allocate(rows * 4), p = backend.Allocate(rows * 4);
  auto s = backend.Allocate(rows * 8), ix = backend.Allocate(rows * 8), ids = backend.Allocate(rows * 4);
  std::vector<float> ht(rows), hp(rows);
  std::vector<int32_t> hk(rows);
  for (int64_t i = 0; i < rows; ++i) {
    ht[i] = r.params[i].temperature;
    hk[i] = r.params[i].top_k;
    hp[i] = r.params[i].top_p;
  }
  backend.CopyToDevice(x->data(), r.logits.data(), r.logits.size() * sizeof(float));
  backend.CopyToDevice(t->data(), ht.data(), rows * 4);
  backend.CopyToDevice(k->data(), hk.data(), rows * 4);
  backend.CopyToDevice(p->data(), hp.data(), rows * 4);
  backend.CopyToDevice(s->data(), r.seeds.data(), rows * 8);
  backend.CopyToDevice(ix->data(), r.index.data(), rows * 8);
  SampleArgs a;
  a.logits = {x->f32(), rows, vocab, vocab};
  a.temperature = t->f32();
  a.top_k = k->i32();
  a.top_p = p->f32();
  a.seed = static_cast<const uint64_t*>(s->data());
  a.index = static_cast<const int64_t*>(ix->data());
  a.out_ids = ids->i32();
  backend.Sample(a);
  std::vector<int32_t> out(rows, -1);
  backend.CopyToHost(out.data(), ids->data(), rows * 4);
  EXPECT_TRUE(backend.status().ok()) << backend.status();
  return out;
}

TEST(SampleBackendTest, CpuBackendEqualsSampleToken) {
  auto cpu = CreateCpuBackend(1);
  for (int64_t vocab : {int64_t{5}, int64_t{1000}, int64_t{154880}}) {
    const int64_t rows = vocab > 10000 ? 16 : 80;
    const Rows r = MakeRows(rows, vocab, static_cast<uint32_t>(vocab));
    const std::vector<int32_t> got = SampleOn(*cpu, r, rows, vocab);
    for (int64_t i = 0; i < rows; ++i) {
      const auto row = absl::MakeConstSpan(r.logits).subspan(i * vocab, vocab);
      EXPECT_EQ(got[i], SampleToken(row, r.params[i], r.seeds[i], r.index[i]))
          << "vocab " << vocab << " row " << i;
    }
  }
}

TEST(SampleBackendTest, CudaBackendEqualsCpuBackend) {
  if (absl::Status s = CudaBackendAvailable(); !s.ok()) GTEST_SKIP() << "backend cuda: " << s;
  auto cuda = CreateBackend("cuda", 1, 0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  auto cpu = CreateCpuBackend(1);
  for (int64_t vocab : {int64_t{7}, int64_t{4099}, int64_t{154880}}) {
    const int64_t rows = 256;
    const Rows r = MakeRows(rows, vocab, 99 + static_cast<uint32_t>(vocab));
    EXPECT_EQ(SampleOn(**cuda, r, rows, vocab), SampleOn(*cpu, r, rows, vocab)) << "vocab " << vocab;
  }
}

TEST(SampleBackendTest, LogitsOutputSamplesOnlyTheRowsThatAskForIt) {
  auto cpu = CreateCpuBackend(1);
  const int64_t vocab = 300, rows = 5;
  const Rows r = MakeRows(rows, vocab, 5);
  auto x = cpu->Allocate(r.logits.size() * sizeof(float));
  cpu->CopyToDevice(x->data(), r.logits.data(), r.logits.size() * sizeof(float));
  // seq 0: row 0 (sampled); seq 1: rows 1-3 (all logits); seq 2: row 4 (sampled, not contiguous
  // with row 0: the gather path); seq 3 would be row 5: none, so 3 sequences.
  ForwardBatch batch;
  batch.seqs.resize(3);
  batch.seqs[1].all_logits = true;
  for (int i : {0, 2}) {
    const int row = i == 0 ? 0 : 4;
    SequenceSlice::DeviceSample& d = batch.seqs[i].sample;
    d.enabled = true;
    d.temperature = 0.9f;
    d.top_p = 0.8f;
    d.seed = r.seeds[row];
    d.index = r.index[row];
  }
  LogitsOutput out;
  ForwardResult result;
  out.Emit(cpu.get(), batch, {0, 1, 4}, MatView{x->f32(), rows, vocab, vocab}, &result);
  ASSERT_EQ(result.seqs.size(), 3u);
  for (int i : {0, 2}) {
    const int row = i == 0 ? 0 : 4;
    SamplingParams p;
    p.temperature = 0.9f;
    p.top_p = 0.8f;
    const auto span = absl::MakeConstSpan(r.logits).subspan(row * vocab, vocab);
    EXPECT_TRUE(result.seqs[i].logits.empty());
    EXPECT_EQ(result.seqs[i].sampled_token, SampleToken(span, p, r.seeds[row], r.index[row]));
  }
  EXPECT_EQ(result.seqs[1].sampled_token, -1);
  EXPECT_EQ(result.seqs[1].logits,
            std::vector<float>(r.logits.begin() + vocab, r.logits.begin() + 4 * vocab));
}

}  // namespace
}  // namespace glm::engine
