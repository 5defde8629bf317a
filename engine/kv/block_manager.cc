#include "engine/kv/block_manager.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace glm::engine {

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      enable_prefix_caching_(enable_prefix_caching),
      blocks_(static_cast<size_t>(std::max(num_blocks, 0))) {
  for (BlockId id = 0; id < num_blocks_; ++id) {
    blocks_[id].free_it = free_list_.insert(free_list_.end(), id);
    blocks_[id].in_free_list = true;
  }
}

BlockHash BlockManager::HashBlock(BlockHash parent, absl::Span<const int32_t> token_ids) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &parent, sizeof(parent));
  XXH3_64bits_update(state, token_ids.data(), token_ids.size() * sizeof(int32_t));
  const BlockHash h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

int BlockManager::CachedPrefixLength(absl::Span<const int32_t> token_ids, int max_tokens,
                                     bool match_next_token) const {
  if (!enable_prefix_caching_) return 0;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(token_ids.size()));
  BlockHash parent = kRootHash;
  int num_tokens = 0;
  for (int64_t start = 0; start + block_size_ <= limit; start += block_size_) {
    auto block_tokens = token_ids.subspan(start, block_size_);
    const BlockHash h = HashBlock(parent, block_tokens);
    auto it = hash_to_block_.find(h);
    if (it == hash_to_block_.end()) break;
    const Block& b = blocks_[it->second];
    if (b.parent_hash != parent ||
        !std::equal(b.token_ids.begin(), b.token_ids.end(), block_tokens.begin())) {
      break;  // hash collision: treat as a miss
    }
    if (match_next_token &&
        (start + block_size_ >= static_cast<int64_t>(token_ids.size()) ||
         b.next_token != token_ids[start + block_size_])) {
      break;
    }
    num_tokens += block_size_;
    parent = h;
  }
  return num_tokens;
}

int BlockManager::StartSequence(int64_t seq_id, absl::Span<const int32_t> token_ids,
                                int max_cached_tokens, bool match_next_token) {
  Sequence& seq = seqs_[seq_id];
  const int num_hit =
      CachedPrefixLength(token_ids, max_cached_tokens, match_next_token) / block_size_;
  BlockHash parent = kRootHash;
  for (int i = 0; i < num_hit; ++i) {
    const BlockHash h = HashBlock(parent, token_ids.subspan(i * block_size_, block_size_));
    const BlockId id = hash_to_block_.at(h);
    Block& b = blocks_[id];
    if (b.ref_count == 0) RemoveFromFreeList(id);
    ++b.ref_count;
    seq.blocks.push_back(id);
    seq.hashes.push_back(h);
    parent = h;
  }
  num_hit_blocks_ += num_hit;
  return num_hit * block_size_;
}

int BlockManager::BlocksNeeded(int64_t seq_id, int64_t num_tokens) const {
  auto it = seqs_.find(seq_id);
  const int have = it == seqs_.end() ? 0 : static_cast<int>(it->second.blocks.size());
  return std::max(0, NumBlocksForTokens(num_tokens) - have);
}

bool BlockManager::Reserve(int64_t seq_id, int64_t num_tokens) {
  const int need = BlocksNeeded(seq_id, num_tokens);
  if (need > NumFreeBlocks()) return false;
  Sequence& seq = seqs_[seq_id];
  for (int i = 0; i < need; ++i) seq.blocks.push_back(AllocateBlock());
  return true;
}

void BlockManager::MarkComputed(int64_t seq_id, absl::Span<const int32_t> token_ids,
                                int64_t num_computed) {
  if (!enable_prefix_caching_) return;
  Sequence& seq = seqs_.at(seq_id);
  const int64_t num_full = std::min<int64_t>(num_computed / block_size_,
                                             static_cast<int64_t>(seq.blocks.size()));
  while (static_cast<int64_t>(seq.hashes.size()) < num_full) {
    const size_t i = seq.hashes.size();
    const BlockHash parent = i == 0 ? kRootHash : seq.hashes[i - 1];
    auto block_tokens = token_ids.subspan(i * block_size_, block_size_);
    const BlockHash h = HashBlock(parent, block_tokens);
    seq.hashes.push_back(h);
    Block& b = blocks_[seq.blocks[i]];
    if (b.cached) continue;  // a hit block, already registered under this hash
    if (hash_to_block_.count(h) > 0) continue;  // an equal block is registered already
    b.cached = true;
    b.hash = h;
    b.parent_hash = parent;
    b.token_ids.assign(block_tokens.begin(), block_tokens.end());
    const size_t next = (i + 1) * block_size_;
    b.next_token = next < token_ids.size() ? token_ids[next] : -1;
    hash_to_block_[h] = seq.blocks[i];
  }
}

void BlockManager::FreeSequence(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  // Release tail blocks first so that, among cached blocks, a sequence's later blocks are evicted
  // before its earlier ones (an earlier block is useful to more prefixes).
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) Release(*b);
  seqs_.erase(it);
}

const std::vector<BlockId>& BlockManager::BlockTable(int64_t seq_id) const {
  return seqs_.at(seq_id).blocks;
}

