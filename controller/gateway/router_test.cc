#include "controller/gateway/router.h"

#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace glm::gateway {
namespace {

// `n` distinct tokens starting at `first`.
std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

ReplicaLoad Load(int replica, int64_t outstanding, int running = 0, bool ready = true) {
  return ReplicaLoad{replica, ready, outstanding, running};
}

TEST(RouterTest, NoReadyReplicaIsMinusOne) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(64, 0);
  EXPECT_EQ(router.Pick(prompt, {}), -1);
  const std::vector<ReplicaLoad> loads = {Load(0, 0, 0, false), Load(1, 0, 0, false)};
  EXPECT_EQ(router.Pick(prompt, loads), -1);
}

TEST(RouterTest, LeastLoadedWithoutMatch) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(64, 0);
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 300), Load(1, 200), Load(2, 250)}),
            1);
  // Tie on tokens: fewer running requests, then the lowest id.
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 200, 2), Load(1, 200, 1),
                                                         Load(2, 200, 1)}),
            1);
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(5, 200), Load(3, 200)}), 3);
  // Empty prompt: least loaded.
  EXPECT_EQ(router.Pick({}, std::vector<ReplicaLoad>{Load(0, 300), Load(1, 200)}), 1);
}

TEST(RouterTest, AffinityWinsWhenBalanced) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(100, 0);
  router.Record(0, prompt);
  EXPECT_EQ(router.MatchTokens(0, prompt), 96);  // six whole 16-token blocks
  // Replica 1 is less loaded, but within the balance bounds.
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 3000), Load(1, 100)}), 0);
  // Over the absolute bound but not 1.5x: still balanced.
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 20000), Load(1, 15000)}), 0);
  // A longer conversation sharing the prefix follows it too.
  std::vector<int32_t> longer = prompt;
  for (int32_t t : Tokens(60, 5000)) longer.push_back(t);
  EXPECT_EQ(router.Pick(longer, std::vector<ReplicaLoad>{Load(0, 3000), Load(1, 100)}), 0);
}

TEST(RouterTest, LoadBoundOverridesAffinity) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(100, 0);
  router.Record(0, prompt);
  // max - min = 9900 > 4096 and 10000 > 1.5 * 100.
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 10000), Load(1, 100)}), 1);
  // Not-ready replicas do not count towards the imbalance.
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 10000), Load(1, 100),
                                                         Load(2, 0, 0, false)}),
            1);
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 10000), Load(1, 9000),
                                                         Load(2, 0, 0, false)}),
            0);
}

TEST(RouterTest, ShortMatchFallsBackToLeastLoaded) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(100, 0);
  router.Record(0, std::vector<int32_t>(prompt.begin(), prompt.begin() + 16));
  // 16 / 100 <= 0.3.
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 300), Load(1, 200)}), 1);
  router.Record(0, std::vector<int32_t>(prompt.begin(), prompt.begin() + 32));
  // 32 / 100 > 0.3.
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 300), Load(1, 200)}), 0);
  // A different prompt of the same length matches nothing.
  EXPECT_EQ(router.Pick(Tokens(100, 7), std::vector<ReplicaLoad>{Load(0, 300), Load(1, 200)}), 1);
}

TEST(RouterTest, LongestMatchWinsAndTiesGoToLeastLoaded) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(128, 0);
  router.Record(0, std::vector<int32_t>(prompt.begin(), prompt.begin() + 64));
  router.Record(1, prompt);
  router.Record(2, prompt);
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 0), Load(1, 2000), Load(2, 1000)}),
            2);
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 0), Load(1, 1000), Load(2, 2000)}),
            1);
}

TEST(RouterTest, NotReadyReplicaIsSkipped) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(64, 0);
  router.Record(0, prompt);
  EXPECT_EQ(router.Pick(prompt, std::vector<ReplicaLoad>{Load(0, 0, 0, false), Load(1, 500),
                                                         Load(2, 400)}),
            2);
}

TEST(RouterTest, ForgetDropsAffinity) {
  Router router;
  const std::vector<int32_t> prompt = Tokens(64, 0);
  router.Record(1, prompt);
  const std::vector<ReplicaLoad> loads = {Load(0, 100), Load(1, 200)};
  EXPECT_EQ(router.Pick(prompt, loads), 1);
  router.Forget(1);
  EXPECT_EQ(router.CachedTokens(1), 0);
  EXPECT_EQ(router.Pick(prompt, loads), 0);
}

TEST(RouterTest, MemoryBoundEvictsLeastRecentlyUsed) {
  RouterOptions opts;
  opts.max_tree_tokens = 64;  // four 16-token blocks
  Router router(opts);
  const std::vector<int32_t> a = Tokens(64, 0);
  const std::vector<int32_t> b = Tokens(64, 1000);
  router.Record(0, a);
  EXPECT_EQ(router.CachedTokens(0), 64);
  EXPECT_EQ(router.MatchTokens(0, a), 64);
  router.Record(0, b);
  EXPECT_EQ(router.CachedTokens(0), 64);
  EXPECT_EQ(router.MatchTokens(0, a), 0);
  EXPECT_EQ(router.MatchTokens(0, b), 64);
  // A prefix outlives its extensions: adding 32 new tokens evicts b's two deepest blocks.
  router.Record(0, Tokens(32, 2000));
  EXPECT_EQ(router.CachedTokens(0), 64);
  EXPECT_EQ(router.MatchTokens(0, b), 32);
  // A prompt longer than the bound keeps its prefix.
  const std::vector<int32_t> c = Tokens(160, 3000);
  router.Record(0, c);
  EXPECT_EQ(router.MatchTokens(0, c), 64);
  EXPECT_EQ(router.CachedTokens(0), 64);
  // Other replicas are bounded separately.
  router.Record(1, a);
  EXPECT_EQ(router.MatchTokens(1, a), 64);
  EXPECT_EQ(router.MatchTokens(0, c), 64);
}

TEST(RouterTest, RecordTouchRefreshesLru) {
  RouterOptions opts;
  opts.max_tree_tokens = 64;
  Router router(opts);
  const std::vector<int32_t> a = Tokens(32, 0);
  const std::vector<int32_t> b = Tokens(32, 1000);
  router.Record(0, a);
  router.Record(0, b);
  router.Record(0, a);  // a is now the most recent
  router.Record(0, Tokens(32, 2000));
  EXPECT_EQ(router.MatchTokens(0, a), 32);
  EXPECT_EQ(router.MatchTokens(0, b), 0);
}

TEST(RouterTest, MatchIsByWholePrefixNotBlockContent) {
  Router router;
  // Same second block, different first block: no match at all.
  std::vector<int32_t> a = Tokens(32, 0);
  std::vector<int32_t> b = a;
  b[0] = 999;
  router.Record(0, a);
  EXPECT_EQ(router.MatchTokens(0, b), 0);
  EXPECT_EQ(router.MatchTokens(0, a), 32);
}

}  // namespace
}  // namespace glm::gateway
