#include "controller/gateway/jinja/text.h"

#include "controller/gateway/jinja/value.h"

namespace glm::jinja {
namespace {

uint32_t UpperOf(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c == 0xB5) return 0x39C;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    bool odd_lower = (c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
    bool even_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_lower && (c & 1)) return c - 1;
    if (even_lower && !(c & 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x3AC && c <= 0x3AF) {
    static constexpr uint32_t kMap[] = {0x386, 0x388, 0x389, 0x38A};
    return kMap[c - 0x3AC];
  }
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

uint32_t LowerOf(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 'i';
    bool even_upper = (c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
    bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (even_upper && !(c & 1)) return c + 1;
    if (odd_upper && (c & 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

bool IsUpperCp(uint32_t c) { return LowerOf(c) != c || c == 0x3A2; }
bool IsLowerCp(uint32_t c) { return UpperOf(c) != c || c == 0xDF; }
bool IsCasedCp(uint32_t c) { return IsUpperCp(c) || IsLowerCp(c); }

template <typename Fn>
std::string MapChars(std::string_view s, Fn fn) {
  std::string out;
  out.reserve(s.size());
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = Utf8Next(s, pos, &cp);
    if (cp == 0xFFFD && n == 1) {
      out.append(s.substr(pos, n));
    } else {
      fn(out, cp);
    }
    pos += n;
  }
  return out;
}

void AppendUpper(std::string& out, uint32_t cp) {
  if (cp == 0xDF) {
    out += "SS";
  } else {
    AppendUtf8(out, UpperOf(cp));
  }
}
void AppendLower(std::string& out, uint32_t cp) { AppendUtf8(out, LowerOf(cp)); }

std::vector<uint32_t> CodePoints(std::string_view s) {
  std::vector<uint32_t> cps;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    pos += Utf8Next(s, pos, &cp);
    cps.push_back(cp);
  }
  return cps;
}

template <typename Pred>
bool AllChars(std::string_view s, Pred pred) {
  if (s.empty()) return false;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    pos += Utf8Next(s, pos, &cp);
    if (!pred(cp)) return false;
  }
  return true;
}

}  // namespace

std::string PyUpper(std::string_view s) { return MapChars(s, AppendUpper); }
std::string PyLower(std::string_view s) { return MapChars(s, AppendLower); }

std::string PyTitle(std::string_view s) {
  bool prev_cased = false;
  return MapChars(s, [&](std::string& out, uint32_t cp) {
    if (prev_cased) {
      AppendLower(out, cp);
    } else {
      AppendUpper(out, cp);
    }
    prev_cased = IsCasedCp(cp);
  });
}

std::string PyCapitalize(std::string_view s) {
  bool first = true;
  return MapChars(s, [&](std::string& out, uint32_t cp) {
    if (first) {
      AppendUpper(out, cp);
    } else {
      AppendLower(out, cp);
    }
    first = false;
  });
}

std::string JinjaTitle(std::string_view s) {
  // "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s) if item)
  const auto is_sep = [](uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || IsPySpace(cp);
  };
  std::string out;
  bool at_item_start = true;
  bool in_sep = false;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = Utf8Next(s, pos, &cp);
    bool sep = is_sep(cp);
    if (sep != in_sep || pos == 0) at_item_start = true;
    in_sep = sep;
    if (cp == 0xFFFD && n == 1) {
      out.append(s.substr(pos, n));
    } else if (at_item_start) {
      AppendUpper(out, cp);
    } else {
      AppendLower(out, cp);
    }
    at_item_start = false;
    pos += n;
  }
  return out;
}

bool PyIsUpper(std::string_view s) {
  bool any = false;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    pos += Utf8Next(s, pos, &cp);
    if (IsLowerCp(cp)) return false;
    any = any || IsUpperCp(cp);
  }
  return any;
}

bool PyIsLower(std::string_view s) {
  bool any = false;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    pos += Utf8Next(s, pos, &cp);
    if (IsUpperCp(cp)) return false;
    any = any || IsLowerCp(cp);
  }
  return any;
}

bool PyIsDigit(std::string_view s) {
  return AllChars(s, [](uint32_t c) { return (c >= '0' && c <= '9') || (c >= 0xFF10 && c <= 0xFF19); });
}

