// Response bodies and stream chunks of the OpenAI-compatible surface, in vLLM's shapes and
// OpenAI's key order (../shared/specs/serving.md §4). Pure builders: values in, JSON out.
//
// Shapes (key order as written; "?" = omitted when unset):
//   chat.completion        {id, object, created, model, choices:[{index, message:{role, content
//                          (null when empty and there are tool calls or reasoning), reasoning,
//                          reasoning_content (both null when none), tool_calls ([] when none)},
//                          logprobs, finish_reason}], usage:{prompt_tokens, completion_tokens,
//                          total_tokens}}
//   chat.completion.chunk  {id, object, created, model, choices:[{index, delta, logprobs,
//                          finish_reason}]}; delta carries only what is set: role?, content?,
//                          reasoning? + reasoning_content? (both, same text), tool_calls?:
//                          [{index, id?, type?, function:{name?, arguments}}]; the first chunk's
//                          delta is {"role":"assistant","content":""}; finish_reason null until
//                          the last; the usage chunk has choices [] and usage.
//   text_completion        {id, object, created, model, choices:[{index, text, logprobs,
//                          finish_reason}], usage?}; chunks the same without usage.
//   /v1/models             {object:"list", data:[{id, object:"model", created, owned_by, root,
//                          max_model_len}]}
//   /tokenize              {count, max_model_len, tokens, token_strs?}; /detokenize {prompt}
// Logprobs: chat {content:[{token, logprob, bytes:[…], top_logprobs:[{token, logprob, bytes}]}]};
// completions {tokens, token_logprobs, top_logprobs:[{token: logprob}], text_offset}. A logprob
// of -inf is sent as -9999.0 (vLLM), NaN as null.
//
// Serialise with DumpJson (compact, raw UTF-8, invalid UTF-8 replaced by U+FFFD; never throws).
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "controller/gateway/openai/errors.h"
#include "controller/gateway/openai/ids.h"
#include "controller/gateway/openai/output_parser.h"
#include "nlohmann/json.hpp"

namespace glm::openai {

// What every response object and chunk of one request shares.
struct ResponseMeta {
  std::string id;       // NewId("chatcmpl-") / NewId("cmpl-"), the same for all chunks
  int64_t created = 0;  // unix seconds, the same for all chunks
  std::string model;    // the served model name
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

struct TopLogprob {
  std::string token;  // the token's text
  double logprob = 0.0;
};
struct TokenLogprob {
  std::string token;
  std::optional<double> logprob;  // nullopt only for an echoed prompt's first token
  std::vector<TopLogprob> top;    // the top alternatives, best first
};

struct ChatChoice {
  int index = 0;
  std::optional<std::string> content;    // nullopt → null
  std::optional<std::string> reasoning;  // nullopt → null (sent as reasoning and reasoning_content)
  nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();  // OutputParser::tool_calls()
  nlohmann::ordered_json logprobs;       // null or ChatLogprobsJson(...)
  std::string finish_reason;             // stop | length | tool_calls | abort | repetition
};

struct CompletionChoice {
  int index = 0;
  std::string text;
  nlohmann::ordered_json logprobs;            // null or CompletionLogprobsJson(...)
  std::optional<std::string> finish_reason;   // nullopt → null (chunks before the last)
};

struct ModelCard {
  std::string id;
  int64_t created = 0;
  std::string owned_by = "glmctl";
  std::string root;  // the checkpoint (path or hub name); id when empty
  int64_t max_model_len = 0;
};

// Compact JSON, raw UTF-8 with invalid sequences replaced; never throws.
std::string DumpJson(const nlohmann::ordered_json& json);

// A finished parser's result as a choice: content null when empty and there are tool calls or
// reasoning, reasoning null when empty.
ChatChoice ChatChoiceFromParser(const OutputParser& parser, std::string finish_reason,
                                nlohmann::ordered_json logprobs = nullptr, int index = 0);

nlohmann::ordered_json ChatCompletionJson(const ResponseMeta& meta,
                                          const std::vector<ChatChoice>& choices,
                                          const Usage& usage);
// The delta object of a chunk: only the set fields of `delta`.
nlohmann::ordered_json ChatDeltaJson(const OutputDelta& delta);
// A chunk with one choice. finish_reason nullopt → null.
nlohmann::ordered_json ChatChunkJson(const ResponseMeta& meta, const OutputDelta& delta,
                                     std::optional<std::string_view> finish_reason = std::nullopt,
                                     const nlohmann::ordered_json& logprobs = nullptr,
                                     int index = 0);
// The first chunk: delta {"role":"assistant","content":""}.
nlohmann::ordered_json ChatRoleChunkJson(const ResponseMeta& meta, int index = 0);
// The usage chunk (stream_options.include_usage): choices [] and usage.
nlohmann::ordered_json ChatUsageChunkJson(const ResponseMeta& meta, const Usage& usage);

nlohmann::ordered_json CompletionJson(const ResponseMeta& meta,
                                      const std::vector<CompletionChoice>& choices,
                                      const Usage& usage);
nlohmann::ordered_json CompletionChunkJson(const ResponseMeta& meta, const CompletionChoice& choice);
nlohmann::ordered_json CompletionUsageChunkJson(const ResponseMeta& meta, const Usage& usage);

nlohmann::ordered_json UsageJson(const Usage& usage);
nlohmann::ordered_json ModelListJson(const std::vector<ModelCard>& models);
nlohmann::ordered_json TokenizeJson(const std::vector<int32_t>& tokens, int64_t max_model_len,
                                    const std::vector<std::string>* token_strs = nullptr);
nlohmann::ordered_json DetokenizeJson(std::string_view text);

nlohmann::ordered_json ChatLogprobsJson(const std::vector<TokenLogprob>& tokens);
// text_offset: the character (code point) offset of the first token in the returned text; the
// others follow from the token texts. For a stream, pass the running offset of each chunk.
nlohmann::ordered_json CompletionLogprobsJson(const std::vector<TokenLogprob>& tokens,
                                              int64_t text_offset = 0);

// Server-sent events: "data: <json>\n\n" and the final "data: [DONE]\n\n" (sent after an error
// frame too). SseError is the mid-stream error frame (the envelope; status is already 200).
std::string SseData(const nlohmann::ordered_json& json);
std::string SseDone();
std::string SseError(const ApiError& error);

}  // namespace glm::openai
