// SampleRows on the GPU against the host rule (kernels/sample_rule.h SampleRowHost, which
// engine/sample and the CPU backend use): the same token for every row over vocab 1 .. 154,880,
// greedy / temperature / top-k / top-p mixes, ties, NaN / -inf / +inf entries; draws that do not
// depend on the batch (tokens exactly, logprobs up to rounding); the empirical distribution
// against the exact truncated softmax; guard bytes; one CTA per row and rows split over
// thread-block clusters of several sizes give the same tokens. DISABLED_Bench times batch 1, 8
// and 64 at GLM-5's vocab, one CTA per row vs the automatic cluster
// (--gtest_also_run_disabled_tests).
#include "kernels/sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gpu_test_util.h"
#include "kernels/sample_rule.h"

namespace glm::kernels {
namespace {

using testing::GuardedBuffer;

struct Params {
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seed;
  std::vector<int64_t> index;
  void Add(float t, int32_t k, float p, uint64_t s, int64_t i) {
    temperature.push_back(t);
    top_k.push_back(k);
    top_p.push_back(p);
    seed.push_back(s);
    index.push_back(i);
  }
};

// Runs SampleRows on the device; checks guards around every array it writes.
class DeviceSampler {
 public:
  DeviceSampler(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t ld,
                const Params& p)
      : rows_(rows),
        x_(logits.size() * 4),
        t_(rows * 4),
        k_(rows * 4),
        p_(rows * 4),
        s_(rows * 8),
        i_(rows * 8),
        ids_(rows * 4),
        lp_(rows * 4) {
    ok_ = x_.ok() && ids_.ok() && lp_.ok() && x_.Upload(logits.data(), logits.size() * 4) ==
                                                   cudaSuccess &&
          t_.Upload(p.temperature.data(), rows * 4) == cudaSuccess &&
          k_.Upload(p.top_k.data(), rows * 4) == cudaSuccess &&
          p_.Upload(p.top_p.data(), rows * 4) == cudaSuccess &&
          s_.Upload(p.seed.data(), rows * 8) == cudaSuccess &&
          i_.Upload(p.index.data(), rows * 8) == cudaSuccess &&
          ids_.Poison(0x5A) == cudaSuccess && lp_.Poison(0x5A) == cudaSuccess;
    args_.logits = x_.as<float>();
    args_.ld = ld;
    args_.rows = rows;
    args_.vocab = vocab;
    args_.temperature = t_.as<float>();
    args_.top_k = k_.as<int32_t>();
    args_.top_p = p_.as<float>();
    args_.seed = s_.as<uint64_t>();
    args_.index = i_.as<int64_t>();
    args_.out_ids = ids_.as<int32_t>();
    args_.out_logprobs = lp_.as<float>();
  }
  bool ok() const { return ok_; }
  SampleRowsArgs& args() { return args_; }

  absl::Status Run(std::vector<int32_t>* ids, std::vector<float>* logprobs) {
    if (absl::Status s = SampleRows(args_, nullptr); !s.ok()) return s;
    if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("sync failed");
    if (!ids_.GuardsIntact() || !lp_.GuardsIntact() || !x_.GuardsIntact()) {
      return absl::InternalError("guard bytes overwritten");
    }
    ids->resize(rows_);
    logprobs->resize(rows_);
    if (ids_.Download(ids->data(), rows_ * 4) != cudaSuccess ||
        lp_.Download(logprobs->data(), rows_ * 4) != cudaSuccess) {
      return absl::InternalError("download failed");
    }
    return absl::OkStatus();
  }

