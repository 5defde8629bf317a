#include "engine/tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "engine/tokenizer/utf8.h"

namespace glm::tokenizer {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 0x144> cp_to_byte;  // -1 when the code point is not in the alphabet
  Tables() {
    std::array<uint32_t, 256> cp{};
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
    cp_to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      AppendCodePoint(cp[b], &byte_to_utf8[b]);
      cp_to_byte[cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

}  // namespace

void ByteLevelEncodeInto(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  out->clear();
  out->reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    const std::string& ch = t.byte_to_utf8[b];
    if (ch.size() == 1) {
      out->push_back(ch[0]);
    } else {
      out->append(ch);
    }
  }
}

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  ByteLevelEncodeInto(bytes, &out);
  return out;
}

std::string ByteLevelDecodeToken(std::string_view token) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const uint32_t cp = NextCodePoint(token, &pos);
    if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(t.cp_to_byte[cp]));
  }
  return out;
}

}  // namespace glm::tokenizer
