#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace glm::tokenizer {
namespace {

using nlohmann::json;

// The GPT-2 pattern the ByteLevel pre-tokenizer splits with when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::Status JsonError(std::string_view where, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json ", ToAbsl(where), ": ", ToAbsl(what)));
}

absl::StatusOr<bool> BoolField(const json& obj, const char* key, bool fallback,
                               std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return JsonError(absl::StrCat(ToAbsl(where), "/", key), "expected true or false");
  return it->get<bool>();
}

std::string TypeOf(const json& obj) {
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

// Unicode word character as Rust regex's \w sees it (Alphabetic, M, Nd, Pc, Join_Control).
bool IsWordChar(uint32_t cp) {
  static const std::unique_ptr<Regex> kWord = [] {
    auto re = Regex::Compile(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", false);
    return re.ok() ? std::move(re).value() : nullptr;
  }();
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (kWord == nullptr) return false;
  std::string ch;
  AppendCodePoint(cp, &ch);
  std::vector<std::pair<size_t, size_t>> m;
  kWord->FindAll(ch, &m);
  return !m.empty();
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path,
                                            ": check the path (the model directory's "
                                            "tokenizer.json)"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto tok = FromJson(buffer.str());
  if (!tok.ok()) return Annotate(tok.status(), path);
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  GLM_RETURN_IF_ERROR(tok->Parse(json_text));
  return tok;
}

absl::Status Tokenizer::Parse(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return JsonError("/", "expected a JSON object");
  if (auto it = root.find("version"); it != root.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "1.0") {
      return JsonError("/version", absl::StrCat("unknown tokenizer.json version ", it->dump(),
                                                "; only \"1.0\" is supported"));
    }
  }

  // --- model ---
  auto model_it = root.find("model");
  if (model_it == root.end()) return JsonError("/model", "missing");
  GLM_ASSIGN_OR_RETURN(model_, BpeModel::FromJson(*model_it));

  // --- normalizer ---
  auto parse_norm = [&](auto&& self, const json& n, const std::string& where) -> absl::Status {
    if (n.is_null()) return absl::OkStatus();
    const std::string type = TypeOf(n);
    if (type == "Sequence") {
      auto list = n.find("normalizers");
      if (list == n.end() || !list->is_array()) {
        return JsonError(where + "/normalizers", "expected an array");
      }
      for (size_t i = 0; i < list->size(); ++i) {
        GLM_RETURN_IF_ERROR(self(self, (*list)[i], absl::StrCat(where, "/normalizers/", i)));
      }
      return absl::OkStatus();
    }
    if (type == "NFC") {
      nfc_ = true;  // NFC is idempotent, so repeating it changes nothing
      return absl::OkStatus();
    }
    return JsonError(where, absl::StrCat("normalizer ", n.dump().substr(0, 200),
                                         " is not supported (only null and NFC); tokenizing "
                                         "without it would give ids different from the "
                                         "reference"));
  };
  if (auto it = root.find("normalizer"); it != root.end()) {
    GLM_RETURN_IF_ERROR(parse_norm(parse_norm, *it, "/normalizer"));
  }

  // --- pre_tokenizer ---
  std::shared_ptr<const Regex> gpt2;
  auto parse_pre = [&](auto&& self, const json& pt, const std::string& where) -> absl::Status {
    if (pt.is_null()) return absl::OkStatus();
    if (!pt.is_object()) return JsonError(where, "expected an object or null");
    const std::string type = TypeOf(pt);
    if (type == "Sequence") {
      auto list = pt.find("pretokenizers");
      if (list == pt.end() || !list->is_array()) {
        return JsonError(where + "/pretokenizers", "expected an array");
      }
      for (size_t i = 0; i < list->size(); ++i) {
        GLM_RETURN_IF_ERROR(self(self, (*list)[i], absl::StrCat(where, "/pretokenizers/", i)));
      }
      return absl::OkStatus();
    }
    if (type == "Split") {
      PreTokenizerStep step{PreTokenizerStep::Kind::kSplit};
      auto pattern = pt.find("pattern");
      if (pattern == pt.end() || !pattern->is_object() || pattern->size() != 1 ||
          !(pattern->contains("Regex") || pattern->contains("String")) ||
          !pattern->begin()->is_string()) {
        return JsonError(where + "/pattern", "expected {\"Regex\": \"...\"} or "
                                             "{\"String\": \"...\"}");
      }
      const bool literal = pattern->contains("String");
      auto re = Regex::Compile(pattern->begin()->get<std::string>(), literal);
      if (!re.ok()) return Annotate(re.status(), absl::StrCat("tokenizer.json ", where));
      step.regex = std::shared_ptr<const Regex>(std::move(re).value());
      auto behavior = pt.find("behavior");
      if (behavior == pt.end() || !behavior->is_string()) {
        return JsonError(where + "/behavior", "missing");
      }
      const std::string b = behavior->get<std::string>();
      if (b == "Removed") {
        step.behavior = SplitBehavior::kRemoved;
      } else if (b == "Isolated") {
        step.behavior = SplitBehavior::kIsolated;
      } else if (b == "MergedWithPrevious") {
        step.behavior = SplitBehavior::kMergedWithPrevious;
      } else if (b == "MergedWithNext") {
        step.behavior = SplitBehavior::kMergedWithNext;
      } else if (b == "Contiguous") {
        step.behavior = SplitBehavior::kContiguous;
      } else {
        return JsonError(where + "/behavior",
                         absl::StrCat("unknown behavior \"", b,
                                      "\"; expected Removed, Isolated, MergedWithPrevious, "
                                      "MergedWithNext or Contiguous"));
      }
      GLM_ASSIGN_OR_RETURN(step.invert, BoolField(pt, "invert", false, where));
      pre_tokenizers_.push_back(std::move(step));
      return absl::OkStatus();
    }
    if (type == "ByteLevel") {
      PreTokenizerStep step{PreTokenizerStep::Kind::kByteLevel};
      GLM_ASSIGN_OR_RETURN(step.add_prefix_space, BoolField(pt, "add_prefix_space", true, where));
      GLM_ASSIGN_OR_RETURN(step.use_regex, BoolField(pt, "use_regex", true, where));
      if (step.use_regex) {
        if (gpt2 == nullptr) {
          auto re = Regex::Compile(kGpt2Pattern, false);
          if (!re.ok()) return re.status();
          gpt2 = std::shared_ptr<const Regex>(std::move(re).value());
        }
        step.regex = gpt2;
      }
      pre_tokenizers_.push_back(std::move(step));
      return absl::OkStatus();
    }
    return JsonError(where, absl::StrCat("pre_tokenizer type \"", type,
                                         "\" is not supported; supported: Sequence, Split, "
                                         "ByteLevel (byte-level BPE tokenizers such as GLM's)"));
  };
  if (auto it = root.find("pre_tokenizer"); it != root.end()) {
    GLM_RETURN_IF_ERROR(parse_pre(parse_pre, *it, "/pre_tokenizer"));
  }

  // --- decoder ---
  if (auto it = root.find("decoder"); it != root.end() && !it->is_null()) {
    const json* dec = &*it;
    std::string where = "/decoder";
    if (TypeOf(*dec) == "Sequence") {
      auto list = dec->find("decoders");
      if (list == dec->end() || !list->is_array() || list->size() != 1) {
        return JsonError("/decoder", "a Sequence decoder must hold exactly one ByteLevel decoder");
      }
      dec = &(*list)[0];
      where = "/decoder/decoders/0";
    }
    if (TypeOf(*dec) != "ByteLevel") {
      return JsonError(where, absl::StrCat("decoder type \"", TypeOf(*dec),
                                           "\" is not supported; only ByteLevel (or null)"));
    }
    byte_level_decoder_ = true;
  }

  // --- added tokens (ids assigned as tokenizers' AddedVocabulary::add_tokens does) ---
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) return JsonError("/added_tokens", "expected an array");
    int64_t next_id = static_cast<int64_t>(model_->vocab_size());
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string where = absl::StrCat("/added_tokens/", i);
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string()) {
        return JsonError(where, "expected an object with a string \"content\"");
      }
      AddedToken token;
      token.content = t["content"].get<std::string>();
      GLM_ASSIGN_OR_RETURN(token.special, BoolField(t, "special", false, where));
      GLM_ASSIGN_OR_RETURN(token.single_word, BoolField(t, "single_word", false, where));
      GLM_ASSIGN_OR_RETURN(token.lstrip, BoolField(t, "lstrip", false, where));
      GLM_ASSIGN_OR_RETURN(token.rstrip, BoolField(t, "rstrip", false, where));
      GLM_ASSIGN_OR_RETURN(token.normalized, BoolField(t, "normalized", !token.special, where));
      if (token.content.empty()) continue;
      token.pattern = token.normalized && nfc_ ? NormalizeNfc(token.content) : token.content;
      int64_t id;
      if (auto a = added_ids_.find(token.content); a != added_ids_.end()) {
        id = a->second;
      } else if (auto m = model_->TokenToId(token.content)) {
        id = *m;
      } else {
        id = next_id++;
      }
      if (id > INT32_MAX) return JsonError(where, "too many tokens for 32-bit ids");
      token.id = static_cast<int32_t>(id);
      if (t.contains("id") && t["id"].is_number_integer() && t["id"].get<int64_t>() != id) {
        GLM_LOG_WARN("tokenizer.json added token {} declares id {} but gets id {} (as in the "
                     "reference tokenizers library)",
                     json(token.content).dump(), t["id"].get<int64_t>(), id);
      }
      added_ids_[token.content] = token.id;
      if (token.special) special_contents_.insert(token.content);
      if (auto b = added_by_id_.find(token.id); b != added_by_id_.end()) {
        added_[b->second] = token;
      } else {
        added_by_id_[token.id] = static_cast<int32_t>(added_.size());
        added_.push_back(token);
      }
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    AddedMatcher& matcher = pass == 0 ? raw_matcher_ : normalized_matcher_;
    for (size_t i = 0; i < added_.size(); ++i) {
      if (added_[i].normalized != (pass == 1)) continue;
      if (added_[i].pattern.empty()) continue;
      matcher.by_first_byte[static_cast<uint8_t>(added_[i].pattern[0])].push_back(
          static_cast<int32_t>(i));
      matcher.empty = false;
    }
    for (auto& bucket : matcher.by_first_byte) {
      std::stable_sort(bucket.begin(), bucket.end(), [this](int32_t a, int32_t b) {
        return added_[a].pattern.size() > added_[b].pattern.size();
      });
    }
  }

  // --- post_processor ---
  auto special_ids = [&](const json& obj, const std::string& where,
                         const char* key) -> absl::StatusOr<std::vector<int32_t>> {
    // BertProcessing / RobertaProcessing: "sep": ["</s>", 2]
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
      return JsonError(absl::StrCat(where, "/", key), "expected [\"token\", id]");
    }
    return std::vector<int32_t>{static_cast<int32_t>((*it)[1].get<int64_t>())};
  };
  auto parse_post = [&](auto&& self, const json& pp, const std::string& where) -> absl::Status {
    if (pp.is_null()) return absl::OkStatus();
    const std::string type = TypeOf(pp);
    if (type == "Sequence") {
      auto list = pp.find("processors");
      if (list == pp.end() || !list->is_array()) {
        return JsonError(where + "/processors", "expected an array");
      }
      for (size_t i = 0; i < list->size(); ++i) {
        GLM_RETURN_IF_ERROR(self(self, (*list)[i], absl::StrCat(where, "/processors/", i)));
      }
      return absl::OkStatus();
    }
    if (type == "ByteLevel") return absl::OkStatus();  // offsets only; ids unchanged
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      GLM_ASSIGN_OR_RETURN(auto cls, special_ids(pp, where, "cls"));
      GLM_ASSIGN_OR_RETURN(auto sep, special_ids(pp, where, "sep"));
      post_steps_.push_back({TemplateItem{false, cls}, TemplateItem{true, {}},
                             TemplateItem{false, sep}});
      return absl::OkStatus();
    }
    if (type == "TemplateProcessing") {
      auto single = pp.find("single");
      if (single == pp.end() || !single->is_array()) {
        return JsonError(where + "/single", "expected an array of template pieces");
      }
      auto tokens = pp.find("special_tokens");
      std::vector<TemplateItem> items;
      for (size_t i = 0; i < single->size(); ++i) {
        const json& piece = (*single)[i];
        const std::string pw = absl::StrCat(where, "/single/", i);
        if (piece.is_object() && piece.contains("Sequence")) {
          const json& seq = piece["Sequence"];
          if (!seq.is_object() || !seq.contains("id") || seq["id"] != "A") {
            return JsonError(pw, "a single-sequence template may only use Sequence \"A\"");
          }
          items.push_back(TemplateItem{true, {}});
        } else if (piece.is_object() && piece.contains("SpecialToken")) {
          const json& st = piece["SpecialToken"];
          if (!st.is_object() || !st.contains("id") || !st["id"].is_string()) {
            return JsonError(pw, "SpecialToken needs a string \"id\"");
          }
          const std::string name = st["id"].get<std::string>();
          if (tokens == pp.end() || !tokens->is_object() || !tokens->contains(name)) {
            return JsonError(where + "/special_tokens",
                             absl::StrCat("template uses special token \"", name,
                                          "\" that special_tokens does not define"));
          }
          const json& def = (*tokens)[name];
          if (!def.is_object() || !def.contains("ids") || !def["ids"].is_array()) {
            return JsonError(absl::StrCat(where, "/special_tokens/", name), "expected \"ids\"");
          }
          TemplateItem item;
          for (const json& id : def["ids"]) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
              return JsonError(absl::StrCat(where, "/special_tokens/", name, "/ids"),
                               "ids must be integers in [0, 2^31)");
            }
            item.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
          }
          items.push_back(std::move(item));
        } else {
          return JsonError(pw, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        }
      }
      post_steps_.push_back(std::move(items));
      return absl::OkStatus();
    }
    return JsonError(where, absl::StrCat("post_processor type \"", type,
                                         "\" is not supported; supported: ByteLevel, "
                                         "TemplateProcessing, BertProcessing, RobertaProcessing, "
                                         "Sequence"));
  };
  if (auto it = root.find("post_processor"); it != root.end()) {
    GLM_RETURN_IF_ERROR(parse_post(parse_post, *it, "/post_processor"));
  }

  // --- decode table: id -> bytes (added tokens take precedence over the model vocab) ---
  entries_.reserve(model_->vocab_size() + added_.size());
  auto add_entry = [this](int32_t id, const std::string& token) {
    TokenEntry entry;
    entry.bytes = byte_level_decoder_ ? ByteLevelDecodeToken(token) : token;
    entry.special = special_contents_.contains(token);
    entries_[id] = std::move(entry);
    max_id_ = std::max(max_id_, id);
  };
  for (const auto& [token, id] : model_->vocab()) {
    if (!added_by_id_.contains(id) && *model_->IdToToken(id) == token) add_entry(id, token);
  }
  // Decoding uses the normalized form of normalized added tokens (simple_id_to_token).
  for (const AddedToken& t : added_) add_entry(t.id, t.pattern);
  return absl::OkStatus();
}