BlockId BlockManager::AllocateBlock() {
  const BlockId id = free_list_.front();
  RemoveFromFreeList(id);
  Block& b = blocks_[id];
  if (b.cached) {
    hash_to_block_.erase(b.hash);
    b.cached = false;
    b.token_ids.clear();
    b.next_token = -1;
    ++num_evictions_;
  }
  b.ref_count = 1;
  return id;
}

void BlockManager::RemoveFromFreeList(BlockId id) {
  Block& b = blocks_[id];
  free_list_.erase(b.free_it);
  b.in_free_list = false;
}

void BlockManager::Release(BlockId id) {
  Block& b = blocks_[id];
  if (--b.ref_count > 0) return;
  b.free_it = b.cached ? free_list_.insert(free_list_.end(), id)
                       : free_list_.insert(free_list_.begin(), id);
  b.in_free_list = true;
}

BlockManagerStats BlockManager::Stats() const {
  BlockManagerStats s;
  s.num_blocks = num_blocks_;
  s.num_free_blocks = NumFreeBlocks();
  s.num_cached_blocks = static_cast<int>(hash_to_block_.size());
  s.num_evictions = num_evictions_;
  s.num_hit_blocks = num_hit_blocks_;
  return s;
}

absl::Status BlockManager::CheckIntegrity() const {
  std::vector<int> refs(blocks_.size(), 0);
  for (const auto& [seq_id, seq] : seqs_) {
    std::vector<BlockId> sorted = seq.blocks;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return absl::InternalError(absl::StrCat("seq ", seq_id, " names a block twice"));
    }
    for (BlockId id : seq.blocks) {
      if (id < 0 || id >= num_blocks_) {
        return absl::InternalError(absl::StrCat("seq ", seq_id, " has block id ", id,
                                                " outside [0, ", num_blocks_, ")"));
      }
      ++refs[id];
    }
    if (seq.hashes.size() > seq.blocks.size()) {
      return absl::InternalError(absl::StrCat("seq ", seq_id, " has more hashes than blocks"));
    }
    for (size_t i = 0; i < seq.hashes.size(); ++i) {
      const Block& b = blocks_[seq.blocks[i]];
      if (b.cached && b.hash != seq.hashes[i]) {
        return absl::InternalError(absl::StrCat("seq ", seq_id, " block ", i, " (id ",
                                                seq.blocks[i], ") is cached under another hash"));
      }
      if (b.cached && b.parent_hash != (i == 0 ? kRootHash : seq.hashes[i - 1])) {
        return absl::InternalError(absl::StrCat("seq ", seq_id, " block ", i, " parent mismatch"));
      }
    }
  }
  size_t free_count = 0;
  std::vector<char> seen_free(blocks_.size(), 0);
  for (BlockId id : free_list_) {
    if (id < 0 || id >= num_blocks_) return absl::InternalError("free list holds a bad id");
    if (seen_free[id]) return absl::InternalError(absl::StrCat("block ", id, " free twice"));
    seen_free[id] = 1;
    if (!blocks_[id].in_free_list || *blocks_[id].free_it != id) {
      return absl::InternalError(absl::StrCat("block ", id, " free-list iterator inconsistent"));
    }
    ++free_count;
  }
  if (free_count != free_list_.size()) return absl::InternalError("free list size mismatch");
  bool seen_cached_free = false;
  for (BlockId id : free_list_) {
    if (blocks_[id].cached) {
      seen_cached_free = true;
    } else if (seen_cached_free) {
      return absl::InternalError(absl::StrCat("uncached free block ", id,
                                              " behind a cached one in the free list"));
    }
  }
  size_t num_cached = 0;
  for (BlockId id = 0; id < num_blocks_; ++id) {
    const Block& b = blocks_[id];
    if (b.ref_count != refs[id]) {
      return absl::InternalError(absl::StrCat("block ", id, " ref_count ", b.ref_count, " but ",
                                              refs[id], " table entries"));
    }
    if ((b.ref_count == 0) != static_cast<bool>(seen_free[id]) ||
        b.in_free_list != static_cast<bool>(seen_free[id])) {
      return absl::InternalError(absl::StrCat("block ", id, " ref_count ", b.ref_count,
                                              " but free-list membership ", int{seen_free[id]}));
    }
    if (b.cached) {
      ++num_cached;
      auto it = hash_to_block_.find(b.hash);
      if (it == hash_to_block_.end() || it->second != id) {
        return absl::InternalError(absl::StrCat("cached block ", id, " missing from hash map"));
      }
      if (static_cast<int>(b.token_ids.size()) != block_size_ ||
          HashBlock(b.parent_hash, b.token_ids) != b.hash) {
        return absl::InternalError(absl::StrCat("cached block ", id, " hash does not recompute"));
      }
    } else if (!b.token_ids.empty() || b.next_token != -1) {
      return absl::InternalError(absl::StrCat("uncached block ", id, " keeps tokens"));
    }
  }
  if (num_cached != hash_to_block_.size()) {
    return absl::InternalError("hash map has entries for uncached blocks");
  }
  if (!enable_prefix_caching_ && num_cached != 0) {
    return absl::InternalError("prefix caching disabled but blocks are cached");
  }
  return absl::OkStatus();
}

}  // namespace glm::engine
