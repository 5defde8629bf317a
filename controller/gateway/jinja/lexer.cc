#include "controller/gateway/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "controller/gateway/jinja/value.h"

namespace glm::jinja {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Length of the Python whitespace (str.isspace) run starting at pos.
size_t SpaceRun(std::string_view s, size_t pos) {
  size_t start = pos;
  uint32_t cp = 0;
  while (pos < s.size()) {
    size_t n = Utf8Next(s, pos, &cp);
    if (!IsPySpace(cp)) break;
    pos += n;
  }
  return pos - start;
}

// Python str.rstrip() with no argument.
std::string_view RStripSpace(std::string_view s) {
  size_t keep = 0;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = Utf8Next(s, pos, &cp);
    pos += n;
    if (!IsPySpace(cp)) keep = pos;
  }
  return s.substr(0, keep);
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  absl::StatusOr<LexResult> Run() {
    if (auto status = LexAll(); !status.ok()) return status;
    Token end;
    end.type = TokenType::kEnd;
    SetPosition(end, src_.size(), src_.size());
    tokens_.push_back(std::move(end));
    return LexResult{std::move(src_), std::move(tokens_)};
  }

 private:
  absl::Status Error(size_t offset, std::string_view what) {
    int line = 1;
    int col = 1;
    LineCol(offset, &line, &col);
    return absl::InvalidArgumentError(Cat("line ", line, ":", col, ": ", what));
  }