void Tokenizer::SplitAdded(std::string_view text, const AddedMatcher& matcher,
                           std::vector<Piece>* out) const {
  // tokenizers' AddedVocabulary::find_matches + split_with_indices; empty pieces dropped.
  auto emit_text = [out, text](size_t begin, size_t end) {
    if (end > begin) out->push_back(Piece{text.substr(begin, end - begin), -1});
  };
  if (matcher.empty) {
    emit_text(0, text.size());
    return;
  }
  size_t start_offset = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    // Leftmost-longest: the longest token starting at the first position where any matches.
    const AddedToken* found = nullptr;
    for (int32_t index : matcher.by_first_byte[static_cast<uint8_t>(text[i])]) {
      const AddedToken& t = added_[index];
      if (t.pattern.size() <= n - i && text.compare(i, t.pattern.size(), t.pattern) == 0) {
        found = &t;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    size_t start = i;
    size_t stop = i + found->pattern.size();
    i = stop;  // matches never overlap, whatever the strip flags do below
    if (found->single_word) {
      bool start_space = true;
      bool stop_space = true;
      if (start > 0) {
        size_t p;
        start_space = !IsWordChar(PrevCodePoint(text, start, &p));
      }
      if (stop < n) {
        size_t p = stop;
        stop_space = !IsWordChar(NextCodePoint(text, &p));
      }
      if (!start_space || !stop_space) continue;
    }
    if (found->lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t p;
        if (!IsWhiteSpace(PrevCodePoint(text, new_start, &p))) break;
        new_start = p;
      }
      start = std::max(new_start, start_offset);
    }
    if (found->rstrip) {
      while (stop < n) {
        size_t p = stop;
        if (!IsWhiteSpace(NextCodePoint(text, &p))) break;
        stop = p;
      }
    }
    if (start_offset < start) emit_text(start_offset, start);
    out->push_back(Piece{std::string_view(), found->id});
    start_offset = stop;
  }
  if (start_offset < n) emit_text(start_offset, n);
}

