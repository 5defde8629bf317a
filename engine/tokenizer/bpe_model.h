// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): vocab, ranked merges and the
// options the Rust `tokenizers` library honours (unk_token, fuse_unk, byte_fallback,
// continuing_subword_prefix, end_of_word_suffix, ignore_merges). Merging follows
// tokenizers/src/models/bpe/word.rs exactly: a min-heap on (rank, position), stale entries
// skipped, so ids equal the reference for any merge list, even conflicting ones.
// Thread-safe: Tokenize is const; the word cache is sharded and locked.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace glm::tokenizer {

class BpeModel {
 public:
  // Parses the "model" object. Errors name the field and the offending entry.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word (already byte-level mapped when the tokenizer has a
  // ByteLevel pre-tokenizer). Characters with no vocab entry become unk_token / <0xXX> byte
  // fallback tokens when configured, and are dropped otherwise (as the reference does).
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  const std::string* IdToToken(int32_t id) const;
  size_t vocab_size() const { return vocab_.size(); }
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  BpeModel() = default;
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;
  // Id of the symbol for one character `ch` of a word, or nullopt when not in the vocab.
  std::optional<int32_t> SymbolId(std::string_view ch, bool is_first, bool is_last) const;

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<int32_t, std::string> vocab_r_;
  // (left id, right id) -> (rank, merged id)
  absl::flat_hash_map<uint64_t, std::pair<uint32_t, int32_t>> merges_;
  std::optional<std::string> unk_token_;
  std::optional<std::string> continuing_subword_prefix_;
  std::optional<std::string> end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // Fast path for single characters below U+0200 (covers the byte-level alphabet): id or -1.
  // Only used when there is no prefix/suffix to add.
  std::array<int32_t, 0x200> small_char_ids_{};
  bool use_small_char_ids_ = false;

  // Bounded word cache: words shorter than kMaxCachedWordBytes; a full shard is cleared.
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheCapacityPerShard = 4096;
  static constexpr size_t kMaxCachedWordBytes = 256;
  struct CacheShard {
    std::mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words;
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace glm::tokenizer
