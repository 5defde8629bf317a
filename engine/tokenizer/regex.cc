#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/tokenizer/utf8.h"

namespace glm::tokenizer {
namespace {

// Unicode White_Space, the set Oniguruma's \s matches in UTF-8 mode (class-body form).
constexpr std::string_view kWhiteSpaceClass =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Per-thread match state: PCRE2 match data and a JIT stack large enough for long whitespace
// runs. Shared by every Regex (match data with one pair works with any pattern).
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ThreadMatchState() {
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
    if (context != nullptr) {
      pcre2_set_match_limit(context, 0xFFFFFFFFu);
      pcre2_set_depth_limit(context, 0xFFFFFFFFu);
      pcre2_set_heap_limit(context, 1024u * 1024u);  // KiB: 1 GiB for the interpreter fallback
    }
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

std::string TranslateOnigurumaPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  int class_depth = 0;
  size_t i = 0;
  // Oniguruma class bodies (UTF-8, no ASCII-range option) that PCRE2 spells differently.
  auto class_body = [](char e) -> std::string_view {
    switch (e) {
      case 's':
      case 'S':
        return kWhiteSpaceClass;
      case 'w':
      case 'W':
        return "\\p{L}\\p{M}\\p{N}\\p{Pc}";  // Letter|Mark|Number|Connector_Punctuation
      case 'h':
      case 'H':
        return "0-9a-fA-F";  // \h is a hex digit in Oniguruma, horizontal space in PCRE2
      default:
        return {};
    }
  };
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      const std::string_view body = class_body(e);
      const bool negated = e == 'S' || e == 'W' || e == 'H';
      if (!body.empty() && class_depth == 0) {
        absl::StrAppend(&out, negated ? "[^" : "[", glm::ToAbsl(body), "]");
        i += 2;
        continue;
      }
      if (!body.empty() && !negated) {
        out.append(body);  // inside a bracket expression: splice the members in
        i += 2;
        continue;
      }
      out.push_back(c);  // other escapes (and negated shorthands inside a class) unchanged
      out.push_back(e);
      i += 2;
      continue;
    }
    if (c == '[') {
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {
        // POSIX class inside a bracket expression: copy through ":]".
        const size_t close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out.append(p.substr(i, close + 2 - i));
          i = close + 2;
          continue;
        }
      }
      ++class_depth;
      out.push_back(c);
      ++i;
      // A ']' right after '[' or '[^' is a literal member.
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
    ++i;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  const std::string translated = literal ? std::string(pattern) : TranslateOnigurumaPattern(pattern);
  uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
  if (literal) {
    options |= PCRE2_LITERAL;
  } else {
    options |= PCRE2_UCP | PCRE2_MULTILINE | PCRE2_ALT_CIRCUMFLEX;
  }
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  if (cctx != nullptr) pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                    &error_code, &error_offset, cctx);
  pcre2_compile_context_free(cctx);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "regex pattern \"", std::string(pattern), "\" does not compile with PCRE2 at offset ",
        error_offset, " (of the translated pattern \"", translated,
        "\"): ", reinterpret_cast<const char*>(message),
        "; the tokenizer supports Oniguruma patterns that PCRE2 also accepts"));
  }
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::FindAll(std::string_view text,
                    std::vector<std::pair<size_t, size_t>>* matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& state = MatchState();
  if (state.match_data == nullptr) return false;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t search_from = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (search_from <= n) {
    int rc = pcre2_match(code, subject, n, search_from, PCRE2_NO_UTF_CHECK, state.match_data,
                         state.context);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit_) {
      // JIT stack or limit exhausted: retry with the interpreter (heap-based backtracking).
      rc = pcre2_match(code, subject, n, search_from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       state.match_data, state.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return true;
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.match_data);
    const size_t start = ov[0];
    const size_t end = ov[1];
    if (start == end && have_last && last_end == end) {
      // Empty match right after the previous one: step one character and search again.
      if (search_from >= n) return true;
      size_t pos = search_from;
      NextCodePoint(text, &pos);
      search_from = pos;
      continue;
    }
    matches->emplace_back(start, end);
    have_last = true;
    last_end = end;
    search_from = end;  // after an empty match the next search hits the rule above
  }
  return true;
}

}  // namespace glm::tokenizer
