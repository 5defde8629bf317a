// Request bodies of the OpenAI-compatible surface (../shared/specs/serving.md §4), parsed and
// validated into plain structs. Pure functions of the body bytes: no I/O, no tokenizer, no
// served-model knowledge (the gateway checks `model`, the prompt length and `max_tokens` against
// max_model_len).
//
// Contract of every Parse*:
//   - the body must be a JSON object; otherwise 400 (param null) naming the parse position;
//     bodies nesting deeper than 128 levels or with an object of more than 1024 members → 400
//     (bounds on the work a hostile body causes);
//   - every rejection is an ApiError 400 whose `param` names the parameter at fault
//     ("temperature", "messages[1].tool_calls[0].function.arguments") and whose message says
//     what is accepted;
//   - unknown fields are accepted and ignored; JSON null means "absent" for every optional field;
//   - integers may be sent as integral floats (100.0), as pydantic's lax mode accepts.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "controller/gateway/openai/errors.h"
#include "nlohmann/json.hpp"

namespace glm::openai {

// Parameters shared by /v1/chat/completions and /v1/completions.
struct SamplingOptions {
  // max_completion_tokens wins over max_tokens; >= 1. Absent = up to max_model_len (chat);
  // completions default to 16 when `max_tokens` is absent (vLLM, OpenAI), unlimited when null.
  std::optional<int> max_tokens;
  float temperature = 1.0f;  // [0, 2]
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 = off (-1 accepted and normalised to 0); >= 0
  float min_p = 0.0f;        // [0, 1] (vLLM extension)
  // Whether the client sent these (the gateway may apply the checkpoint's generation_config
  // defaults, e.g. GLM-5.2's top_p 0.95, to the ones it did not send).
  bool temperature_set = false;
  bool top_p_set = false;
  bool top_k_set = false;
  std::optional<uint64_t> seed;        // any JSON integer; negatives wrap (two's complement)
  std::vector<std::string> stop;       // string or array of <= 16 non-empty strings
  std::vector<int32_t> stop_token_ids; // vLLM extension; each >= 0
  bool ignore_eos = false;             // vLLM extension
  int min_tokens = 0;                  // vLLM extension; >= 0 and <= max_tokens
  // glmctl extension: MTP drafts per step for this request, in [0, 16]; beyond the replica's
  // model.mtp_draft_tokens the replica answers 400. Absent: the replica's.
  std::optional<int> mtp_draft_tokens;
  // Number of top alternatives per sampled token when logprobs were asked for, else nullopt.
  // Chat: `logprobs: true` + `top_logprobs` 0..20 (top_logprobs without logprobs → 400).
  // Completions: `logprobs` integer 0..20.
  std::optional<int> logprobs;
  bool stream = false;
  // stream_options.include_usage; true by default once stream_options is sent (vLLM).
  // stream_options without stream:true → 400 "stream_options".
  bool include_usage = false;
  // n / best_of: only 1 (or absent). presence_penalty / frequency_penalty (0),
  // repetition_penalty (1), logit_bias (empty): accepted only at their neutral values, else 400
  // naming the parameter as not supported yet. response_format: only {"type":"text"}.
};

struct ChatRequest {
  std::string model;  // optional (vLLM); empty = the served model
  // Validated: non-empty array of objects, each with
  //   role: system | developer | user | assistant | tool;
  //   content: string | array of text parts ({"type":"text","text":…}) | null (assistant only);
  //   tool: tool_call_id (optional string);
  //   assistant: tool_calls[]: {id?, type?:"function", function:{name, arguments}}, where a
  //     JSON-string `arguments` (what OpenAI clients send) is parsed into an object HERE, because
  //     the GLM template drops string arguments (spec §2.3); "" → {}; invalid JSON or a
  //     non-object → 400 naming messages[i].tool_calls[j].function.arguments;
  //   assistant reasoning: `reasoning` is copied to `reasoning_content` (what the template reads)
  //     when only `reasoning` is sent.
  nlohmann::ordered_json messages;
  // null when absent, else an array of {type:"function", function:{name, description?,
  // parameters?: object}} (extra keys such as `strict` kept).
  nlohmann::ordered_json tools;
  // "none" | "auto" | "required" | "named"; for "named", tool_choice_name is the function and
  // tool_choice_json the object sent. required / named need tools; a named function must be
  // among them. Default "auto" ("none" when there are no tools changes nothing either way).
  std::string tool_choice = "auto";
  std::string tool_choice_name;
  nlohmann::ordered_json tool_choice_json;
  bool parallel_tool_calls = true;
  // Always an object (empty when none sent). Folded in (spec §2.5), never overriding a key the
  // client put in chat_template_kwargs itself:
  //   chat_template_kwargs.thinking (bool)        → enable_thinking
  //   thinking: {"type":"enabled"|"disabled"} or bool (Z.ai) → enable_thinking;
  //     thinking.clear_thinking / top-level clear_thinking (bool) → clear_thinking
  //   reasoning_effort: none|minimal|low|medium|high|xhigh|max → reasoning_effort (as sent);
  //     "none" also → enable_thinking: false
  nlohmann::ordered_json chat_template_kwargs;
  bool add_generation_prompt = true;
  bool continue_final_message = false;  // needs a final assistant message; not with add_generation_prompt
  bool echo = false;                    // vLLM extension
  SamplingOptions sampling;

  // chat_template_kwargs.enable_thinking unless it is false (thinking is on by default).
  bool thinking_enabled() const;
  // Whether tool calls are to be parsed out of the output: tools sent and tool_choice != none.
  bool tools_enabled() const;
};

struct CompletionRequest {
  std::string model;
  // string, [int], or [string] / [[int]] of length 1; longer arrays → 400 "batched prompts are
  // not supported"; empty string / array → 400. Token ids in [0, 2^31).
  std::variant<std::string, std::vector<int32_t>> prompt;
  bool echo = false;
  // `suffix`: a non-empty string → 400 (not supported).
  SamplingOptions sampling;
};

// vLLM /tokenize: the completion form {"prompt"} or the chat form {"messages", ...}; both or
// neither → 400.
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;        // completion form
  nlohmann::ordered_json messages;          // chat form (validated as in ChatRequest); else null
  nlohmann::ordered_json tools;             // chat form: null or validated tools array
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;        // chat form
  bool continue_final_message = false;      // chat form
  bool add_special_tokens = true;           // vLLM default: true for prompt, false for messages
  bool return_token_strs = false;

  bool is_chat() const { return !prompt.has_value(); }
};

// vLLM /detokenize: {"model"?, "tokens": [int, ...]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};

Result<ChatRequest> ParseChatRequest(std::string_view body);
Result<CompletionRequest> ParseCompletionRequest(std::string_view body);
Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body);
Result<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body);

}  // namespace glm::openai
