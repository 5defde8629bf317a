#include "engine/sample/sampler.h"

#include <cmath>
#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sample_rule.h"

namespace glm::engine {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};

std::vector<double> Softmax(const std::vector<float>& l, double t) {
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(l[i] / t);
  for (double& x : p) x /= s;
  return p;
}

std::vector<double> Frequencies(const SamplingParams& p, int n, uint64_t seed = 7) {
  std::vector<double> f(kLogits.size(), 0.0);
  for (int i = 0; i < n; ++i) f[SampleToken(kLogits, p, seed, i)] += 1.0 / n;
  return f;
}

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  SamplingParams p;
  EXPECT_EQ(SampleToken(kLogits, p, 1, 0), 1);
  EXPECT_EQ(ArgMax(kLogits), 1);
  p.temperature = 0.0f;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleToken(kLogits, p, i, i), 1);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  for (int i = 0; i < 200; ++i) EXPECT_EQ(SampleToken(kLogits, p, 3, i), 1);
}

TEST(SamplerTest, TinyTopPIsArgmax) {
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_p = 1e-6f;
  for (int i = 0; i < 200; ++i) EXPECT_EQ(SampleToken(kLogits, p, 9, i), 1);
}

TEST(SamplerTest, TemperatureMatchesSoftmaxDistribution) {
  SamplingParams p;
  p.temperature = 1.5f;
  const int n = 40000;
  auto f = Frequencies(p, n);
  auto want = Softmax(kLogits, 1.5);
  for (size_t i = 0; i < want.size(); ++i) {
    const double sd = std::sqrt(want[i] * (1 - want[i]) / n);
    EXPECT_NEAR(f[i], want[i], 5 * sd + 1e-9) << "token " << i;
  }
}

TEST(SamplerTest, TopKRestrictsAndRenormalises) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;  // tokens 1, 3 (tied, lower id first), 2
  const int n = 30000;
  auto f = Frequencies(p, n);
  auto full = Softmax(kLogits, 1.0);
  const double mass = full[1] + full[3] + full[2];
  for (int i : {0, 4, 5}) EXPECT_EQ(f[i], 0.0) << i;
  for (int i : {1, 2, 3}) {
    const double want = full[i] / mass;
    EXPECT_NEAR(f[i], want, 5 * std::sqrt(want * (1 - want) / n)) << i;
  }
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingMass) {
  SamplingParams p;
  p.temperature = 1.0f;
  auto full = Softmax(kLogits, 1.0);
  // Mass of {1, 3} is below 0.8; {1, 3, 2} reaches it.
  ASSERT_LT(full[1] + full[3], 0.8);
  ASSERT_GE(full[1] + full[3] + full[2], 0.8);
  p.top_p = 0.8f;
  const int n = 30000;
  auto f = Frequencies(p, n);
  for (int i : {0, 4, 5}) EXPECT_EQ(f[i], 0.0) << i;
  EXPECT_GT(f[2], 0.0);
}

TEST(SamplerTest, SeedAndIndexDetermineTheDraw) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<int32_t> a, b, c;
  for (int i = 0; i < 64; ++i) {
    a.push_back(SampleToken(kLogits, p, 42, i));
    b.push_back(SampleToken(kLogits, p, 42, i));
    c.push_back(SampleToken(kLogits, p, 43, i));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Draws are uniform-ish in [0, 1).
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = UniformDraw(5, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(SamplerTest, BannedTokensAreNeverChosenUnlessAllAre) {
  SamplingParams p;
  std::vector<int32_t> banned = {1, 3};
  EXPECT_EQ(SampleToken(kLogits, p, 1, 0, banned), 2);
  p.temperature = 1.0f;
  for (int i = 0; i < 500; ++i) {
    const int32_t t = SampleToken(kLogits, p, 1, i, banned);
    EXPECT_NE(t, 1);
    EXPECT_NE(t, 3);
  }
  std::vector<int32_t> all = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(SampleToken(kLogits, SamplingParams{}, 1, 0, all), 1);
}

TEST(SamplerTest, ValidateRejectsBadValues) {
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p, 10).ok());
  p.temperature = -1;
  EXPECT_FALSE(ValidateSamplingParams(p, 10).ok());
  p = {};
  p.top_p = 0;
  EXPECT_FALSE(ValidateSamplingParams(p, 10).ok());
  p = {};
  p.top_k = -2;
  EXPECT_FALSE(ValidateSamplingParams(p, 10).ok());
  p = {};
  p.max_tokens = 0;
  EXPECT_FALSE(ValidateSamplingParams(p, 10).ok());
  p = {};
  p.min_tokens = 20;
  EXPECT_FALSE(ValidateSamplingParams(p, 10).ok());
  p = {};
  p.stop_token_ids = {10};
  auto s = ValidateSamplingParams(p, 10);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("vocab_size"), std::string::npos);
}