void Tokenizer::ComputeSplits(const Regex& regex, SplitBehavior behavior, bool invert,
                              std::string_view text, StepScratch* scratch) {
  // tokenizers' NormalizedString::split over Pattern::find_matches.
  std::vector<std::pair<size_t, size_t>>& found = scratch->matches;
  std::vector<Span>& matches = scratch->spans;
  std::vector<Span>& splits = scratch->splits;
  found.clear();
  matches.clear();
  splits.clear();
  regex.FindAll(text, &found);
  size_t prev = 0;
  for (const auto& [s, e] : found) {
    if (prev != s) matches.push_back({prev, s, false});
    matches.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size()) matches.push_back({prev, text.size(), false});
  if (invert) {
    for (Span& m : matches) m.flag = !m.flag;
  }
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& m : matches) splits.push_back({m.begin, m.end, false});
      break;
    case SplitBehavior::kRemoved:
      splits = matches;
      break;
    case SplitBehavior::kContiguous: {
      bool previous = false;
      for (const Span& m : matches) {
        if (m.flag == previous && !splits.empty()) {
          splits.back().end = m.end;
        } else {
          splits.push_back({m.begin, m.end, false});
        }
        previous = m.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Span& m : matches) {
        if (m.flag && !previous && !splits.empty()) {
          splits.back().end = m.end;
        } else {
          splits.push_back({m.begin, m.end, false});
        }
        previous = m.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->flag && !previous && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous = it->flag;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
}

void Tokenizer::PreTokenize(size_t step, std::string_view piece,
                            std::vector<StepScratch>* scratch,
                            absl::FunctionRef<void(std::string_view)> emit) const {
  if (piece.empty()) return;  // the reference drops empty splits after every step
  if (step == pre_tokenizers_.size()) {
    emit(piece);
    return;
  }
  const PreTokenizerStep& st = pre_tokenizers_[step];
  StepScratch& level = (*scratch)[step];
  if (st.kind == PreTokenizerStep::Kind::kSplit) {
    ComputeSplits(*st.regex, st.behavior, st.invert, piece, &level);
    // Recursion uses the next level's buffers, so iterating this level's splits is safe.
    for (const Span& sp : level.splits) {
      if (!sp.flag) PreTokenize(step + 1, piece.substr(sp.begin, sp.end - sp.begin), scratch, emit);
    }
    return;
  }
  // ByteLevel: optional prefix space, optional GPT-2 split, then bytes -> visible characters.
  std::string_view text = piece;
  if (st.add_prefix_space && piece[0] != ' ') {
    level.prefixed.assign(1, ' ');
    level.prefixed.append(piece);
    text = level.prefixed;
  }
  auto map_and_continue = [&](std::string_view sub) {
    ByteLevelEncodeInto(sub, &level.mapped);
    PreTokenize(step + 1, level.mapped, scratch, emit);
  };
  if (!st.use_regex) {
    map_and_continue(text);
    return;
  }
  ComputeSplits(*st.regex, SplitBehavior::kIsolated, false, text, &level);
  for (const Span& sp : level.splits) {
    if (sp.end > sp.begin) map_and_continue(text.substr(sp.begin, sp.end - sp.begin));
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = Utf8Lossy(text);
    text = repaired;
  }
  std::vector<Piece> pieces;
  SplitAdded(text, raw_matcher_, &pieces);
  std::deque<std::string> normalized;  // owns normalized pieces (stable addresses)
  if (!normalized_matcher_.empty || nfc_) {
    std::vector<Piece> second;
    second.reserve(pieces.size());
    for (const Piece& p : pieces) {
      if (p.id >= 0) {
        second.push_back(p);
        continue;
      }
      std::string_view piece = p.text;
      if (nfc_ && !IsTriviallyNfc(piece)) {
        normalized.push_back(NormalizeNfc(piece));
        piece = normalized.back();
      }
      SplitAdded(piece, normalized_matcher_, &second);
    }
    pieces = std::move(second);
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<StepScratch> scratch(pre_tokenizers_.size());
  auto tokenize_word = [this, &ids](std::string_view word) { model_->Tokenize(word, &ids); };
  for (const Piece& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      PreTokenize(0, p.text, &scratch, tokenize_word);
    }
  }
  for (const auto& step : post_steps_) {
    std::vector<int32_t> next;
    next.reserve(ids.size() + 4);
    for (const TemplateItem& item : step) {
      if (item.is_sequence) {
        next.insert(next.end(), ids.begin(), ids.end());
      } else if (add_special_tokens) {
        next.insert(next.end(), item.ids.begin(), item.ids.end());
      }
    }
    ids = std::move(next);
  }
  return ids;
}

bool Tokenizer::AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  if (skip_special_tokens && it->second.special) return false;
  out->append(it->second.bytes);
  return true;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (byte_level_decoder_) {
      AppendTokenBytes(id, skip_special_tokens, &bytes);
      continue;
    }
    const size_t before = bytes.size();
    if (!first) bytes.push_back(' ');
    if (AppendTokenBytes(id, skip_special_tokens, &bytes)) {
      first = false;
    } else {
      bytes.resize(before);
    }
  }
  return byte_level_decoder_ ? Utf8Lossy(bytes) : bytes;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_ids_.find(ToAbsl(token)); it != added_ids_.end()) return it->second;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    return added_[it->second].pattern;  // normalized form, as simple_id_to_token
  }
  if (const std::string* t = model_->IdToToken(id)) return *t;
  return std::nullopt;
}

