#include "engine/kv/block_manager.h"

#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace glm::engine {
namespace {

std::vector<int32_t> Tokens(std::initializer_list<int32_t> t) { return t; }

TEST(BlockManagerTest, AllocateAndFree) {
  BlockManager bm(8, 4, /*enable_prefix_caching=*/true);
  EXPECT_EQ(bm.StartSequence(1, {}, 0), 0);
  ASSERT_TRUE(bm.Reserve(1, 9));  // 3 blocks
  EXPECT_EQ(bm.BlockTable(1).size(), 3u);
  EXPECT_EQ(bm.NumFreeBlocks(), 5);
  EXPECT_FALSE(bm.Reserve(1, 40));  // 10 blocks > 8: refused, nothing changes
  EXPECT_EQ(bm.BlockTable(1).size(), 3u);
  ASSERT_TRUE(bm.CheckIntegrity().ok());
  bm.FreeSequence(1);
  EXPECT_EQ(bm.NumFreeBlocks(), 8);
  EXPECT_FALSE(bm.HasSequence(1));
  ASSERT_TRUE(bm.CheckIntegrity().ok());
}

TEST(BlockManagerTest, PrefixHitSharesFullBlocksOnly) {
  BlockManager bm(16, 4, true);
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  bm.StartSequence(1, a, 9);
  ASSERT_TRUE(bm.Reserve(1, a.size()));
  bm.MarkComputed(1, a, a.size());  // 2 full blocks registered, the partial third is not
  EXPECT_EQ(bm.Stats().num_cached_blocks, 2);

  std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 8, 42};
  EXPECT_EQ(bm.CachedPrefixLength(b, b.size() - 1), 8);
  EXPECT_EQ(bm.StartSequence(2, b, b.size() - 1), 8);
  EXPECT_EQ(bm.BlockTable(2)[0], bm.BlockTable(1)[0]);
  EXPECT_EQ(bm.BlockTable(2)[1], bm.BlockTable(1)[1]);
  ASSERT_TRUE(bm.Reserve(2, b.size()));
  EXPECT_NE(bm.BlockTable(2)[2], bm.BlockTable(1)[2]);
  ASSERT_TRUE(bm.CheckIntegrity().ok()) << bm.CheckIntegrity();

