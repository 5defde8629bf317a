// Fuzz target: arbitrary bytes as model output for the OutputParser and StopMatcher. The first
// two bytes pick the parser options and how the rest is split into deltas. Checks, aborting on
// a violation: the result does not depend on the split (one delta vs the fuzzed split), every
// call's arguments is a JSON object and equals the concatenation of its streamed fragments.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "controller/gateway/openai/output_parser.h"
#include "controller/gateway/openai/stop_matcher.h"

namespace {

using glm::openai::OutputDelta;
using glm::openai::OutputParser;
using glm::openai::ParserOptions;

struct Accumulated {
  std::string reasoning;
  std::string content;
  std::vector<std::string> names;
  std::vector<std::string> arguments;  // concatenated fragments, per call
};

void Accumulate(const OutputDelta& delta, Accumulated& acc) {
  acc.reasoning += delta.reasoning;
  acc.content += delta.content;
  for (const auto& call : delta.tool_calls) {
    if (call.name) {
      if (call.index != static_cast<int>(acc.names.size())) std::abort();
      acc.names.push_back(*call.name);
      acc.arguments.emplace_back();
    }
    if (call.index < 0 || call.index >= static_cast<int>(acc.arguments.size())) std::abort();
    acc.arguments[call.index] += call.arguments_fragment;
  }
}

ParserOptions Options(uint8_t flags) {
  ParserOptions options;
  options.reasoning = flags & 1;
  options.starts_in_reasoning = flags & 2;
  options.tools = flags & 4;
  options.parallel_tool_calls = !(flags & 8);
  options.tools_schema = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  int counter = 0;
  options.new_tool_call_id = [counter]() mutable { return "call-" + std::to_string(counter++); };
  return options;
}

// Feeds `text` in one delta (split_seed 0) or in pseudo-random deltas of 1..7 bytes.
Accumulated Run(uint8_t flags, std::string_view text, uint32_t split_seed,
                nlohmann::ordered_json& final_calls, std::string& final_reasoning,
                std::string& final_content) {
  OutputParser parser(Options(flags));
  Accumulated acc;
  uint32_t state = split_seed | 1;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = split_seed == 0 ? text.size() : 1 + (state >> 16) % 7;
    state = state * 1103515245u + 12345u;
    len = std::min(len, text.size() - pos);
    Accumulate(parser.Feed(text.substr(pos, len)), acc);
    pos += len;
  }
  Accumulate(parser.Finish(), acc);
  final_calls = parser.tool_calls();
  final_reasoning = parser.reasoning();
  final_content = parser.content();
  return acc;
}

std::string StopRun(std::string_view text, uint32_t split_seed, bool& stopped) {
  glm::openai::StopMatcher matcher({"</", "ab", "abc", "\n\n", "stop"});
  std::string out;
  uint32_t state = split_seed | 1;
  size_t pos = 0;
  stopped = false;
  while (pos < text.size() && !stopped) {
    size_t len = split_seed == 0 ? text.size() : 1 + (state >> 16) % 5;
    state = state * 1103515245u + 12345u;
    len = std::min(len, text.size() - pos);
    auto result = matcher.Feed(text.substr(pos, len));
    out += result.text;
    stopped = result.stopped;
    pos += len;
  }
  out += matcher.Flush();
  stopped = matcher.stopped();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint8_t flags = data[0];
  uint32_t seed = data[1] + 1u;
  std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);

  nlohmann::ordered_json whole_calls;
  nlohmann::ordered_json split_calls;
  std::string whole_reasoning;
  std::string whole_content;
  std::string ignored;
  Accumulated whole = Run(flags, text, 0, whole_calls, whole_reasoning, whole_content);
  Accumulated split = Run(flags, text, seed, split_calls, ignored, ignored);

  if (whole.reasoning != split.reasoning || whole.content != split.content ||
      whole.names != split.names || whole.arguments != split.arguments) {
    std::abort();
  }
  if (whole.reasoning != whole_reasoning || whole.content != whole_content) std::abort();
  if (whole_calls.size() != whole.names.size()) std::abort();
  for (size_t i = 0; i < whole_calls.size(); ++i) {
    const std::string& arguments = whole_calls[i]["function"]["arguments"].get_ref<const std::string&>();
    if (arguments != whole.arguments[i]) std::abort();
    auto parsed = nlohmann::json::parse(arguments, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) std::abort();
  }
  if (!(flags & 4) && !whole.names.empty()) std::abort();

  bool stopped_whole = false;
  bool stopped_split = false;
  std::string stop_whole = StopRun(text, 0, stopped_whole);
  std::string stop_split = StopRun(text, seed, stopped_split);
  if (stop_whole != stop_split || stopped_whole != stopped_split) std::abort();
  return 0;
}
