// Picks the replica (one TP×PP engine group) for a request: cache-aware with a load bound, as the
// SGLang Model Gateway's `cache_aware` policy (../shared/specs/serving.md §5).
//
// Policy, over the ready replicas only:
//   1. Imbalanced (max - min outstanding tokens > balance_abs_threshold AND
//      max > balance_rel_threshold * min): the least-loaded replica.
//   2. Else the replica with the longest remembered prefix of the prompt, when
//      match_tokens / prompt_tokens > match_ratio_threshold.
//   3. Else the least-loaded replica.
// Least-loaded: fewest outstanding tokens, then fewest running requests, then lowest replica id.
//
// Prefix memory: the prompt is cut into blocks of `block_size` tokens (a trailing partial block
// is ignored); block i is keyed by a hash chained over blocks 0..i, so a key names a whole prefix.
// Each replica keeps an LRU set of keys holding at most max_tree_tokens / block_size entries.
// Record() touches a prompt's keys longest-prefix first, so a prefix outlives its extensions, as
// leaves go first in a radix tree. Pick and Record are O(prompt_len) (+ O(blocks) per replica).
// This is an approximation of each replica's KV prefix cache, never queried from the engine.
//
// Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"

namespace glm::gateway {

struct ReplicaLoad {
  int replica = 0;                 // replica id (any int; need not be dense)
  bool ready = false;              // serving; non-ready replicas are never picked
  int64_t outstanding_tokens = 0;  // prompt + max new tokens of the requests in flight
  int running_requests = 0;
};

struct RouterOptions {
  int64_t max_tree_tokens = int64_t{1} << 20;  // per replica; LRU-evicted beyond
  int block_size = 16;                         // tokens per prefix block; > 0
  double match_ratio_threshold = 0.3;
  int64_t balance_abs_threshold = 4096;        // outstanding tokens
  double balance_rel_threshold = 1.5;
};

class Router {
 public:
  explicit Router(RouterOptions opts = {});

  // Picks a ready replica for `prompt_tokens` (the rendered, tokenized prompt). Returns its id
  // (ReplicaLoad::replica), or -1 when none is ready. Does not change the prefix memory.
  int Pick(absl::Span<const int32_t> prompt_tokens, absl::Span<const ReplicaLoad> loads);

  // After routing: `replica` now holds this prompt's prefix in its KV cache.
  void Record(int replica, absl::Span<const int32_t> prompt_tokens);

  // The replica restarted (or is gone): its cache is empty.
  void Forget(int replica);

  // Introspection (tests, metrics): tokens of `prompt_tokens` whose prefix `replica` is
  // remembered to hold (a multiple of block_size), and the tokens remembered for `replica`.
  int64_t MatchTokens(int replica, absl::Span<const int32_t> prompt_tokens) const;
  int64_t CachedTokens(int replica) const;

  const RouterOptions& options() const { return opts_; }

 private:
  struct ReplicaCache {
    std::list<uint64_t> lru;  // front = most recently used
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index;
  };

  std::vector<uint64_t> BlockKeys(absl::Span<const int32_t> prompt_tokens) const;
  int64_t MatchBlocksLocked(int replica, const std::vector<uint64_t>& keys) const;

  const RouterOptions opts_;
  const size_t max_blocks_;
  mutable std::mutex mu_;
  std::unordered_map<int, ReplicaCache> caches_;  // guarded by mu_
};

}  // namespace glm::gateway