  // max_tokens caps the hit: a prompt that is exactly two blocks may only reuse one (one token
  // must be computed to produce logits).
  std::vector<int32_t> c = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(bm.CachedPrefixLength(c, 7), 4);
  // match_next_token: block 1 of `a` was followed by 9; c has no token after block 1, and
  // {.., 8, 42} has another one, so only block 0 (followed by 5 in both) is reused.
  EXPECT_EQ(bm.CachedPrefixLength(c, 8, /*match_next_token=*/true), 4);
  EXPECT_EQ(bm.CachedPrefixLength(b, 9, /*match_next_token=*/true), 4);
  EXPECT_EQ(bm.CachedPrefixLength(a, 10, /*match_next_token=*/true), 8);
  EXPECT_EQ(bm.StartSequence(3, c, 8, /*match_next_token=*/true), 4);
  // Different first block: no hit even though block 2 tokens match.
  std::vector<int32_t> d = {0, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(bm.CachedPrefixLength(d, 9), 0);
  ASSERT_TRUE(bm.CheckIntegrity().ok());
}

TEST(BlockManagerTest, CachedFreeBlocksSurviveUntilEvictedLru) {
  BlockManager bm(4, 2, true);
  std::vector<int32_t> a = {1, 2, 3, 4};
  bm.StartSequence(1, a, 3);
  ASSERT_TRUE(bm.Reserve(1, 4));
  bm.MarkComputed(1, a, 4);
  bm.FreeSequence(1);
  EXPECT_EQ(bm.NumFreeBlocks(), 4);
  EXPECT_EQ(bm.Stats().num_cached_blocks, 2);
  // Two uncached blocks are taken before any cached one is evicted.
  bm.StartSequence(2, {}, 0);
  ASSERT_TRUE(bm.Reserve(2, 4));
  EXPECT_EQ(bm.Stats().num_cached_blocks, 2);
  EXPECT_EQ(bm.CachedPrefixLength(a, 4), 4);
  // The next allocation evicts the least recently freed cached block: block 1 of seq 1 was
  // released first (tail first), so the tail block goes and the head block stays hit-able.
  bm.StartSequence(3, {}, 0);
  ASSERT_TRUE(bm.Reserve(3, 1));
  EXPECT_EQ(bm.Stats().num_evictions, 1);
  EXPECT_EQ(bm.CachedPrefixLength(a, 4), 2);
  ASSERT_TRUE(bm.CheckIntegrity().ok()) << bm.CheckIntegrity();
}

TEST(BlockManagerTest, DuplicateBlocksAreNotRegisteredTwice) {
  BlockManager bm(8, 2, true);
  std::vector<int32_t> a = {5, 6, 7, 8};
  bm.StartSequence(1, a, 0);
  bm.StartSequence(2, a, 0);
  ASSERT_TRUE(bm.Reserve(1, 4));
  ASSERT_TRUE(bm.Reserve(2, 4));
  bm.MarkComputed(1, a, 4);
  bm.MarkComputed(2, a, 4);
  EXPECT_EQ(bm.Stats().num_cached_blocks, 2);
  ASSERT_TRUE(bm.CheckIntegrity().ok()) << bm.CheckIntegrity();
  bm.FreeSequence(1);
  bm.FreeSequence(2);
  ASSERT_TRUE(bm.CheckIntegrity().ok()) << bm.CheckIntegrity();
}

TEST(BlockManagerTest, DisabledPrefixCachingNeverHits) {
  BlockManager bm(8, 2, false);
  std::vector<int32_t> a = {5, 6, 7, 8, 9};
  bm.StartSequence(1, a, 4);
  ASSERT_TRUE(bm.Reserve(1, 5));
  bm.MarkComputed(1, a, 5);
  EXPECT_EQ(bm.StartSequence(2, a, 4), 0);
  ASSERT_TRUE(bm.CheckIntegrity().ok());
}

TEST(BlockManagerTest, HashChainsOverParent) {
  const BlockHash h1 = BlockManager::HashBlock(BlockManager::kRootHash, Tokens({1, 2}));
  EXPECT_NE(BlockManager::HashBlock(h1, Tokens({3, 4})),
            BlockManager::HashBlock(BlockManager::kRootHash, Tokens({3, 4})));
  EXPECT_EQ(h1, BlockManager::HashBlock(BlockManager::kRootHash, Tokens({1, 2})));
}

// Thousands of random operations on a small pool with a small token alphabet (so prefixes are
// shared often); CheckIntegrity after each one, plus a model of what every table must hold.
TEST(BlockManagerTest, RandomizedOperationsKeepInvariants) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    const int block_size = 1 + seed % 4;
    BlockManager bm(24, block_size, true);
    struct Seq {
      std::vector<int32_t> tokens;
      int64_t reserved = 0;
      int64_t computed = 0;
    };
    std::map<int64_t, Seq> live;
    int64_t next_id = 0;
    int64_t hits = 0;
    for (int op = 0; op < 4000; ++op) {
      const int kind = rng() % 10;
      if (kind < 3 || live.empty()) {  // start a sequence from a random prompt
        Seq s;
        const int len = 1 + rng() % 12;
        for (int i = 0; i < len; ++i) s.tokens.push_back(rng() % 3);
        const int cached = bm.StartSequence(next_id, s.tokens, len - 1);
        ASSERT_EQ(cached % block_size, 0);
        ASSERT_LE(cached, len - 1);
        hits += cached;
        s.reserved = static_cast<int64_t>(bm.BlockTable(next_id).size()) * block_size;
        s.computed = cached;
        live[next_id++] = s;
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        Seq& s = it->second;
        if (kind < 6) {  // compute some tokens (reserving first), maybe generate one
          const int64_t target = std::min<int64_t>(s.tokens.size(), s.computed + 1 + rng() % 5);
          const int free_before = bm.NumFreeBlocks();
          const int need = bm.BlocksNeeded(it->first, target);
          if (bm.Reserve(it->first, target)) {
            s.reserved = std::max<int64_t>(s.reserved, target);
            s.computed = target;
            bm.MarkComputed(it->first, s.tokens, s.computed);
            if (s.computed == static_cast<int64_t>(s.tokens.size())) s.tokens.push_back(rng() % 3);
          } else {
            ASSERT_GT(need, free_before);
            ASSERT_EQ(bm.NumFreeBlocks(), free_before);
          }
        } else {  // finish or preempt: free everything
          bm.FreeSequence(it->first);
          live.erase(it);
        }
      }
      ASSERT_TRUE(bm.CheckIntegrity().ok()) << "op " << op << ": " << bm.CheckIntegrity();
      // Model check: a table covers what was reserved; free + distinct used == num_blocks.
      std::vector<char> used(bm.num_blocks(), 0);
      for (auto& [id, s] : live) {
        const auto& table = bm.BlockTable(id);
        ASSERT_GE(static_cast<int64_t>(table.size()) * block_size, s.computed);
        for (BlockId b : table) used[b] = 1;
      }
      int num_used = 0;
      for (char u : used) num_used += u;
      ASSERT_EQ(num_used + bm.NumFreeBlocks(), bm.num_blocks());
    }
    EXPECT_GT(hits, 0);
    EXPECT_GT(bm.Stats().num_evictions, 0);
    for (auto& [id, s] : live) bm.FreeSequence(id);
    EXPECT_EQ(bm.NumFreeBlocks(), bm.num_blocks());
    ASSERT_TRUE(bm.CheckIntegrity().ok());
  }
}

}  // namespace
}  // namespace glm::engine