bool PyIsAlpha(std::string_view s) {
  return AllChars(s, [](uint32_t c) {
    return IsCasedCp(c) || (c >= 0x3040 && c <= 0x30FF) || (c >= 0x4E00 && c <= 0x9FFF) ||
           (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x3400 && c <= 0x4DBF) || c == 0xDF;
  });
}

bool PyIsSpace(std::string_view s) { return AllChars(s, IsPySpace); }

std::string_view PyStrip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  std::vector<uint32_t> set;
  if (chars) set = CodePoints(*chars);
  const auto strip_it = [&](uint32_t cp) {
    if (!chars) return IsPySpace(cp);
    for (uint32_t c : set) {
      if (c == cp) return true;
    }
    return false;
  };
  size_t begin = 0;
  size_t end = s.size();
  uint32_t cp = 0;
  if (side != StripSide::kRight) {
    while (begin < end) {
      size_t n = Utf8Next(s, begin, &cp);
      if (!strip_it(cp)) break;
      begin += n;
    }
  }
  if (side != StripSide::kLeft) {
    size_t keep = begin;
    for (size_t pos = begin; pos < end;) {
      size_t n = Utf8Next(s, pos, &cp);
      pos += n;
      if (!strip_it(cp)) keep = pos;
    }
    end = keep;
  }
  return s.substr(begin, end - begin);
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) Fail("ValueError: empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        size_t at = s.find(*sep, pos);
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(pos, at - pos));
        pos = at + sep->size();
      }
      parts.emplace_back(s.substr(pos));
      return parts;
    }
    size_t end = s.size();
    std::vector<std::string> rev;
    while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      rev.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    rev.emplace_back(s.substr(0, end));
    return std::vector<std::string>(rev.rbegin(), rev.rend());
  }
  // Whitespace runs; leading/trailing whitespace never yields empty parts.
  struct Piece {
    size_t begin, end;
  };
  std::vector<Piece> words;
  uint32_t cp = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t n = Utf8Next(s, pos, &cp);
    if (IsPySpace(cp)) {
      pos += n;
      continue;
    }
    size_t start = pos;
    while (pos < s.size()) {
      n = Utf8Next(s, pos, &cp);
      if (IsPySpace(cp)) break;
      pos += n;
    }
    words.push_back({start, pos});
  }
  if (maxsplit < 0 || static_cast<int64_t>(words.size()) <= maxsplit + 1) {
    for (const Piece& w : words) parts.emplace_back(s.substr(w.begin, w.end - w.begin));
    return parts;
  }
  if (!from_right) {
    for (int64_t i = 0; i < maxsplit; ++i) parts.emplace_back(s.substr(words[i].begin, words[i].end - words[i].begin));
    // Python keeps trailing whitespace in the remainder: "a b  c ".split(None, 1) -> ['a', 'b  c ']
    parts.emplace_back(s.substr(words[maxsplit].begin));
    return parts;
  }
  size_t first_kept = words.size() - static_cast<size_t>(maxsplit);
  parts.emplace_back(s.substr(0, words[first_kept - 1].end));  // keeps leading whitespace
  for (size_t i = first_kept; i < words.size(); ++i) {
    parts.emplace_back(s.substr(words[i].begin, words[i].end - words[i].begin));
  }
  return parts;
}

std::vector<std::string> PySplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  size_t start = 0;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = Utf8Next(s, pos, &cp);
    bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
               cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk) {
      pos += n;
      continue;
    }
    size_t eol = pos + n;
    if (cp == '\r' && eol < s.size() && s[eol] == '\n') ++eol;
    lines.emplace_back(s.substr(start, (keepends ? eol : pos) - start));
    start = pos = eol;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    auto chars = Utf8Chars(s);
    int64_t done = 0;
    for (size_t i = 0; i <= chars.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(repl);
        ++done;
      }
      if (i < chars.size()) out.append(chars[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(repl);
    pos = at + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t PyFind(std::string_view s, std::string_view sub, bool from_right) {
  size_t at = from_right ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return Utf8Length(s.substr(0, at));
}

int64_t PyCount(std::string_view s, std::string_view sub) {
  if (sub.empty()) return Utf8Length(s) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

}  // namespace glm::jinja
