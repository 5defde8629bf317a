// Fuzz target: arbitrary bytes parsed as a chat template and rendered with a fixed context
// (messages with tools, tool calls and unicode). Parse and render errors are fine; crashes,
// hangs and unbounded memory are not, so the limits are tight here.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "controller/gateway/jinja/template.h"
#include "nlohmann/json.hpp"

namespace {
const nlohmann::ordered_json& Context() {
  static const auto* context = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi \u4f60\u597d \ud83d\ude00"}]},
      {"role": "assistant", "content": "ok", "reasoning_content": "think",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]},
      {"role": "tool", "content": "r1"},
      {"role": "user", "content": "again"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false
  })"));
  return *context;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tmpl = glm::jinja::Template::Parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!tmpl.ok()) return 0;
  glm::jinja::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_list_items = 1 << 16;
  options.limits.max_steps = 1 << 20;
  options.limits.max_call_depth = 50;
  options.now = [] { return std::time_t{1700000000}; };
  (void)tmpl->Render(Context(), options);
  return 0;
}
