// GPT-2 byte <-> unicode mapping used by the ByteLevel pre-tokenizer and decoder: each byte maps
// to one visible character (printable Latin-1 bytes to themselves, the rest to U+0100..U+0143).
#pragma once

#include <string>
#include <string_view>

namespace glm::tokenizer {

// Maps every byte of `bytes` to its character (1 or 2 UTF-8 bytes each).
std::string ByteLevelEncode(std::string_view bytes);
// The same into *out (replacing its contents; reuses its capacity).
void ByteLevelEncodeInto(std::string_view bytes, std::string* out);

// The ByteLevel decoder for one token: its bytes when every character is in the byte alphabet,
// otherwise the token's own UTF-8 (e.g. an added token such as "<|user|>" with spaces), exactly
// as tokenizers' ByteLevel::decode_chain.
std::string ByteLevelDecodeToken(std::string_view token);

}  // namespace glm::tokenizer