size_t Tokenizer::VocabSize(bool with_added_tokens) const {
  if (!with_added_tokens) return model_->vocab_size();
  size_t extra = 0;
  for (const AddedToken& t : added_) {
    if (!model_->TokenToId(t.content)) ++extra;
  }
  return model_->vocab_size() + extra;
}

bool Tokenizer::IsSpecialId(int32_t id) const {
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.special;
}

std::vector<int32_t> Tokenizer::SpecialIds() const {
  std::vector<int32_t> ids;
  for (const AddedToken& t : added_) {
    if (t.special) ids.push_back(t.id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::Step(int32_t id) {
  if (!tokenizer_.byte_level_decoder()) {
    std::string text;
    if (emitted_any_) text.push_back(' ');
    if (!tokenizer_.AppendTokenBytes(id, skip_special_tokens_, &text)) return std::string();
    emitted_any_ = true;
    return text;
  }
  if (!tokenizer_.AppendTokenBytes(id, skip_special_tokens_, &pending_)) return std::string();
  const size_t complete = IncompleteTailStart(pending_);
  std::string text;
  AppendUtf8Lossy(std::string_view(pending_).substr(0, complete), &text);
  pending_.erase(0, complete);
  return text;
}

std::string StreamDecoder::Flush() {
  std::string text = Utf8Lossy(pending_);
  pending_.clear();
  emitted_any_ = false;
  return text;
}

}  // namespace glm::tokenizer
