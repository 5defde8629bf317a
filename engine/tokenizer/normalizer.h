// Unicode NFC for the tokenizer.json "NFC" normalizer (canonical decomposition, canonical
// ordering, canonical composition; UAX #15). Tables: nfc_data.inc (gen_nfc_data.py; Unicode
// 14.0 from Python's unicodedata; the Rust reference uses a newer Unicode, which differs only
// for characters assigned since).
#pragma once

#include <string>
#include <string_view>

namespace glm::tokenizer {

// NFC of `text` (valid UTF-8).
std::string NormalizeNfc(std::string_view text);

// True when NormalizeNfc(text) == text is certain without work (no code point >= U+0300).
bool IsTriviallyNfc(std::string_view text);

}  // namespace glm::tokenizer
