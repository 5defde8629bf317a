// glm_jinja: the Jinja subset Hugging Face chat templates use, rendering byte-for-byte what
// transformers' apply_chat_template renders (../../../../shared/specs/serving.md §2.1).
//
// Reference configuration (transformers `_compile_jinja_template`):
//   jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//       extensions=[jinja2.ext.loopcontrols])
//   globals: raise_exception(msg) -> Render returns an error carrying msg; strftime_now(fmt)
//   tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
// Values follow Python: `{{ [1, 'a'] }}` prints "[1, 'a']", true prints "True", 1.0 prints "1.0";
// undefined variables are empty and falsy, but an attribute or item of an undefined value is an
// error (jinja2's default Undefined). As in the immutable sandbox, list/dict mutators
// (`.append`, `.update`, `.pop`, ...) are errors; `{% set ns.x = ... %}` on a namespace works.
//
// Supported: {{ }}, {% %}, {# #}, `-`/`+` whitespace control, trim_blocks/lstrip_blocks, if/elif/
// else, for (tuple targets, `if` filter, else, loop.*, break/continue), set (also block form and
// namespace attributes), macro, filter blocks, with, raw; the operators, tests, filters, string/
// dict methods and globals (range, dict, namespace) real chat templates use. Anything else (an
// unknown tag, filter or test, extends/include/import) is a Parse error naming it and line:col.
//
// Errors: Parse -> InvalidArgument "line L:C: <what>, expected <what>". Render ->
// InvalidArgument with the message of raise_exception, or "<expression>: <python-like error>"
// for an undefined attribute, a type error, and so on. Render never crashes or runs unbounded:
// output, string and list sizes, evaluation steps and call depth are capped (RenderLimits); a
// cap that is hit is a ResourceExhausted error.
//
// Thread-safety: a Template is immutable after Parse; copies share the parsed program. Render is
// const and may run concurrently on one Template from many threads.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace glm::jinja {

struct Program;  // the parsed template (ast.h); opaque to callers.

// Caps that keep a hostile or buggy template bounded. The defaults suit the gateway.
struct RenderLimits {
  int64_t max_output_bytes = int64_t{64} << 20;  // also caps any single string value
  int64_t max_list_items = int64_t{1} << 22;     // any single list built by the template
  int64_t max_steps = int64_t{200} << 20;        // expression/statement evaluations
  int max_call_depth = 200;                      // nested macro calls
};

struct RenderOptions {
  RenderLimits limits;
  // Seconds since the epoch for strftime_now (local time, as Python's datetime.now()). Unset:
  // the wall clock. Tests inject a fixed time here.
  std::function<std::time_t()> now;
};

class Template {
 public:
  // Parses a chat template. Syntax errors name line:col and what was expected.
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with `context` (a JSON object: messages, tools, add_generation_prompt, bos_token,
  // eos_token, any chat_template_kwargs) exactly as transformers' apply_chat_template would.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const RenderOptions& options) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}

  std::shared_ptr<const Program> program_;  // never null
};

}  // namespace glm::jinja
