// Parser: tokens -> Program, following jinja2/parser.py's grammar and precedence (note `**` is
// left-associative there, and `-x|f` applies f to -x). Unknown tags are errors; an unknown
// filter or test is an error unless it sits inside an `if` (jinja2 defers those to runtime).
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "controller/gateway/jinja/ast.h"

namespace glm::jinja {

// Errors: InvalidArgument "line L:C: <what>, expected <what>".
absl::StatusOr<std::shared_ptr<const Program>> ParseProgram(std::string_view source);

}  // namespace glm::jinja
