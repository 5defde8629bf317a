#include "controller/gateway/openai/python_literal.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <utility>

namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 128;

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsIdentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

// Recursive descent over the literal subset of Python expressions. Every Parse* returns false
// on anything outside it; the caller then treats the text as not a literal.
class LiteralParser {
 public:
  explicit LiteralParser(std::string_view text) : s_(text) {}

  std::optional<Json> ParseAll() {
    Json value;
    SkipSpace();
    if (!ParseValue(value, 0)) return std::nullopt;
    SkipSpace();
    if (pos_ != s_.size()) return std::nullopt;
    return value;
  }

 private:
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }

  // Inside brackets Python allows newlines and comments; at top level only spaces matter
  // (the caller strips the value), so one rule serves both.
  void SkipSpace() {
    while (!AtEnd()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
      } else if (c == '\\' && Peek(1) == '\n') {
        pos_ += 2;
      } else if (c == '#') {
        while (!AtEnd() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  bool ParseValue(Json& out, int depth) {
    if (depth > kMaxDepth || AtEnd()) return false;
    char c = Peek();
    if (c == '[') return ParseSequence(out, ']', depth);
    if (c == '(') return ParseParen(out, depth);
    if (c == '{') return ParseDict(out, depth);
    if (c == '+' || c == '-') return ParseSigned(out, depth);
    if ((c >= '0' && c <= '9') || (c == '.' && Peek(1) >= '0' && Peek(1) <= '9')) {
      return ParseNumber(out, false);
    }
    if (c == '"' || c == '\'' || StringPrefixLength() > 0) return ParseStrings(out);
    return ParseName(out);
  }

  bool ParseName(Json& out) {
    size_t start = pos_;
    while (!AtEnd() && IsIdentChar(s_[pos_])) ++pos_;
    std::string_view name = s_.substr(start, pos_ - start);
    if (name == "None") {
      out = nullptr;
    } else if (name == "True") {
      out = true;
    } else if (name == "False") {
      out = false;
    } else {
      return false;
    }
    return true;
  }

  bool ParseSigned(Json& out, int depth) {
    bool negative = false;
    while (!AtEnd() && (Peek() == '+' || Peek() == '-')) {
      if (Peek() == '-') negative = !negative;
      ++pos_;
      SkipSpace();
      if (depth++ > kMaxDepth) return false;
    }
    char c = Peek();
    if (!((c >= '0' && c <= '9') || (c == '.' && Peek(1) >= '0' && Peek(1) <= '9'))) return false;
    return ParseNumber(out, negative);
  }

  // Python numeric literals: decimal ints (no leading zeros except all-zero), 0x/0o/0b ints,
  // floats; `_` between digits. Complex (`j`) is rejected (json.dumps cannot write it).
  bool ParseNumber(Json& out, bool negative) {
    std::string digits;
    int base = 10;
    if (Peek() == '0' && (Peek(1) == 'x' || Peek(1) == 'X' || Peek(1) == 'o' || Peek(1) == 'O' ||
                          Peek(1) == 'b' || Peek(1) == 'B')) {
      char kind = static_cast<char>(Peek(1) | 0x20);
      base = kind == 'x' ? 16 : kind == 'o' ? 8 : 2;
      pos_ += 2;
      if (Peek() == '_') ++pos_;
      if (!ReadDigits(digits, base)) return false;
      if (!AtEnd() && IsIdentChar(Peek())) return false;
      return MakeInt(digits, base, negative, out);
    }
    std::string text;
    bool is_float = false;
    if (Peek() != '.') {
      if (!ReadDigits(text, 10)) return false;
    }
    if (Peek() == '.') {
      is_float = true;
      text.push_back('.');
      ++pos_;
      if (Peek() >= '0' && Peek() <= '9') {
        if (!ReadDigits(text, 10)) return false;
      }
    }
    if (Peek() == 'e' || Peek() == 'E') {
      is_float = true;
      text.push_back('e');
      ++pos_;
      if (Peek() == '+' || Peek() == '-') text.push_back(s_[pos_++]);
      if (!ReadDigits(text, 10)) return false;
    }
    if (!AtEnd() && IsIdentChar(Peek())) return false;  // 1j, 12abc, 1_
    if (!is_float) {
      if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos) {
        return false;  // 007: a SyntaxError in Python 3
      }
      return MakeInt(text, 10, negative, out);
    }
    errno = 0;
    double value = std::strtod(text.c_str(), nullptr);
    out = negative ? -value : value;
    return true;
  }

  // Digits of `base` with single underscores between them.
  bool ReadDigits(std::string& out, int base) {
    size_t start = out.size();
    while (!AtEnd()) {
      char c = Peek();
      int d = HexDigit(c);
      if (d >= 0 && d < base && !(base == 10 && !(c >= '0' && c <= '9'))) {
        out.push_back(c);
        ++pos_;
      } else if (c == '_' && out.size() > start) {
        int next = HexDigit(Peek(1));
        if (next < 0 || next >= base) return false;
        ++pos_;
      } else {
        break;
      }
    }
    return out.size() > start;
  }

  static bool MakeInt(const std::string& digits, int base, bool negative, Json& out) {
    uint64_t value = 0;
    for (char c : digits) {
      uint64_t d = static_cast<uint64_t>(HexDigit(c));
      if (value > (std::numeric_limits<uint64_t>::max() - d) / static_cast<uint64_t>(base)) {
        return false;  // beyond 64 bits: no exact JSON integer here
      }
      value = value * static_cast<uint64_t>(base) + d;
    }
    if (!negative) {
      out = value;
    } else if (value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1) {
      out = value == 0 ? int64_t{0} : static_cast<int64_t>(~value + 1);
    } else {
      return false;
    }
    return true;
  }

  // Length of a string prefix (r, u, R, U) directly followed by a quote; 0 when none. Bytes
  // (b'') and f-strings are not literals json.dumps can write.
  size_t StringPrefixLength() const {
    char c = Peek();
    if ((c == 'r' || c == 'R' || c == 'u' || c == 'U') && (Peek(1) == '"' || Peek(1) == '\'')) {
      return 1;
    }
    return 0;
  }

  // One or more adjacent string literals, concatenated.
  bool ParseStrings(Json& out) {
    std::string value;
    bool any = false;
    while (!AtEnd() && (Peek() == '"' || Peek() == '\'' || StringPrefixLength() > 0)) {
      if (!ParseString(value)) return false;
      any = true;
      SkipSpace();
    }
    if (!any) return false;
    out = std::move(value);
    return true;
  }

  bool ParseString(std::string& out) {
    bool raw = false;
    if (size_t prefix = StringPrefixLength(); prefix > 0) {
      raw = Peek() == 'r' || Peek() == 'R';
      pos_ += prefix;
    }
    char quote = Peek();
    bool triple = Peek(1) == quote && Peek(2) == quote;
    pos_ += triple ? 3 : 1;
    while (true) {
      if (AtEnd()) return false;
      char c = s_[pos_];
      if (c == quote) {
        if (!triple) {
          ++pos_;
          return true;
        }
        if (Peek(1) == quote && Peek(2) == quote) {
          pos_ += 3;
          return true;
        }
        out.push_back(c);
        ++pos_;
      } else if (c == '\n' && !triple) {
        return false;
      } else if (c == '\\') {
        if (pos_ + 1 >= s_.size()) return false;
        if (raw) {
          out.push_back('\\');
          out.push_back(s_[pos_ + 1]);
          pos_ += 2;
        } else if (!ParseEscape(out)) {
          return false;
        }
      } else {
        out.push_back(c);
        ++pos_;
      }
    }
  }

  bool ParseEscape(std::string& out) {
    char c = s_[pos_ + 1];
    pos_ += 2;
    switch (c) {
      case '\n': return true;
      case '\\': out.push_back('\\'); return true;
      case '\'': out.push_back('\''); return true;
      case '"': out.push_back('"'); return true;
      case 'a': out.push_back('\a'); return true;
      case 'b': out.push_back('\b'); return true;
      case 'f': out.push_back('\f'); return true;
      case 'n': out.push_back('\n'); return true;
      case 'r': out.push_back('\r'); return true;
      case 't': out.push_back('\t'); return true;
      case 'v': out.push_back('\v'); return true;
      case 'x': return ParseHexEscape(2, out);
      case 'u': return ParseHexEscape(4, out);
      case 'U': return ParseHexEscape(8, out);
      case 'N': return false;  // \N{name}: no name table here
      default: break;
    }
    if (c >= '0' && c <= '7') {
      uint32_t value = static_cast<uint32_t>(c - '0');
      for (int i = 0; i < 2 && Peek() >= '0' && Peek() <= '7'; ++i) {
        value = value * 8 + static_cast<uint32_t>(s_[pos_++] - '0');
      }
      AppendUtf8(value, out);
      return true;
    }
    out.push_back('\\');  // Python keeps unknown escapes as written
    out.push_back(c);
    return true;
  }

  bool ParseHexEscape(int num_digits, std::string& out) {
    uint32_t value = 0;
    for (int i = 0; i < num_digits; ++i) {
      int d = HexDigit(Peek());
      if (d < 0) return false;
      value = value * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (value > 0x10FFFF) return false;
    AppendUtf8(value, out);
    return true;
  }

  // `[a, b,]` (and the body of a tuple): items separated by commas, a trailing comma allowed.
  bool ParseSequence(Json& out, char close, int depth) {
    ++pos_;
    out = Json::array();
    SkipSpace();
    while (true) {
      if (Peek() == close) {
        ++pos_;
        return true;
      }
      Json item;
      if (!ParseValue(item, depth + 1)) return false;
      out.push_back(std::move(item));
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        SkipSpace();
      } else if (Peek() != close) {
        return false;
      }
    }
  }

  // `()` and `(a, …)` are tuples (→ arrays); `(a)` is a parenthesised a.
  bool ParseParen(Json& out, int depth) {
    size_t start = pos_;
    ++pos_;
    SkipSpace();
    if (Peek() == ')') {
      ++pos_;
      out = Json::array();
      return true;
    }
    Json first;
    if (!ParseValue(first, depth + 1)) return false;
    SkipSpace();
    if (Peek() == ')') {
      ++pos_;
      out = std::move(first);
      return true;
    }
    pos_ = start;
    return ParseSequence(out, ')', depth);
  }

  bool ParseDict(Json& out, int depth) {
    ++pos_;
    out = Json::object();
    SkipSpace();
    while (true) {
      if (Peek() == '}') {
        ++pos_;
        return true;
      }
      Json key;
      if (!ParseValue(key, depth + 1)) return false;
      std::string key_text;
      if (key.is_string()) {
        key_text = key.get<std::string>();
      } else if (key.is_primitive()) {
        key_text = PythonJsonDumps(key);  // json.dumps turns 1 / True / None keys into "1" / "true" / "null"
      } else {
        return false;  // unhashable key
      }
      SkipSpace();
      if (Peek() != ':') return false;  // a set literal, or junk
      ++pos_;
      SkipSpace();
      Json value;
      if (!ParseValue(value, depth + 1)) return false;
      out[key_text] = std::move(value);
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        SkipSpace();
      } else if (Peek() != '}') {
        return false;
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

void DumpPython(const Json& value, std::string& out) {
  switch (value.type()) {
    case Json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ", ";
        first = false;
        DumpPython(item, out);
      }
      out.push_back(']');
      return;
    }
    case Json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        out += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace);
        out += ": ";
        DumpPython(item, out);
      }
      out.push_back('}');
      return;
    }
    default:
      out += value.dump(-1, ' ', false, Json::error_handler_t::replace);
      return;
  }
}

}  // namespace

std::optional<nlohmann::ordered_json> ParsePythonLiteral(std::string_view text) {
  return LiteralParser(text).ParseAll();
}

std::string PythonJsonDumps(const nlohmann::ordered_json& value) {
  std::string out;
  DumpPython(value, out);
  return out;
}

nlohmann::ordered_json DeserializeArgument(std::string_view text) {
  Json parsed = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_discarded()) return parsed;
  if (auto literal = ParsePythonLiteral(text)) return *std::move(literal);
  return Json(std::string(text));
}

}  // namespace glm::openai