TEST(SamplerTest, ValidateBoundsLogprobs) {
  SamplingParams p;
  for (int k : {0, 1, 20}) {
    p.logprobs = k;
    EXPECT_TRUE(ValidateSamplingParams(p, 10).ok()) << k;
  }
  for (int k : {-1, 21}) {
    p.logprobs = k;
    const absl::Status s = ValidateSamplingParams(p, 10);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k;
    EXPECT_NE(s.message().find("logprobs"), std::string::npos) << s;
  }
}


// The rule's exp (bit-identical on host and device) is accurate to ~1e-15 relative.
TEST(SampleRuleTest, DetExpIsAccurate) {
  double worst = 0;
  for (double x = -40.0; x <= 0.0; x += 0.000913) {
    const double want = std::exp(x);
    worst = std::max(worst, std::abs(sample_rule::DetExp(x) - want) / want);
  }
  EXPECT_LT(worst, 4e-15);
  EXPECT_EQ(sample_rule::DetExp(0.0), 1.0);
  EXPECT_EQ(sample_rule::DetExp(-1000.0), 0.0);
}

TEST(SampleRuleTest, KeysOrderLogitsAndNanIsLowest) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {-inf, -3.5f, -0.0f, 0.0f, 1e-30f, 2.0f, inf};
  for (size_t i = 1; i < v.size(); ++i) EXPECT_LT(sample_rule::Key(v[i - 1]), sample_rule::Key(v[i]));
  EXPECT_EQ(sample_rule::Key(std::numeric_limits<float>::quiet_NaN()), 0u);
  EXPECT_EQ(sample_rule::Key(-inf), sample_rule::kNegInfKey);
  for (float x : v) EXPECT_EQ(sample_rule::KeyToFloat(sample_rule::Key(x)), x);
}

TEST(SampleRuleTest, NanAndInfRows) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.temperature = 1.0f;
  // NaN is never drawn; all -inf/NaN falls back to greedy (the lowest id of the largest key).
  const std::vector<float> a = {nan, 1.0f, nan, 1.0f};
  for (int i = 0; i < 200; ++i) {
    const int32_t t = SampleToken(a, p, 3, i);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  EXPECT_EQ(SampleToken(std::vector<float>{nan, -inf, nan}, p, 1, 0), 1);
  EXPECT_EQ(SampleToken(std::vector<float>{nan, nan}, p, 1, 0), 0);
  // +inf logits share all the mass.
  const std::vector<float> b = {3.0f, inf, 100.0f, inf};
  for (int i = 0; i < 200; ++i) {
    const int32_t t = SampleToken(b, p, 4, i);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

// 20,000 seeded draws of a 64-token row against the exact truncated softmax (real arithmetic):
// support exact, chi-square and total variation within bounds (deterministic: fixed seed).
TEST(SampleRuleTest, DistributionMatchesTruncatedSoftmax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> l(64);
  for (float& v : l) v = nd(rng);
  l[9] = l[40] = 2.5f;
  struct Case { float t; int k; float p; };
  for (const Case& c : {Case{1.0f, 0, 1.0f}, Case{0.8f, 0, 0.9f}, Case{0.8f, 20, 1.0f},
                        Case{1.5f, 12, 0.8f}}) {
    std::vector<int> order(l.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    const size_t keep = c.k > 0 ? static_cast<size_t>(c.k) : l.size();
    std::vector<double> w(keep);
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += w[i] = std::exp((l[order[i]] - l[order[0]]) / c.t);
    size_t n = keep;
    if (c.p < 1) {
      double cum = 0;
      for (n = 0; n < keep && cum < c.p * total; ++n) cum += w[n];
    }
    double mass = 0;
    for (size_t i = 0; i < n; ++i) mass += w[i];
    std::vector<double> want(l.size(), 0.0);
    for (size_t i = 0; i < n; ++i) want[order[i]] = w[i] / mass;
    SamplingParams p;
    p.temperature = c.t;
    p.top_k = c.k;
    p.top_p = c.p;
    const int draws = 20000;
    std::vector<double> count(l.size(), 0.0);
    for (int i = 0; i < draws; ++i) {
      const int32_t t = SampleToken(l, p, 2024, i);
      ASSERT_GT(want[t], 0.0) << "token " << t << " outside the kept set";
      count[t] += 1;
    }
    double chi2 = 0, tv = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (want[i] == 0) continue;
      chi2 += (count[i] - want[i] * draws) * (count[i] - want[i] * draws) / (want[i] * draws);
      tv += std::abs(count[i] / draws - want[i]) / 2;
    }
    const double dof = static_cast<double>(n) - 1;
    EXPECT_LT(chi2, dof + 5 * std::sqrt(2 * std::max(dof, 1.0)) + 5) << c.t << " " << c.k;
    EXPECT_LT(tv, 0.02);
  }
}

}  // namespace
}  // namespace glm::engine
