#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace glm::tokenizer {
namespace {

using nlohmann::json;

absl::Status ModelError(std::string_view where, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json /model", glm::ToAbsl(where), ": ", glm::ToAbsl(what)));
}

// Reads an optional string field: absent or null -> nullopt.
absl::StatusOr<std::optional<std::string>> OptionalString(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) {
    return ModelError(absl::StrCat("/", key), "expected a string or null");
  }
  return std::optional<std::string>(it->get<std::string>());
}

absl::StatusOr<bool> OptionalBool(const json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return ModelError(absl::StrCat("/", key), "expected true, false or null");
  return it->get<bool>();
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct MergeEntry {
  uint32_t rank;
  uint32_t pos;
  int32_t new_id;
  // std::priority_queue is a max-heap: "less" means lower priority = larger (rank, pos).
  bool operator<(const MergeEntry& o) const {
    if (rank != o.rank) return rank > o.rank;
    return pos > o.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& model) {
  if (!model.is_object()) return ModelError("", "expected an object");
  std::unique_ptr<BpeModel> bpe(new BpeModel());
  if (auto it = model.find("type"); it != model.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "BPE") {
      return ModelError("/type", absl::StrCat("model type ", it->dump(),
                                              " is not supported; only byte-level \"BPE\" is"));
    }
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number()) return ModelError("/dropout", "expected a number or null");
    if (it->get<double>() != 0.0) {
      return ModelError("/dropout", "BPE dropout is random (training only); set it to null");
    }
  }
  auto unk = OptionalString(model, "unk_token");
  if (!unk.ok()) return unk.status();
  bpe->unk_token_ = *unk;
  auto prefix = OptionalString(model, "continuing_subword_prefix");
  if (!prefix.ok()) return prefix.status();
  bpe->continuing_subword_prefix_ = *prefix;
  auto suffix = OptionalString(model, "end_of_word_suffix");
  if (!suffix.ok()) return suffix.status();
  bpe->end_of_word_suffix_ = *suffix;
  auto fuse = OptionalBool(model, "fuse_unk", false);
  if (!fuse.ok()) return fuse.status();
  bpe->fuse_unk_ = *fuse;
  auto fallback = OptionalBool(model, "byte_fallback", false);
  if (!fallback.ok()) return fallback.status();
  bpe->byte_fallback_ = *fallback;
  auto ignore = OptionalBool(model, "ignore_merges", false);
  if (!ignore.ok()) return ignore.status();
  bpe->ignore_merges_ = *ignore;

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    return ModelError("/vocab", "missing or not an object of token -> id");
  }
  bpe->vocab_.reserve(vocab_it->size());
  bpe->vocab_r_.reserve(vocab_it->size());
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return ModelError("/vocab", absl::StrCat("token ", json(it.key()).dump(), " has id ",
                                               it.value().dump(),
                                               "; ids must be integers in [0, 2^31)"));
    }
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    bpe->vocab_[it.key()] = id;
    bpe->vocab_r_[id] = it.key();
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) {
    return ModelError("/merges", "missing or not an array");
  }
  const size_t prefix_len =
      bpe->continuing_subword_prefix_ ? bpe->continuing_subword_prefix_->size() : 0;
  bpe->merges_.reserve(merges_it->size());
  uint32_t rank = 0;
  size_t index = 0;
  for (const json& m : *merges_it) {
    std::string a;
    std::string b;
    if (m.is_string()) {
      // Legacy "a b" form: exactly one space (tokens never contain spaces in this form).
      const std::string& line = m.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) {
        ++index;
        continue;
      }
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return ModelError(absl::StrCat("/merges/", index),
                          absl::StrCat("merge ", m.dump(),
                                       " must be two tokens separated by one space"));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return ModelError(absl::StrCat("/merges/", index),
                        "each merge must be \"a b\" or [\"a\", \"b\"]");
    }
    auto a_it = bpe->vocab_.find(a);
    auto b_it = bpe->vocab_.find(b);
    if (a_it == bpe->vocab_.end() || b_it == bpe->vocab_.end()) {
      return ModelError(absl::StrCat("/merges/", index),
                        absl::StrCat("merge ", m.dump(), " uses token ",
                                     json(a_it == bpe->vocab_.end() ? a : b).dump(),
                                     " that is not in the vocab"));
    }
    if (b.size() < prefix_len) {
      return ModelError(absl::StrCat("/merges/", index),
                        "right token is shorter than continuing_subword_prefix");
    }
    std::string merged = a + b.substr(prefix_len);
    auto m_it = bpe->vocab_.find(merged);
    if (m_it == bpe->vocab_.end()) {
      return ModelError(absl::StrCat("/merges/", index),
                        absl::StrCat("merge ", m.dump(), " produces ", json(merged).dump(),
                                     " which is not in the vocab"));
    }
    // Later duplicates overwrite earlier ones, as in the reference's HashMap collect.
    bpe->merges_[PairKey(a_it->second, b_it->second)] = {rank, m_it->second};
    ++rank;
    ++index;
  }
  if (bpe->unk_token_ && !bpe->vocab_.contains(*bpe->unk_token_)) {
    return ModelError("/unk_token", absl::StrCat("unk_token ", json(*bpe->unk_token_).dump(),
                                                  " is not in the vocab"));
  }

  bpe->use_small_char_ids_ = !bpe->continuing_subword_prefix_ && !bpe->end_of_word_suffix_;
  bpe->small_char_ids_.fill(-1);
  for (uint32_t cp = 0; cp < bpe->small_char_ids_.size(); ++cp) {
    std::string ch;
    AppendCodePoint(cp, &ch);
    if (auto it = bpe->vocab_.find(ch); it != bpe->vocab_.end()) {
      bpe->small_char_ids_[cp] = it->second;
    }
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(glm::ToAbsl(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

std::optional<int32_t> BpeModel::SymbolId(std::string_view ch, bool is_first,
                                          bool is_last) const {
  if (use_small_char_ids_) {
    size_t pos = 0;
    const uint32_t cp = NextCodePoint(ch, &pos);
    if (cp < small_char_ids_.size()) {
      const int32_t id = small_char_ids_[cp];
      if (id < 0) return std::nullopt;
      return id;
    }
    return TokenToId(ch);
  }
  std::string s;
  if (!is_first && continuing_subword_prefix_) s += *continuing_subword_prefix_;
  s.append(ch);
  if (is_last && end_of_word_suffix_) s += *end_of_word_suffix_;
  return TokenToId(s);
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  if (word.size() >= kMaxCachedWordBytes) {
    MergeWord(word, ids);
    return;
  }
  CacheShard& shard = cache_[absl::Hash<absl::string_view>{}(glm::ToAbsl(word)) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.words.find(glm::ToAbsl(word));
    if (it != shard.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = ids->size();
  MergeWord(word, ids);
  std::vector<int32_t> result(ids->begin() + static_cast<std::ptrdiff_t>(before), ids->end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() >= kCacheCapacityPerShard) shard.words.clear();
  shard.words.emplace(std::string(word), std::move(result));
}

void BpeModel::MergeWord(std::string_view w, std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&symbols](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back(Symbol{id, n - 1, -1, len});
  };
  const int32_t unk_id = unk_token_ ? vocab_.at(*unk_token_) : -1;
  bool have_unk = false;  // a pending unk symbol of unk_len bytes
  uint32_t unk_len = 0;
  size_t i = 0;
  while (i < w.size()) {
    size_t end = i;
    NextCodePoint(w, &end);
    const std::string_view ch = w.substr(i, end - i);
    const bool is_first = i == 0;
    const bool is_last = end == w.size();
    const auto byte_len = static_cast<uint32_t>(end - i);
    i = end;
    if (auto id = SymbolId(ch, is_first, is_last)) {
      if (have_unk) {
        add(unk_id, unk_len);
        have_unk = false;
      }
      add(*id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      // Every byte of the (prefixed/suffixed) string must have a <0xXX> token.
      std::string s;
      if (!is_first && continuing_subword_prefix_) s += *continuing_subword_prefix_;
      s.append(ch);
      if (is_last && end_of_word_suffix_) s += *end_of_word_suffix_;
      std::vector<int32_t> byte_ids;
      for (unsigned char b : s) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        auto id = TokenToId(name);
        if (!id) break;
        byte_ids.push_back(*id);
      }
      if (byte_ids.size() == s.size()) {
        for (int32_t id : byte_ids) add(id, 1);
        continue;
      }
    }
    if (unk_id >= 0) {
      if (have_unk && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (have_unk) add(unk_id, unk_len);
        have_unk = true;
        unk_len = byte_len;
      }
    }
  }
  if (have_unk) add(unk_id, unk_len);

  std::priority_queue<MergeEntry> queue;
  for (size_t p = 0; p + 1 < symbols.size(); ++p) {
    auto it = merges_.find(PairKey(symbols[p].id, symbols[p + 1].id));
    if (it != merges_.end()) {
      queue.push(MergeEntry{it->second.first, static_cast<uint32_t>(p), it->second.second});
    }
  }
  while (!queue.empty()) {
    const MergeEntry top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    auto it = merges_.find(PairKey(cur.id, right.id));
    if (it == merges_.end() || it->second.second != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size()) {
      symbols[right.next].prev = static_cast<int32_t>(top.pos);
    }
    if (cur.prev >= 0) {
      auto pit = merges_.find(PairKey(symbols[cur.prev].id, cur.id));
      if (pit != merges_.end()) {
        queue.push(MergeEntry{pit->second.first, static_cast<uint32_t>(cur.prev),
                              pit->second.second});
      }
    }
    if (cur.next >= 0 && static_cast<size_t>(cur.next) < symbols.size()) {
      auto nit = merges_.find(PairKey(cur.id, symbols[cur.next].id));
      if (nit != merges_.end()) {
        queue.push(MergeEntry{nit->second.first, top.pos, nit->second.second});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids->push_back(s.id);
  }
}

}  // namespace glm::tokenizer
