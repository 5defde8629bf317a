// PCRE2 wrapper for the pre-tokenizer split patterns of tokenizer.json, which are written for
// Oniguruma (what the Rust `tokenizers` library compiles them with). Compiled with UTF + UCP,
// JIT when available, and with the Oniguruma differences that matter for tokenizer patterns
// translated: `\s`/`\S` mean Unicode White_Space (PCRE2 adds U+180E), `\w`/`\W` are
// Letter|Mark|Number|Connector_Punctuation, `\h`/`\H` hex digits, `^`/`$` line anchors on "\n"
// only. Not translated (rare in tokenizer.json): nested classes and `&&` intersections, negated
// shorthands inside a bracket expression, absent operators; Unicode versions may differ.
// Thread-safe: one compiled pattern is shared, match state is per thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::tokenizer {

class Regex {
 public:
  // `literal`: the pattern is a plain string to find (tokenizer.json {"String": ...}).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match in `text` (valid UTF-8) as [start, end) byte offsets, iterating
  // like Rust's onig FindMatches: an empty match directly after the previous match is skipped by
  // advancing one character. Returns false (with the matches found so far) when PCRE2 gave up
  // (resource limits); the caller treats the rest as unmatched.
  bool FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;  // as given in tokenizer.json
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Rewrites Oniguruma-only spellings in `pattern` into PCRE2 ones (see the file comment).
std::string TranslateOnigurumaPattern(std::string_view pattern);

}  // namespace glm::tokenizer