 private:
  int64_t rows_;
  GuardedBuffer x_, t_, k_, p_, s_, i_, ids_, lp_;
  SampleRowsArgs args_;
  bool ok_ = false;
};

class SampleTest : public ::testing::Test {
 protected:
  void SetUp() override { GLM_SKIP_WITHOUT_GPU(); }
};

// Logits of one row in one of several styles.
void FillRow(float* row, int64_t vocab, int style, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < vocab; ++c) row[c] = nd(rng);
  switch (style) {
    case 1:  // coarse values: many exact ties everywhere, including at the top
      for (int64_t c = 0; c < vocab; ++c) row[c] = std::round(row[c]);
      break;
    case 2:  // NaN and -inf entries
      for (int64_t c = 0; c < vocab; c += 3) row[c] = nan;
      for (int64_t c = 1; c < vocab; c += 7) row[c] = -inf;
      break;
    case 3:  // all -inf (greedy fallback: id 0)
      for (int64_t c = 0; c < vocab; ++c) row[c] = -inf;
      break;
    case 4:  // +inf entries: only they can be drawn
      row[vocab / 2] = inf;
      row[vocab - 1] = inf;
      break;
    case 5:  // a peaked LLM-like row: a few large logits over a flat bulk
      for (int64_t c = 0; c < std::min<int64_t>(vocab, 8); ++c) row[(c * 7919) % vocab] = 12.0f + c;
      break;
    case 6:  // all equal: the draw is uniform over ids, resolved by the tie pass
      for (int64_t c = 0; c < vocab; ++c) row[c] = 0.25f;
      break;
    default:
      break;
  }
}

TEST_F(SampleTest, MatchesHostRuleOnEveryRow) {
  const int64_t vocabs[] = {1, 7, 1000, 4099, 154880};
  // CTAs per row: one, forced clusters (empty and uneven slices at small vocabs), the device's
  // largest, and the automatic choice.
  for (int32_t cluster : {1, 2, 4, 64, 0})
  for (int64_t vocab : vocabs) {
    const int64_t rows = vocab >= 100000 ? 48 : 200;
    const int64_t ld = vocab + (vocab % 2);
    auto cs = SampleClusterSize(vocab, rows, cluster);
    ASSERT_TRUE(cs.ok()) << cs.status();
    SCOPED_TRACE(absl::StrCat("vocab=", vocab, " max_cluster=", cluster, " (", *cs,
                              " CTAs per row)"));
    std::mt19937 rng(static_cast<uint32_t>(vocab));
    std::vector<float> x(static_cast<size_t>(rows * ld), 1e30f);  // padding never chosen
    Params p;
    const float temps[] = {0.0f, 0.7f, 1.0f, 1.3f, 0.05f};
    const int32_t ks[] = {0, 0, 1, 5, 50, 1000};
    const float ps[] = {1.0f, 0.9f, 0.5f, 1e-6f, 0.95f, 1.0f, 0.999f};
    for (int64_t r = 0; r < rows; ++r) {
      FillRow(x.data() + r * ld, vocab, static_cast<int>(r % 7), rng);
      p.Add(temps[r % 5], ks[(r / 5) % 6], ps[(r / 3) % 7], 1000 + r * 31, r * 17 % 23);
    }
    DeviceSampler ds(x, rows, vocab, ld, p);
    ASSERT_TRUE(ds.ok());
    ds.args().max_cluster = cluster;
    std::vector<int32_t> ids;
    std::vector<float> lps;
    const absl::Status run = ds.Run(&ids, &lps);
    ASSERT_TRUE(run.ok()) << run;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * ld;
      const int32_t want = sample_rule::SampleRowHost(row, vocab, p.temperature[r], p.top_k[r],
                                                      p.top_p[r], p.seed[r], p.index[r]);
      ASSERT_EQ(ids[r], want) << "row " << r << " T=" << p.temperature[r] << " k=" << p.top_k[r]
                              << " p=" << p.top_p[r];
      const float lp = sample_rule::LogProbHost(row, vocab, want);
      if (std::isfinite(lp)) {
        EXPECT_NEAR(lps[r], lp, 1e-4f + 1e-5f * std::abs(lp)) << "row " << r;
      } else {
        EXPECT_EQ(lps[r], lp) << "row " << r;
      }
    }
  }
}

