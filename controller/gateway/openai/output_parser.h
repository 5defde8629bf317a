// The streaming parser for GLM-4.7 / GLM-5.x output text (../shared/specs/serving.md §3): splits
// it into reasoning, content and tool calls, and turns each call's
// <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call> into an OpenAI
// tool call whose `arguments` is a JSON string, streamed vLLM-style.
//
// Input: text deltas of the detokenized output with special tokens kept. Markers (<think>,
// </think>, <tool_call>, ...) are single tokens in GLM's vocabulary but may still arrive split
// across deltas, so any suffix that could start a marker the current state acts on is held back
// until the next Feed (or Finish) decides it; an incomplete UTF-8 sequence at the end of a delta
// is held back too, so every emitted string is whole UTF-8 when the input is.
//
// Rules:
//   - reasoning (options.reasoning): starts in the reasoning phase when starts_in_reasoning (the
//     prompt ended in <think>) or when <think> comes before any non-whitespace content; </think>
//     or <tool_call> ends it (once); any other <think> / </think> is swallowed. With
//     reasoning=false everything is content (markers included, as text).
//   - tool calls (options.tools): NAME ends at the first <arg_key> or </tool_call> and is
//     stripped; keys are stripped; anything between </arg_key> and <arg_value> (whitespace,
//     even a literal "\n") and between arguments is ignored. Values: a key declared a string in
//     the tools schema (type "string", ["string", "null"], an enum of strings, or anyOf/oneOf
//     of those) is raw and untrimmed; any other is stripped, then read as JSON, then as a
//     Python literal (True/False/None, quoted strings, numbers, lists, tuples, dicts), else kept
//     as the stripped string. A key without a value is dropped. Text outside calls is content,
//     raw, except that a stretch of it that is only whitespace is dropped when tools are parsed
//     (leading whitespace of content is held until other text follows). With
//     parallel_tool_calls=false calls after the first are dropped. With tools=false a
//     <tool_call> is content text.
//   - streaming deltas (ToolCallDelta): the name once, with a fresh id and arguments "", as soon
//     as it is complete; then argument fragments: `{"key": ` (`, "key": ` after the first) at
//     <arg_value>, with a string value's opening quote, its text JSON-escaped
//     as it arrives and the closing quote at </arg_value>; any other value whole at
//     </arg_value>; `}` (or `{}` with no arguments) at </tool_call>. The concatenation of one
//     call's fragments is exactly its final `arguments` (json.dumps style: ", " and ": ").
//   - <|observation|>, <|user|>, <|endoftext|> end the output: neither they nor anything after
//     them is emitted. An unterminated call (stop marker, Finish) is closed as if its
//     </arg_value> and </tool_call> had come, so its arguments are valid JSON; a call whose
//     name never ended is dropped.
//   - The same input gives the same accumulated result however it is split into deltas.
//
// Not thread-safe: one parser per request, fed from one thread.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace glm::openai {

struct ParserOptions {
  bool reasoning = true;
  bool starts_in_reasoning = false;  // the rendered prompt ended with <think>
  bool tools = false;                // parse tool calls (tools sent and tool_choice != "none")
  nlohmann::ordered_json tools_schema;  // the request's tools array, for argument typing
  bool parallel_tool_calls = true;
  // Makes tool-call ids; empty = NewId("chatcmpl-tool-"). Tests inject a deterministic one.
  std::function<std::string()> new_tool_call_id;
};

struct ToolCallDelta {
  int index = 0;                    // 0, 1, ... in order of the calls kept
  std::optional<std::string> id;    // set on the call's first delta only
  std::optional<std::string> name;  // set on the call's first delta only
  std::string arguments_fragment;   // "" on the first delta
};

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  explicit OutputParser(ParserOptions options);

  // Consumes one text delta; returns what can be emitted now.
  OutputDelta Feed(std::string_view text);
  // End of output (always call it, also after a stop marker or a stop string): flushes
  // held-back text and closes an open call. Later Feeds are ignored.
  OutputDelta Finish();

  // Whether any tool call was emitted (finish_reason "tool_calls").
  bool saw_tool_calls() const { return !calls_.empty(); }
  // Whether a stop marker (<|observation|>, <|user|>, <|endoftext|>) was seen.
  bool saw_stop_marker() const { return state_ == State::kDone && stopped_by_marker_; }

  // Everything emitted so far, for non-streaming responses (complete after Finish).
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  // [{"id", "type":"function", "function":{"name", "arguments": <JSON string>}}]
  nlohmann::ordered_json tool_calls() const;

 private:
  enum class State {
    kReasoning,
    kContent,
    kCallName,   // after <tool_call>
    kCallArgs,   // between arguments
    kArgKey,     // after <arg_key>
    kBeforeValue,  // after </arg_key>
    kArgValue,   // after <arg_value>
    kDone,
  };
  struct Call {
    std::string id;
    std::string name;
    std::string arguments;  // the fragments emitted so far, concatenated
  };

  void Run(OutputDelta& out, bool at_end);
  const std::vector<std::string_view>& Markers() const;
  void OnMarker(std::string_view marker, OutputDelta& out);
  void EmitText(std::string_view text, OutputDelta& out);
  void EmitContent(std::string_view text, OutputDelta& out);
  void EmitArgs(std::string_view fragment, OutputDelta& out);
  void StartValue(OutputDelta& out);
  void EndValue(OutputDelta& out);
  void EndName(OutputDelta& out);
  void EndCall(OutputDelta& out);
  void CloseOpenCall(OutputDelta& out);
  bool ValueIsString() const;

  ParserOptions options_;
  State state_;
  bool reasoning_done_ = false;
  bool stopped_by_marker_ = false;
  std::string buffer_;         // unconsumed input (held-back marker or UTF-8 prefix)
  // Content between calls: whitespace held until the stretch shows other text (tools only).
  std::string pending_space_;
  bool segment_started_ = false;
  // The call being parsed.
  bool call_kept_ = false;     // false when parallel_tool_calls=false dropped it
  bool call_named_ = false;
  size_t call_num_args_ = 0;
  std::string name_text_;
  std::string key_text_;
  std::string value_text_;
  bool value_is_string_ = false;
  // Results so far.
  std::string reasoning_;
  std::string content_;
  std::vector<Call> calls_;
};

}  // namespace glm::openai
