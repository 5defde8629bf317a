// glm_tokenizer: Hugging Face tokenizer.json byte-level BPE (what GLM-4.x / GLM-5 ship), with the
// same ids as the Rust `tokenizers` library (Python `tokenizers` / transformers' fast tokenizer).
//
// Pipeline (tokenizers/src/tokenizer/mod.rs): added tokens are split out of the raw text first
// (leftmost-longest; lstrip/rstrip/single_word honoured; normalized=false tokens on the raw
// text, then normalized=true ones on the normalized pieces) -> normalizer -> pre-tokenizers
// (Sequence / Split / ByteLevel) -> BPE per piece -> post-processor. Decoding maps ids back to
// tokens, the ByteLevel decoder turns them into bytes, and bytes become text with U+FFFD for
// invalid UTF-8, as the reference does.
//
// Supported tokenizer.json components, anything else is rejected by FromJson with the field:
//   model:          BPE (vocab; merges as "a b" or ["a", "b"]; unk_token, fuse_unk,
//                   byte_fallback, continuing_subword_prefix, end_of_word_suffix, ignore_merges)
//   normalizer:     null, NFC, or a Sequence of those. Others (NFKC, Lowercase, ...) rejected.
//   pre_tokenizer:  null, Split (Regex/String pattern, all five behaviours, invert), ByteLevel
//                   (add_prefix_space, use_regex with the GPT-2 pattern), Sequence of these
//   post_processor: null, ByteLevel, TemplateProcessing (single template), BertProcessing,
//                   RobertaProcessing, Sequence of these
//   decoder:        null (tokens joined by " "), ByteLevel, Sequence holding one ByteLevel
//   truncation / padding: ignored (the caller enforces lengths).
//
// Input text: Encode takes bytes. Valid UTF-8 is tokenized exactly like Python's
// `Tokenizer.encode(str)`. Invalid UTF-8 (Python cannot pass it; a `str` holds code points)
// is first decoded lossily, each maximal ill-formed subpart becoming U+FFFD - the same as
// `tok.encode(data.decode("utf-8", "replace"))` in Python. Nothing crashes on any input.
//
// Thread-safety: a Tokenizer is immutable after FromJson; every method is const and may be
// called from many threads at once (the BPE word cache is internally locked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace glm::tokenizer {

class BpeModel;
class Regex;

class Tokenizer {
 public:
  // Reads and parses a tokenizer.json file. Errors name the file and the JSON field.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Parses tokenizer.json text.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. add_special_tokens applies the post-processor's template (e.g. a BOS);
  // false gives the bare ids, like `tokenizers` encode(text, add_special_tokens=False).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids`. Unknown ids are skipped (as the reference does). skip_special_tokens drops
  // tokens whose content is a special added token.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Added tokens first, then the model vocab (as the reference).
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;

  // Model vocab plus added tokens that are not in it (Python `get_vocab_size(True)`); with
  // false, the model vocab only.
  size_t VocabSize(bool with_added_tokens = true) const;
  // One past the largest id (the embedding rows a model needs at least).
  int32_t MaxIdPlusOne() const { return max_id_ + 1; }
  bool IsSpecialId(int32_t id) const;
  // Ids of every special added token, ascending.
  std::vector<int32_t> SpecialIds() const;

  // --- For StreamDecoder -----------------------------------------------------------------
  // True when the decoder is ByteLevel (tokens decode to raw bytes); false for no decoder
  // (token strings joined by spaces).
  bool byte_level_decoder() const { return byte_level_decoder_; }
  // Appends what `id` contributes to Decode's output before UTF-8 repair: raw bytes for the
  // ByteLevel decoder, the token string otherwise. Returns false when the id is unknown or
  // skipped (special with skip_special_tokens).
  bool AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const;

 private:
  struct AddedToken {
    std::string content;
    std::string pattern;  // what is matched: content, normalized when `normalized` (as HF)
    int32_t id = -1;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = true;
    bool special = false;
  };
  // Leftmost-longest matcher over added-token contents.
  struct AddedMatcher {
    // first byte -> indices into tokens_, longest content first
    std::vector<std::vector<int32_t>> by_first_byte = std::vector<std::vector<int32_t>>(256);
    bool empty = true;
  };
  enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext,
                             kContiguous };
  struct PreTokenizerStep {
    enum class Kind { kSplit, kByteLevel } kind;
    std::shared_ptr<const Regex> regex;  // Split pattern, or the GPT-2 pattern for ByteLevel
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool use_regex = false;
  };
  // One element of a post-processor template: the encoded sequence, or fixed special ids that
  // are inserted when add_special_tokens is true.
  struct TemplateItem {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  // A piece of the input between added tokens (a view into the text being encoded); id >= 0
  // marks an added token instead.
  struct Piece {
    std::string_view text;
    int32_t id = -1;
  };
  // A [begin, end) slice of a piece produced by a split; `flag` is is_match, then "remove".
  struct Span {
    size_t begin;
    size_t end;
    bool flag;
  };
  // Reusable buffers for one pre-tokenizer step (one per step so recursion never clobbers them).
  struct StepScratch {
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<Span> spans;
    std::vector<Span> splits;
    std::string prefixed;
    std::string mapped;
  };
  struct TokenEntry {
    std::string bytes;  // decoded contribution (see AppendTokenBytes)
    bool special = false;
  };

  Tokenizer();
  absl::Status Parse(std::string_view json_text);
  void SplitAdded(std::string_view text, const AddedMatcher& matcher,
                  std::vector<Piece>* out) const;
  // Runs pre-tokenizer steps [step, end) on `piece` and calls `emit` with every final word
  // (streaming: no piece is copied unless a step rewrites it).
  void PreTokenize(size_t step, std::string_view piece, std::vector<StepScratch>* scratch,
                   absl::FunctionRef<void(std::string_view)> emit) const;
  // tokenizers' NormalizedString::split: the kept slices of `text` in *splits.
  static void ComputeSplits(const Regex& regex, SplitBehavior behavior, bool invert,
                            std::string_view text, StepScratch* scratch);

  bool nfc_ = false;  // the normalizer is NFC (else none)
  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_;                        // by insertion
  absl::flat_hash_map<std::string, int32_t> added_ids_;  // content -> id
  absl::flat_hash_map<int32_t, int32_t> added_by_id_;    // id -> index in added_
  absl::flat_hash_set<std::string> special_contents_;
  AddedMatcher raw_matcher_;         // normalized == false
  AddedMatcher normalized_matcher_;  // normalized == true
  std::vector<PreTokenizerStep> pre_tokenizers_;
  std::vector<std::vector<TemplateItem>> post_steps_;  // applied in order
  bool byte_level_decoder_ = false;
  absl::flat_hash_map<int32_t, TokenEntry> entries_;  // id -> decode data
  int32_t max_id_ = -1;
};

// Incremental detokenizer for streaming generation: feed ids one at a time, get back only
// complete UTF-8 text. Bytes of a character split across tokens are held until it completes;
// bytes that can never become valid become U+FFFD as soon as that is certain. Concatenating
// every Step() result and Flush() equals Tokenizer::Decode(all ids) exactly.
// Not thread-safe (one per stream); the Tokenizer must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // Text that became complete with `id` (possibly empty).
  std::string Step(int32_t id);
  // Ends the stream: held bytes are returned with U+FFFD for the incomplete sequence, as
  // Decode would render them; the decoder is then empty and can start a new stream.
  std::string Flush();
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
  bool emitted_any_ = false;  // for the space-joined (no decoder) form
};

}  // namespace glm::tokenizer