// A GLM-5-sized row is split over several CTAs wherever clusters exist (sm_90+), so the
// cluster path above is the one production runs.
TEST_F(SampleTest, SplitsLongRowsOverAClusterOnSm90) {
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  auto c = SampleClusterSize(154880, 1, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  std::printf("vocab 154880: %d CTAs per row (compute capability %d)\n", *c, major);
  if (major >= 9) {
    EXPECT_GE(*c, 8);
  } else {
    EXPECT_EQ(*c, 1);
  }
  EXPECT_EQ(SampleClusterSize(1000, 1, 0).value_or(-1), 1);
  // Enough rows to fill every SM with one CTA each: no clusters.
  EXPECT_EQ(SampleClusterSize(154880, 100000, 0).value_or(-1), 1);
}

TEST_F(SampleTest, ARowsDrawDoesNotDependOnTheBatch) {
  const int64_t vocab = 154880, rows = 64;
  std::mt19937 rng(11);
  std::vector<float> x(static_cast<size_t>(rows * vocab));
  Params p;
  for (int64_t r = 0; r < rows; ++r) {
    FillRow(x.data() + r * vocab, vocab, r % 2 == 0 ? 5 : 0, rng);
    p.Add(0.8f, r % 3 == 0 ? 40 : 0, 0.9f, 77 + r, 5);
  }
  DeviceSampler all(x, rows, vocab, vocab, p);
  ASSERT_TRUE(all.ok());
  std::vector<int32_t> ids;
  std::vector<float> lps;
  ASSERT_TRUE(all.Run(&ids, &lps).ok());
  for (int64_t r : {0, 17, 63}) {
    std::vector<float> one(x.begin() + r * vocab, x.begin() + (r + 1) * vocab);
    Params q;
    q.Add(p.temperature[r], p.top_k[r], p.top_p[r], p.seed[r], p.index[r]);
    DeviceSampler single(one, 1, vocab, vocab, q);
    ASSERT_TRUE(single.ok());
    std::vector<int32_t> id1;
    std::vector<float> lp1;
    ASSERT_TRUE(single.Run(&id1, &lp1).ok());
    EXPECT_EQ(id1[0], ids[r]) << "row " << r;
    // The logprob's fp32 log-sum-exp is combined over the row's CTAs, whose count follows the
    // batch (sample.h): equal up to rounding, not bit for bit.
    EXPECT_NEAR(lp1[0], lps[r], 1e-5f * std::max(1.0f, std::abs(lps[r]))) << "row " << r;
  }
}

// Exact distribution of the rule in real arithmetic: softmax(l / T) over the top-k (order: logit
// desc, id asc), then the top-p prefix, renormalised.
std::vector<double> TruncatedSoftmax(const std::vector<float>& l, double t, int k, double top_p) {
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  const size_t keep = k > 0 ? std::min<size_t>(k, l.size()) : l.size();
  std::vector<double> w(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += w[i] = std::exp((l[order[i]] - l[order[0]]) / t);
  size_t n = keep;
  if (top_p < 1) {
    double cum = 0;
    for (n = 0; n < keep && cum < top_p * total; ++n) cum += w[n];
  }
  double mass = 0;
  for (size_t i = 0; i < n; ++i) mass += w[i];
  std::vector<double> prob(l.size(), 0.0);
  for (size_t i = 0; i < n; ++i) prob[order[i]] = w[i] / mass;
  return prob;
}

TEST_F(SampleTest, DistributionMatchesTruncatedSoftmax) {
  // 20,000 draws (one per row, draw index = row) of one 64-token row, per parameter set.
  const int64_t vocab = 64, rows = 20000;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> base(vocab);
  for (float& v : base) v = nd(rng);
  base[9] = base[40] = 2.5f;  // a tie inside the kept set
  struct Case { float t; int k; float p; };
  const Case cases[] = {{1.0f, 0, 1.0f}, {0.8f, 0, 0.9f}, {0.8f, 20, 1.0f}, {1.5f, 12, 0.8f}};
  std::vector<float> x(static_cast<size_t>(rows * vocab));
  for (int64_t r = 0; r < rows; ++r) std::copy(base.begin(), base.end(), x.begin() + r * vocab);
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("T=", c.t, " k=", c.k, " p=", c.p));
    Params p;
    for (int64_t r = 0; r < rows; ++r) p.Add(c.t, c.k, c.p, 2024, r);
    DeviceSampler ds(x, rows, vocab, vocab, p);
    ASSERT_TRUE(ds.ok());
    std::vector<int32_t> ids;
    std::vector<float> lps;
    ASSERT_TRUE(ds.Run(&ids, &lps).ok());
    const std::vector<double> want = TruncatedSoftmax(base, c.t, c.k, c.p);
    std::vector<double> count(vocab, 0.0);
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, vocab);
      ASSERT_GT(want[id], 0.0) << "token " << id << " is outside the kept set";
      count[id] += 1;
    }
    double chi2 = 0, tv = 0;
    int support = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (want[i] == 0) continue;
      ++support;
      const double e = want[i] * rows;
      chi2 += (count[i] - e) * (count[i] - e) / e;
      tv += std::abs(count[i] / rows - want[i]) / 2;
    }
    // Deterministic (fixed seed); the bounds are ~5 sigma for chi2 with support-1 dof.
    const double dof = support - 1;
    EXPECT_LT(chi2, dof + 5 * std::sqrt(2 * std::max(dof, 1.0)) + 5) << "support " << support;
    EXPECT_LT(tv, 0.02);
  }
}