  void LineCol(size_t offset, int* line, int* col) {
    // Incremental: offsets are mostly increasing.
    if (offset < cached_offset_) {
      cached_offset_ = 0;
      cached_line_ = 1;
      cached_line_start_ = 0;
    }
    for (size_t i = cached_offset_; i < offset && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++cached_line_;
        cached_line_start_ = i + 1;
      }
    }
    cached_offset_ = offset;
    *line = cached_line_;
    *col = static_cast<int>(offset - cached_line_start_) + 1;
  }

  void SetPosition(Token& token, size_t offset, size_t end) {
    token.offset = offset;
    token.end = end;
    LineCol(offset, &token.line, &token.col);
  }

  void Emit(TokenType type, size_t offset, size_t end, std::string text = {}) {
    Token token;
    token.type = type;
    token.text = std::move(text);
    SetPosition(token, offset, end);
    tokens_.push_back(std::move(token));
  }

  void EmitData(size_t offset, std::string_view text) {
    if (!text.empty()) Emit(TokenType::kData, offset, offset + text.size(), std::string(text));
  }

  // The text before a tag, after `-` or lstrip_blocks (jinja2's OptionalLStrip handling).
  std::string_view StripBefore(std::string_view text, char sign, bool is_variable) {
    if (sign == '-') return RStripSpace(text);
    if (sign != '+' && !is_variable) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        std::string_view tail = text.substr(l_pos);
        if (!tail.empty() && SpaceRun(tail, 0) == tail.size()) return text.substr(0, l_pos);
      }
    }
    return text;
  }

  // Matches `-%}\s*`, `+%}`, `%}\n?` (or the `}}` forms) at pos; returns the end or npos.
  size_t MatchTagEnd(size_t pos, char close, bool trim) {
    const std::string_view s = src_;
    const char closer_chars[2] = {close, '}'};
    const std::string_view closer(closer_chars, 2);
    const auto at = [&](size_t p, std::string_view lit) {
      return p <= s.size() && s.substr(p, lit.size()) == lit;
    };
    if (at(pos, "-") && at(pos + 1, closer)) return pos + 3 + SpaceRun(s, pos + 3);
    if (trim && at(pos, "+") && at(pos + 1, closer)) return pos + 3;
    if (at(pos, closer)) {
      size_t end = pos + 2;
      if (trim && end < s.size() && s[end] == '\n') ++end;
      return end;
    }
    return std::string_view::npos;
  }

  absl::Status LexAll() {
    const std::string_view s = src_;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t tag = std::string_view::npos;
      for (size_t i = s.find('{', pos); i != std::string_view::npos; i = s.find('{', i + 1)) {
        if (i + 1 < s.size() && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
          tag = i;
          break;
        }
      }
      if (tag == std::string_view::npos) {
        EmitData(pos, s.substr(pos));
        return absl::OkStatus();
      }
      const char kind = s[tag + 1];
      char sign = 0;
      size_t after = tag + 2;
      if (after < s.size() && (s[after] == '-' || s[after] == '+')) sign = s[after++];
      std::string_view text = StripBefore(s.substr(pos, tag - pos), sign, kind == '{');
      EmitData(pos, text);

      if (kind == '#') {
        size_t close = s.find("#}", after);
        if (close == std::string_view::npos) return Error(tag, "missing end of comment tag '#}'");
        size_t end = close + 2;
        if (close > after && s[close - 1] == '-') {
          end += SpaceRun(s, end);
        } else if (!(close > after && s[close - 1] == '+') && end < s.size() && s[end] == '\n') {
          ++end;
        }
        line_starting_ = s[end - 1] == '\n';
        pos = end;
        continue;
      }
      if (kind == '%') {
        if (std::optional<size_t> raw_end = MatchRawBegin(after)) {
          absl::Status status = LexRaw(tag, *raw_end, &pos);
          if (!status.ok()) return status;
          continue;
        }
      }
      Emit(kind == '{' ? TokenType::kVarBegin : TokenType::kBlockBegin, tag, after);
      absl::Status status = LexTag(after, kind == '{' ? '}' : '%', &pos);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // After `{%` (and sign): `\s*raw\s*(-%}\s*|%})`; returns the end of the tag.
  std::optional<size_t> MatchRawBegin(size_t pos) {
    const std::string_view s = src_;
    pos += SpaceRun(s, pos);
    if (s.substr(pos, 3) != "raw") return std::nullopt;
    pos += 3;
    pos += SpaceRun(s, pos);
    if (s.substr(pos, 3) == "-%}") return pos + 3 + SpaceRun(s, pos + 3);
    if (s.substr(pos, 2) == "%}") return pos + 2;
    return std::nullopt;
  }

  // Raw content up to `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)`, emitted as data.
  absl::Status LexRaw(size_t tag, size_t content_start, size_t* pos_out) {
    const std::string_view s = src_;
    for (size_t i = s.find("{%", content_start); i != std::string_view::npos;
         i = s.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < s.size() && (s[p] == '-' || s[p] == '+')) sign = s[p++];
      p += SpaceRun(s, p);
      if (s.substr(p, 6) != "endraw") continue;
      p += 6;
      p += SpaceRun(s, p);
      size_t end = MatchTagEnd(p, '%', true);
      if (end == std::string_view::npos) continue;
      line_starting_ = false;  // the root match ended with the raw begin tag
      if (s[content_start - 1] == '\n') line_starting_ = true;
      EmitData(content_start, StripBefore(s.substr(content_start, i - content_start), sign, false));
      line_starting_ = s[end - 1] == '\n';
      *pos_out = end;
      return absl::OkStatus();
    }
    return Error(tag, "missing end of raw directive, expected '{% endraw %}'");
  }

  // Tokens inside {{ }} (close '}') or {% %} (close '%') up to the closing delimiter.
  absl::Status LexTag(size_t pos, char close, size_t* pos_out) {
    const std::string_view s = src_;
    std::vector<char> balance;
    while (true) {
      if (pos >= s.size()) {
        return Error(pos, close == '}' ? "unexpected end of template, expected '}}'"
                                       : "unexpected end of template, expected '%}'");
      }
      if (balance.empty()) {
        size_t end = MatchTagEnd(pos, close, close == '%');
        if (end != std::string_view::npos) {
          Emit(close == '}' ? TokenType::kVarEnd : TokenType::kBlockEnd, pos, end);
          line_starting_ = s[end - 1] == '\n';
          *pos_out = end;
          return absl::OkStatus();
        }
      }
      const char c = s[pos];
      if (size_t ws = SpaceRun(s, pos); ws > 0) {
        pos += ws;
        continue;
      }
      if (IsDigit(c)) {
        absl::Status status = LexNumber(&pos);
        if (!status.ok()) return status;
        continue;
      }
      if (IsNameStart(c)) {
        size_t end = pos;
        while (end < s.size() && IsNameChar(s[end])) ++end;
        Emit(TokenType::kName, pos, end, std::string(s.substr(pos, end - pos)));
        pos = end;
        continue;
      }
      if (c == '\'' || c == '"') {
        absl::Status status = LexString(&pos);
        if (!status.ok()) return status;
        continue;
      }
      static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
      bool matched = false;
      for (std::string_view op : kTwo) {
        if (s.substr(pos, 2) == op) {
          Emit(TokenType::kOperator, pos, pos + 2, std::string(op));
          pos += 2;
          matched = true;
          break;
        }
      }
      if (matched) continue;
      static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
      if (kOne.find(c) == std::string_view::npos) {
        return Error(pos, Cat("unexpected char ", PyReprString(std::string(1, c))));
      }
      if (c == '(' || c == '[' || c == '{') {
        balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (c == ')' || c == ']' || c == '}') {
        if (balance.empty()) return Error(pos, Cat("unexpected '", std::string(1, c), "'"));
        if (balance.back() != c) {
          return Error(pos, Cat("unexpected '", std::string(1, c), "', expected '",
                                         std::string(1, balance.back()), "'"));
        }
        balance.pop_back();
      }
      Emit(TokenType::kOperator, pos, pos + 1, std::string(1, c));
      ++pos;
    }
  }

  // Digit run with single underscores between digits: (\d+_)*\d+
  size_t DigitRun(size_t pos) {
    const std::string_view s = src_;
    size_t end = pos;
    while (end < s.size() && IsDigit(s[end])) {
      ++end;
      if (end + 1 < s.size() && s[end] == '_' && IsDigit(s[end + 1])) ++end;
    }
    return end;
  }

  absl::Status LexNumber(size_t* pos_io) {
    const std::string_view s = src_;
    size_t pos = *pos_io;
    size_t end = DigitRun(pos);
    bool is_float = false;
    bool after_dot = pos > 0 && s[pos - 1] == '.';  // jinja2: (?<!\.) on floats
    if (!after_dot) {
      size_t fend = end;
      if (fend + 1 < s.size() && s[fend] == '.' && IsDigit(s[fend + 1])) {
        fend = DigitRun(fend + 1);
        is_float = true;
      }
      if (fend < s.size() && (s[fend] == 'e' || s[fend] == 'E')) {
        size_t e = fend + 1;
        if (e < s.size() && (s[e] == '+' || s[e] == '-')) ++e;
        if (e < s.size() && IsDigit(s[e])) {
          fend = DigitRun(e);
          is_float = true;
        }
      }
      if (is_float) end = fend;
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) {
      if (s[i] != '_') text += s[i];
    }
    Token token;
    SetPosition(token, pos, end);
    if (is_float) {
      token.type = TokenType::kFloat;
      token.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      token.type = TokenType::kInt;
      errno = 0;
      char* parse_end = nullptr;
      long long v = std::strtoll(text.c_str(), &parse_end, 10);
      if (errno == ERANGE) return Error(pos, "integer literal out of range");
      token.int_value = v;
    }
    token.text = std::move(text);
    tokens_.push_back(std::move(token));
    *pos_io = end;
    return absl::OkStatus();
  }

  // A quoted literal, decoded like Python's "unicode-escape" codec (what jinja2 applies).
  absl::Status LexString(size_t* pos_io) {
    const std::string_view s = src_;
    const size_t start = *pos_io;
    const char quote = s[start];
    size_t pos = start + 1;
    std::string out;
    while (true) {
      if (pos >= s.size()) return Error(start, "unterminated string literal");
      char c = s[pos];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++pos;
        continue;
      }
      if (pos + 1 >= s.size()) return Error(start, "unterminated string literal");
      char e = s[pos + 1];
      pos += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int i = 0; i < digits; ++i) {
            int h = pos < s.size() ? HexValue(s[pos]) : -1;
            if (h < 0) {
              return Error(start, Cat("invalid string literal: truncated \\", std::string(1, e),
                                               " escape"));
            }
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++pos;
          }
          if (cp > 0x10FFFF) return Error(start, "invalid string literal: illegal Unicode character");
          AppendUtf8(out, cp);
          break;
        }
        case 'N':
          return Error(start, "invalid string literal: \\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos < s.size() && s[pos] >= '0' && s[pos] <= '7'; ++i) {
              cp = cp * 8 + static_cast<uint32_t>(s[pos++] - '0');
            }
            AppendUtf8(out, cp);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    Token token;
    token.type = TokenType::kString;
    token.text = std::move(out);
    SetPosition(token, start, pos + 1);
    tokens_.push_back(std::move(token));
    *pos_io = pos + 1;
    return absl::OkStatus();
  }

  std::string src_;
  std::vector<Token> tokens_;
  bool line_starting_ = true;
  size_t cached_offset_ = 0;
  int cached_line_ = 1;
  size_t cached_line_start_ = 0;
};

std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

}  // namespace

absl::StatusOr<LexResult> Lex(std::string_view source) {
  return Lexer(NormalizeNewlines(source)).Run();
}

const char* TokenTypeName(TokenType type) {
  switch (type) {
    case TokenType::kData: return "template data";
    case TokenType::kVarBegin: return "'{{'";
    case TokenType::kVarEnd: return "'}}'";
    case TokenType::kBlockBegin: return "'{%'";
    case TokenType::kBlockEnd: return "'%}'";
    case TokenType::kName: return "name";
    case TokenType::kString: return "string";
    case TokenType::kInt: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kOperator: return "operator";
    case TokenType::kEnd: return "end of template";
  }
  return "token";
}

}  // namespace glm::jinja
