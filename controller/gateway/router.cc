#include "controller/gateway/router.h"

#include <algorithm>
#include <tuple>

namespace glm::gateway {
namespace {

// MurmurHash3's 64-bit finalizer: a bijection with full avalanche.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

bool LessLoaded(const ReplicaLoad& a, const ReplicaLoad& b) {
  return std::tie(a.outstanding_tokens, a.running_requests, a.replica) <
         std::tie(b.outstanding_tokens, b.running_requests, b.replica);
}

}  // namespace

Router::Router(RouterOptions opts)
    : opts_(opts),
      max_blocks_(opts.block_size > 0 && opts.max_tree_tokens > 0
                      ? static_cast<size_t>(opts.max_tree_tokens / opts.block_size)
                      : 0) {}

std::vector<uint64_t> Router::BlockKeys(absl::Span<const int32_t> prompt_tokens) const {
  std::vector<uint64_t> keys;
  if (opts_.block_size <= 0) return keys;
  const size_t block = static_cast<size_t>(opts_.block_size);
  keys.reserve(prompt_tokens.size() / block);
  // A running hash over the whole prefix, sampled at each block end: key i names tokens
  // [0, (i + 1) * block_size).
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    h = Mix64(h + static_cast<uint32_t>(prompt_tokens[i]) + 0x632be59bd9b4e019ULL);
    if ((i + 1) % block == 0) keys.push_back(h);
  }
  return keys;
}

int64_t Router::MatchBlocksLocked(int replica, const std::vector<uint64_t>& keys) const {
  auto it = caches_.find(replica);
  if (it == caches_.end()) return 0;
  int64_t matched = 0;
  for (uint64_t key : keys) {
    if (!it->second.index.contains(key)) break;
    ++matched;
  }
  return matched;
}

int Router::Pick(absl::Span<const int32_t> prompt_tokens, absl::Span<const ReplicaLoad> loads) {
  const ReplicaLoad* least = nullptr;
  const ReplicaLoad* most = nullptr;
  for (const ReplicaLoad& load : loads) {
    if (!load.ready) continue;
    if (least == nullptr || LessLoaded(load, *least)) least = &load;
    if (most == nullptr || load.outstanding_tokens > most->outstanding_tokens) most = &load;
  }
  if (least == nullptr) return -1;

  const int64_t min_load = least->outstanding_tokens;
  const int64_t max_load = most->outstanding_tokens;
  const bool imbalanced = max_load - min_load > opts_.balance_abs_threshold &&
                          static_cast<double>(max_load) >
                              opts_.balance_rel_threshold * static_cast<double>(min_load);
  if (imbalanced || prompt_tokens.empty()) return least->replica;

  const std::vector<uint64_t> keys = BlockKeys(prompt_tokens);
  const ReplicaLoad* best = nullptr;
  int64_t best_blocks = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const ReplicaLoad& load : loads) {
      if (!load.ready) continue;
      const int64_t blocks = MatchBlocksLocked(load.replica, keys);
      if (blocks > best_blocks || (blocks == best_blocks && best != nullptr && blocks > 0 &&
                                   LessLoaded(load, *best))) {
        best = &load;
        best_blocks = blocks;
      }
    }
  }
  const double ratio = static_cast<double>(best_blocks * opts_.block_size) /
                       static_cast<double>(prompt_tokens.size());
  if (best != nullptr && ratio > opts_.match_ratio_threshold) return best->replica;
  return least->replica;
}

void Router::Record(int replica, absl::Span<const int32_t> prompt_tokens) {
  const std::vector<uint64_t> keys = BlockKeys(prompt_tokens);
  if (keys.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  ReplicaCache& cache = caches_[replica];
  // Longest prefix first, so block 0 ends most recently used and is evicted last.
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
    auto it = cache.index.find(*key);
    if (it != cache.index.end()) {
      cache.lru.splice(cache.lru.begin(), cache.lru, it->second);
    } else {
      cache.lru.push_front(*key);
      cache.index.emplace(*key, cache.lru.begin());
    }
  }
  while (cache.index.size() > max_blocks_) {
    cache.index.erase(cache.lru.back());
    cache.lru.pop_back();
  }
}

void Router::Forget(int replica) {
  std::lock_guard<std::mutex> lock(mu_);
  caches_.erase(replica);
}

int64_t Router::MatchTokens(int replica, absl::Span<const int32_t> prompt_tokens) const {
  const std::vector<uint64_t> keys = BlockKeys(prompt_tokens);
  std::lock_guard<std::mutex> lock(mu_);
  return MatchBlocksLocked(replica, keys) * opts_.block_size;
}

int64_t Router::CachedTokens(int replica) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = caches_.find(replica);
  if (it == caches_.end()) return 0;
  return static_cast<int64_t>(it->second.index.size()) * opts_.block_size;
}

}  // namespace glm::gateway
