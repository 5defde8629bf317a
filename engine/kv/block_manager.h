// Paged KV block manager with reference counts and prefix caching by block hash.
//
// The model owns the KV storage; this class only hands out block ids in [0, num_blocks) and keeps,
// per sequence, the block table that covers its positions. A block holds `block_size` consecutive
// positions of one sequence (every layer of this shard, main and MTP).
//
// Prefix caching: once all `block_size` positions of a block are computed (their KV written and
// final), the block is registered under
//   hash_i = XXH3_64(parent_hash_{i-1} ‖ token_ids of block i)     (parent of block 0: a seed)
// together with its token ids (compared on every hit, so a hash collision can never alias two
// prefixes). Registered blocks stay cached after their last user frees them; they are reusable on
// a later hit and evicted LRU (least recently freed first) only when a fresh block is needed and no
// uncached free block is left. Only full blocks are ever cached or shared; a sequence never writes
// into a block it shares, because it writes positions >= its cached prefix only.
//
// MTP: the draft layer's KV entry at position p is computed from (h_p, t_{p+1}), so the entry at a
// block's last position depends on the token after the block. Each cached block records that
// token (the one its writer had); lookups with `match_next_token` use a block only if the
// caller's token after it is the same, which keeps the reused MTP KV exact.
//
// Not thread-safe: owned and driven by the scheduler's thread.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace glm::engine {

using BlockId = int32_t;
using BlockHash = uint64_t;

struct BlockManagerStats {
  int num_blocks = 0;
  int num_free_blocks = 0;    // allocatable now: uncached free + cached evictable
  int num_cached_blocks = 0;  // registered in the prefix cache (in use or not)
  int64_t num_evictions = 0;
  int64_t num_hit_blocks = 0;  // blocks reused through prefix-cache hits
};

class BlockManager {
 public:
  // `enable_prefix_caching` false: nothing is ever registered or hit.
  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  // Blocks a new allocation can take now (uncached free blocks + evictable cached blocks).
  int NumFreeBlocks() const { return static_cast<int>(free_list_.size()); }
  int NumBlocksForTokens(int64_t num_tokens) const {
    return static_cast<int>((num_tokens + block_size_ - 1) / block_size_);
  }

  // Number of leading tokens of `token_ids` found in the prefix cache as a chain of full blocks,
  // counting only blocks that lie entirely within the first `max_tokens` tokens; with
  // `match_next_token`, also only blocks whose recorded next token equals the caller's token
  // after the block (which must exist). Pure query.
  int CachedPrefixLength(absl::Span<const int32_t> token_ids, int max_tokens,
                         bool match_next_token = false) const;

  // Starts the block table of a new sequence `seq_id` (must not exist): takes the chain of cached
  // full blocks CachedPrefixLength finds, bumping their reference counts. Returns the number of
  // cached tokens (a multiple of block_size). Never allocates fresh blocks, so it cannot fail.
  int StartSequence(int64_t seq_id, absl::Span<const int32_t> token_ids, int max_cached_tokens,
                    bool match_next_token = false);

  // Grows the table of `seq_id` to cover positions [0, num_tokens). Returns false and changes
  // nothing when there are not enough free blocks. Never shrinks.
  bool Reserve(int64_t seq_id, int64_t num_tokens);

  // Blocks `Reserve(seq_id, num_tokens)` would need to take from the free list.
  int BlocksNeeded(int64_t seq_id, int64_t num_tokens) const;

  // Declares positions [0, num_computed) of `seq_id` computed and final, with `token_ids` the
  // sequence's tokens (at least num_computed of them). Newly full blocks are registered in the
  // prefix cache (unless an equal block is already registered), each with the token after it
  // (-1 when token_ids ends at the block).
  void MarkComputed(int64_t seq_id, absl::Span<const int32_t> token_ids, int64_t num_computed);

  // Releases every block of `seq_id` and forgets the sequence. Blocks whose count drops to zero
  // become free (cached ones stay hit-able until evicted). Unknown ids are ignored.
  void FreeSequence(int64_t seq_id);

  bool HasSequence(int64_t seq_id) const { return seqs_.count(seq_id) > 0; }
  // Physical blocks of `seq_id` in position order; the sequence must exist.
  const std::vector<BlockId>& BlockTable(int64_t seq_id) const;

  BlockManagerStats Stats() const;

  // Verifies every invariant: reference counts equal the number of table entries naming each
  // block; the free list holds exactly the unreferenced blocks, once each; no table names a block
  // twice or names a free block; the hash map and the blocks' hashes agree both ways and each
  // hash recomputes from its tokens and parent; sequences' hash chains match their blocks.
  // Returns the first violation found. O(num_blocks + total table length).
  absl::Status CheckIntegrity() const;

  // Hash of a full block given its parent's hash (kRootHash for block 0).
  static BlockHash HashBlock(BlockHash parent, absl::Span<const int32_t> token_ids);
  static constexpr BlockHash kRootHash = 0x9e3779b97f4a7c15ULL;

 private:
  struct Block {
    int ref_count = 0;
    bool cached = false;            // registered in hash_to_block_
    BlockHash hash = 0;             // valid when cached
    BlockHash parent_hash = 0;      // valid when cached
    std::vector<int32_t> token_ids; // [block_size] when cached
    int32_t next_token = -1;        // when cached: token after the block in its writer, or -1
    bool in_free_list = false;
    std::list<BlockId>::iterator free_it;
  };
  struct Sequence {
    std::vector<BlockId> blocks;
    std::vector<BlockHash> hashes;  // hashes of the sequence's full computed blocks, in order
  };

  // Takes one block from the free list (evicting its cache entry if it has one), ref_count 1.
  BlockId AllocateBlock();
  void RemoveFromFreeList(BlockId id);
  void Release(BlockId id);

  const int num_blocks_;
  const int block_size_;
  const bool enable_prefix_caching_;
  std::vector<Block> blocks_;
  // Free blocks: uncached ones at the front (taken first), cached ones appended at the back in
  // the order they were freed, so the front-most cached block is the least recently used.
  std::list<BlockId> free_list_;
  std::unordered_map<BlockHash, BlockId> hash_to_block_;
  std::unordered_map<int64_t, Sequence> seqs_;
  int64_t num_evictions_ = 0;
  int64_t num_hit_blocks_ = 0;
};

}  // namespace glm::engine
