// UTF-8 helpers for the tokenizer: validation, lossy decoding with the same replacement rule as
// Rust's String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") (one U+FFFD per
// maximal ill-formed subpart, Unicode §3.9), code point iteration, and the split point that a
// streaming decoder needs (where an incomplete trailing sequence starts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace glm::tokenizer {

inline constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";  // U+FFFD

// True when `bytes` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// Length of the well-formed UTF-8 sequence starting at bytes[pos], or 0 when it is ill-formed or
// truncated. Sets *maximal_subpart (when not null) to the number of bytes an ill-formed sequence
// consumes before the decoder replaces them with one U+FFFD (>= 1).
size_t WellFormedLength(std::string_view bytes, size_t pos, size_t* maximal_subpart = nullptr);

// Appends `bytes` to *out, replacing each maximal ill-formed subpart with U+FFFD.
void AppendUtf8Lossy(std::string_view bytes, std::string* out);
std::string Utf8Lossy(std::string_view bytes);

// Index where a trailing *incomplete but so far well-formed* sequence begins (a lead byte and
// fewer continuation bytes than it needs); bytes.size() when the input ends on a boundary or
// with bytes that can never complete. Decoding bytes[0, index) lossily and holding the rest is
// exactly a prefix of decoding the whole input once more bytes arrive.
size_t IncompleteTailStart(std::string_view bytes);

// Decodes the code point at s[*pos] of a *valid* UTF-8 string and advances *pos.
uint32_t NextCodePoint(std::string_view s, size_t* pos);
// Decodes the code point that ends at s[end) of a valid UTF-8 string; sets *start to its start.
uint32_t PrevCodePoint(std::string_view s, size_t end, size_t* start);

void AppendCodePoint(uint32_t cp, std::string* out);

// Unicode White_Space property (what Oniguruma's and Rust regex's \s match).
bool IsWhiteSpace(uint32_t cp);

}  // namespace glm::tokenizer