TEST_F(SampleTest, RejectsBadInputs) {
  std::vector<float> x(16, 0.0f);
  Params p;
  p.Add(1.0f, 0, 1.0f, 1, 0);
  DeviceSampler ds(x, 1, 16, 16, p);
  ASSERT_TRUE(ds.ok());
  SampleRowsArgs a = ds.args();
  a.ld = 8;
  EXPECT_FALSE(SampleRows(a, nullptr).ok());
  a = ds.args();
  a.vocab = 0;
  EXPECT_FALSE(SampleRows(a, nullptr).ok());
  a = ds.args();
  int32_t host_ids[1];
  a.out_ids = host_ids;
  EXPECT_FALSE(SampleRows(a, nullptr).ok());
  a = ds.args();
  a.vocab = a.ld = int64_t{1} << 22;
  EXPECT_FALSE(SampleRows(a, nullptr).ok());
}

TEST_F(SampleTest, DISABLED_Bench) {
  const int64_t vocab = 154880;
  struct Mode { const char* name; float t; int k; float p; };
  const Mode modes[] = {{"greedy", 0.0f, 0, 1.0f},
                        {"T=0.8", 0.8f, 0, 1.0f},
                        {"T=0.8 top_p=0.95", 0.8f, 0, 0.95f},
                        {"T=0.8 top_k=50 top_p=0.9", 0.8f, 50, 0.9f}};
  for (int32_t cluster : {1, 0})
  for (int64_t rows : {1, 8, 64}) {
    std::mt19937 rng(1);
    std::vector<float> x(static_cast<size_t>(rows * vocab));
    for (int64_t r = 0; r < rows; ++r) FillRow(x.data() + r * vocab, vocab, 5, rng);
    for (const Mode& m : modes) {
      Params p;
      for (int64_t r = 0; r < rows; ++r) p.Add(m.t, m.k, m.p, r, 3);
      DeviceSampler ds(x, rows, vocab, vocab, p);
      ASSERT_TRUE(ds.ok());
      ds.args().max_cluster = cluster;
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(SampleRows(ds.args(), nullptr).ok());
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      constexpr int kIters = 50;
      cudaEventRecord(a);
      for (int i = 0; i < kIters; ++i) (void)SampleRows(ds.args(), nullptr);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      std::printf("sample_rows vocab=%lld batch=%lld ctas/row=%d %-26s %8.1f us/step\n",
                  static_cast<long long>(vocab), static_cast<long long>(rows),
                  SampleClusterSize(vocab, rows, cluster).value_or(-1), m.name,
                  1000.0 * ms / kIters);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

}  // namespace
}  // namespace glm::kernels
