#include "engine/tokenizer/utf8.h"

namespace glm::tokenizer {
namespace {

// Expected sequence length from the lead byte, 0 for bytes that cannot start a sequence.
inline size_t LeadLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Valid range of the second byte given the lead (Unicode Table 3-7).
inline bool SecondByteOk(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

inline bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

size_t WellFormedLength(std::string_view bytes, size_t pos, size_t* maximal_subpart) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  const uint8_t lead = s[pos];
  const size_t len = LeadLength(lead);
  size_t good = 1;  // bytes of a valid prefix seen so far
  if (len == 0) {
    if (maximal_subpart) *maximal_subpart = 1;
    return 0;
  }
  for (size_t i = 1; i < len; ++i) {
    if (pos + i >= n) break;
    const uint8_t b = s[pos + i];
    const bool ok = (i == 1) ? SecondByteOk(lead, b) : IsContinuation(b);
    if (!ok) break;
    ++good;
  }
  if (good == len) return len;
  if (maximal_subpart) *maximal_subpart = good;
  return 0;
}

bool IsValidUtf8(std::string_view bytes) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = WellFormedLength(bytes, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  size_t i = 0;
  const size_t n = bytes.size();
  out->reserve(out->size() + n);
  while (i < n) {
    size_t run = i;  // copy runs of well-formed text in one go
    while (run < n) {
      if (static_cast<uint8_t>(bytes[run]) < 0x80) {
        ++run;
        continue;
      }
      const size_t len = WellFormedLength(bytes, run);
      if (len == 0) break;
      run += len;
    }
    out->append(bytes.data() + i, run - i);
    i = run;
    if (i < n) {
      size_t bad = 1;
      WellFormedLength(bytes, i, &bad);
      out->append(kReplacementUtf8);
      i += bad;
    }
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  AppendUtf8Lossy(bytes, &out);
  return out;
}

size_t IncompleteTailStart(std::string_view bytes) {
  const size_t n = bytes.size();
  // Walk back over at most three continuation bytes to the last possible lead byte.
  size_t p = n;
  for (size_t back = 0; back < 4 && p > 0; ++back) {
    --p;
    if (!IsContinuation(static_cast<uint8_t>(bytes[p]))) break;
  }
  if (p >= n) return n;
  const uint8_t lead = static_cast<uint8_t>(bytes[p]);
  const size_t len = LeadLength(lead);
  if (len <= 1 || n - p >= len) return n;  // ASCII, invalid lead, or complete (or too long)
  size_t maximal = 0;
  WellFormedLength(bytes, p, &maximal);
  // Incomplete but well-formed so far when every byte after the lead was accepted.
  return maximal == n - p ? p : n;
}

uint32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto* b = reinterpret_cast<const uint8_t*>(s.data()) + *pos;
  if (b[0] < 0x80) {
    *pos += 1;
    return b[0];
  }
  if (b[0] < 0xE0) {
    *pos += 2;
    return ((b[0] & 0x1Fu) << 6) | (b[1] & 0x3Fu);
  }
  if (b[0] < 0xF0) {
    *pos += 3;
    return ((b[0] & 0x0Fu) << 12) | ((b[1] & 0x3Fu) << 6) | (b[2] & 0x3Fu);
  }
  *pos += 4;
  return ((b[0] & 0x07u) << 18) | ((b[1] & 0x3Fu) << 12) | ((b[2] & 0x3Fu) << 6) | (b[3] & 0x3Fu);
}

uint32_t PrevCodePoint(std::string_view s, size_t end, size_t* start) {
  size_t p = end;
  do {
    --p;
  } while (p > 0 && IsContinuation(static_cast<uint8_t>(s[p])));
  *start = p;
  size_t q = p;
  return NextCodePoint(s, &q);
}

void AppendCodePoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsWhiteSpace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace glm::tokenizer
