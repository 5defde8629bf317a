#include "engine/tokenizer/normalizer.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/tokenizer/utf8.h"

namespace glm::tokenizer {
namespace {

struct CccRange {
  uint32_t first;
  uint32_t last;
  uint8_t ccc;
};
struct Decomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;  // 0 for a singleton
};
struct Composition {
  uint32_t first;
  uint32_t second;
  uint32_t composite;
};

#include "engine/tokenizer/nfc_data.inc"

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

int Ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::upper_bound(std::begin(kCccRanges), std::end(kCccRanges), cp,
                             [](uint32_t v, const CccRange& r) { return v < r.first; });
  if (it == std::begin(kCccRanges)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

void Decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                               [](const Decomposition& d, uint32_t v) { return d.cp < v; });
    if (it != std::end(kDecompositions) && it->cp == cp) {
      Decompose(it->first, out);
      if (it->second != 0) Decompose(it->second, out);
      return;
    }
  }
  out->push_back(cp);
}

// Primary composite of (a, b), or 0.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions),
                             std::make_pair(a, b), [](const Composition& c, auto key) {
                               return c.first != key.first ? c.first < key.first
                                                           : c.second < key.second;
                             });
  if (it != std::end(kCompositions) && it->first == a && it->second == b) return it->composite;
  return 0;
}

}  // namespace

bool IsTriviallyNfc(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0xCC) return false;  // lead bytes of U+0300 and above
  }
  return true;
}

std::string NormalizeNfc(std::string_view text) {
  if (IsTriviallyNfc(text)) return std::string(text);
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) Decompose(NextCodePoint(text, &pos), &cps);
  // Canonical ordering: stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (Ccc(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && Ccc(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i),
                     cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return Ccc(a) < Ccc(b); });
    i = j;
  }
  // Canonical composition (UAX #15 reference algorithm).
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  size_t starter = 0;
  int last_class = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const int cls = Ccc(cp);
    if (out.empty()) {
      out.push_back(cp);
      starter = 0;
      last_class = cls == 0 ? 0 : 256;  // a leading non-starter never composes
      continue;
    }
    const uint32_t composite = Compose(out[starter], cp);
    if (composite != 0 && (last_class < cls || last_class == 0) && Ccc(out[starter]) == 0) {
      out[starter] = composite;
      continue;
    }
    if (cls == 0) starter = out.size();
    last_class = cls;
    out.push_back(cp);
  }
  std::string result;
  result.reserve(text.size());
  for (uint32_t cp : out) AppendCodePoint(cp, &result);
  return result;
}

}  // namespace glm::tokenizer
