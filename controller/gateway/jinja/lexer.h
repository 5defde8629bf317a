// Lexer: template source -> tokens, reproducing jinja2's lexer (jinja2/lexer.py, 3.1) with
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False: newlines normalized to
// "\n" and one trailing newline dropped; `-` strips all whitespace on its side; lstrip removes
// the whitespace between a line start and a `{%`/`{#` tag unless the tag opens with `+`; a
// `%}`/`#}` swallows one following "\n" unless it is `+%}`; raw blocks become data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::jinja {

enum class TokenType : uint8_t {
  kData,        // text: template data between tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // text: identifier (keywords included)
  kString,      // text: the decoded literal
  kInt,         // int_value
  kFloat,       // float_value
  kOperator,    // text: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { } ;
  kEnd,         // end of the template
};

struct Token {
  TokenType type = TokenType::kEnd;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int col = 1;
  size_t offset = 0;  // into the normalized source
  size_t end = 0;
};

struct LexResult {
  std::string source;  // newline-normalized; token offsets index it
  std::vector<Token> tokens;
};

// Errors: InvalidArgument "line L:C: <what>".
absl::StatusOr<LexResult> Lex(std::string_view source);

const char* TokenTypeName(TokenType type);

}  // namespace glm::jinja
