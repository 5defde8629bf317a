// The two Python behaviours the GLM tool-call parser copies from vLLM
// (vllm/tool_parsers/glm4_moe_tool_parser.py `_deserialize`, `json.dumps(..., ensure_ascii=False)`):
//   ParsePythonLiteral: ast.literal_eval for the literals a model writes as argument values —
//     None/True/False, int (decimal with `_`, 0x/0o/0b, unary +/-), float, str ('…', "…",
//     triple-quoted, r/u prefixes, adjacent literals concatenated, Python escapes), list,
//     tuple (→ array), dict (str/number/bool/None keys, stringified as json.dumps does).
//     Anything else (sets, bytes, complex, names, calls, nesting deeper than 128) → nullopt.
//   PythonJsonDumps: json.dumps with the default separators ", " and ": ", insertion order and
//     raw UTF-8 (invalid UTF-8 replaced by U+FFFD).
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace glm::openai {

std::optional<nlohmann::ordered_json> ParsePythonLiteral(std::string_view text);
std::string PythonJsonDumps(const nlohmann::ordered_json& value);

// vLLM's `_deserialize`: JSON, else a Python literal, else the text itself as a JSON string.
nlohmann::ordered_json DeserializeArgument(std::string_view text);

}  // namespace glm::openai
