#include "engine/sample/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace glm::engine
