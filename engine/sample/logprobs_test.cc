#include "engine/sample/logprobs.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sample_rule.h"

namespace glm::engine {
namespace {

// log_softmax by the definition, in long double.
std::vector<double> Reference(const std::vector<float>& x) {
  long double sum = 0;
  for (float v : x) sum += std::exp(static_cast<long double>(v));
  std::vector<double> out;
  for (float v : x) out.push_back(static_cast<double>(v - std::log(sum)));
  return out;
}

TEST(LogprobsTest, MatchesLogSoftmaxAndOrdersTheTopByValueThenId) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f};
  const std::vector<double> want = Reference(logits);
  const TokenLogprobs lp = ComputeLogprobs(logits, /*token=*/4, /*k=*/4);
  EXPECT_NEAR(lp.logprob, want[4], 1e-6);
  ASSERT_EQ(lp.top.size(), 4u);
  const std::vector<int32_t> ids = {1, 3, 5, 0};  // 3.0 twice: lower id first
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(lp.top[i].first, ids[i]) << i;
    EXPECT_NEAR(lp.top[i].second, want[ids[i]], 1e-6) << i;
  }
  EXPECT_EQ(lp.top[0].second, lp.top[1].second);
}

TEST(LogprobsTest, LargeLogitsDoNotOverflowAndProbabilitiesSumToOne) {
  std::vector<float> logits;
  for (int i = 0; i < 1000; ++i) logits.push_back(500.0f + 0.01f * static_cast<float>(i % 37));
  const TokenLogprobs lp = ComputeLogprobs(logits, 0, 0);
  EXPECT_TRUE(std::isfinite(lp.logprob));
  EXPECT_TRUE(lp.top.empty());
  double total = 0;
  for (size_t t = 0; t < logits.size(); ++t) {
    const TokenLogprobs one = ComputeLogprobs(logits, static_cast<int32_t>(t), 0);
    total += std::exp(static_cast<double>(one.logprob));
  }
  EXPECT_NEAR(total, 1.0, 1e-4);
}

TEST(LogprobsTest, KIsClampedToTheVocabAndTheTokenNeedNotBeInTheTop) {
  const std::vector<float> logits = {0.0f, -1.0f, 2.0f};
  const TokenLogprobs lp = ComputeLogprobs(logits, 1, 20);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_EQ(lp.top[2].first, 1);
  const TokenLogprobs one = ComputeLogprobs(logits, 1, 1);
  ASSERT_EQ(one.top.size(), 1u);
  EXPECT_EQ(one.top[0].first, 2);
  EXPECT_NEAR(one.logprob, Reference(logits)[1], 1e-6);
}

TEST(LogprobsTest, NanAndMinusInfinityGetMinusInfinityAndStayOutOfTheSum) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> masked = {-inf, 1.0f, std::nanf(""), 1.0f};
  const TokenLogprobs lp = ComputeLogprobs(masked, 0, 4);
  EXPECT_EQ(lp.logprob, -inf);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0], std::make_pair(1, static_cast<float>(std::log(0.5))));
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2], std::make_pair(0, -inf));  // -inf and NaN tie at -inf: lower id first
  EXPECT_EQ(lp.top[3], std::make_pair(2, -inf));
  EXPECT_TRUE(std::isnan(ComputeLogprobs(masked, 7, 0).logprob));  // id outside the row

  const std::vector<float> peak = {0.0f, inf, 3.0f};
  EXPECT_EQ(ComputeLogprobs(peak, 1, 0).logprob, 0.0f);
  EXPECT_EQ(ComputeLogprobs(peak, 2, 0).logprob, -inf);
  const std::vector<float> nothing = {-inf, std::nanf("")};
  EXPECT_EQ(ComputeLogprobs(nothing, 0, 0).logprob, -inf);
}

// The sampled token's logprob is the backends' (Backend::Sample out_logprobs) bit for bit.
TEST(LogprobsTest, TokenLogprobIsTheSampleRulesBits) {
  std::vector<float> logits;
  for (int i = 0; i < 4099; ++i) logits.push_back(std::sin(0.37f * i) * 9.0f - 0.001f * i);
  for (int32_t t : {0, 17, 4098}) {
    EXPECT_EQ(ComputeLogprobs(logits, t, 3).logprob,
              sample_rule::LogProbHost(logits.data(), static_cast<int64_t>(logits.size()), t));
  }
}

}  // namespace
}  // namespace glm::engine
