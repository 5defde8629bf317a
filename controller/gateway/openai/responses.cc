#include "controller/gateway/openai/responses.h"

#include <cmath>
#include <utility>

namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;

// vLLM sends -inf logprobs as -9999.0; JSON has no infinities. NaN (never expected) → null.
Json LogprobValue(std::optional<double> logprob) {
  if (!logprob || std::isnan(*logprob)) return nullptr;
  if (std::isinf(*logprob)) return *logprob < 0 ? -9999.0 : 9999.0;
  return *logprob;
}

Json Bytes(const std::string& token) {
  Json bytes = Json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// Python str length: code points, counting each invalid byte as one (it decodes to U+FFFD).
int64_t CodePoints(const std::string& text) {
  int64_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
}

Json Header(const ResponseMeta& meta, const char* object) {
  Json json = Json::object();
  json["id"] = meta.id;
  json["object"] = object;
  json["created"] = meta.created;
  json["model"] = meta.model;
  return json;
}

Json OptionalString(const std::optional<std::string>& value) {
  return value ? Json(*value) : Json(nullptr);
}

}  // namespace

std::string DumpJson(const nlohmann::ordered_json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

ChatChoice ChatChoiceFromParser(const OutputParser& parser, std::string finish_reason,
                                nlohmann::ordered_json logprobs, int index) {
  ChatChoice choice;
  choice.index = index;
  choice.tool_calls = parser.tool_calls();
  if (!parser.reasoning().empty()) choice.reasoning = parser.reasoning();
  bool content_may_be_null = !choice.tool_calls.empty() || choice.reasoning.has_value();
  if (!parser.content().empty() || !content_may_be_null) choice.content = parser.content();
  choice.logprobs = std::move(logprobs);
  choice.finish_reason = std::move(finish_reason);
  return choice;
}

nlohmann::ordered_json UsageJson(const Usage& usage) {
  Json json = Json::object();
  json["prompt_tokens"] = usage.prompt_tokens;
  json["completion_tokens"] = usage.completion_tokens;
  json["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  return json;
}

nlohmann::ordered_json ChatCompletionJson(const ResponseMeta& meta,
                                          const std::vector<ChatChoice>& choices,
                                          const Usage& usage) {
  Json json = Header(meta, "chat.completion");
  Json list = Json::array();
  for (const ChatChoice& choice : choices) {
    Json message = Json::object();
    message["role"] = "assistant";
    message["content"] = OptionalString(choice.content);
    message["reasoning"] = OptionalString(choice.reasoning);
    message["reasoning_content"] = OptionalString(choice.reasoning);
    message["tool_calls"] = choice.tool_calls.is_array() ? choice.tool_calls : Json::array();
    Json item = Json::object();
    item["index"] = choice.index;
    item["message"] = std::move(message);
    item["logprobs"] = choice.logprobs;
    item["finish_reason"] = choice.finish_reason;
    list.push_back(std::move(item));
  }
  json["choices"] = std::move(list);
  json["usage"] = UsageJson(usage);
  return json;
}

nlohmann::ordered_json ChatDeltaJson(const OutputDelta& delta) {
  Json json = Json::object();
  if (!delta.content.empty()) json["content"] = delta.content;
  if (!delta.reasoning.empty()) {
    json["reasoning"] = delta.reasoning;
    json["reasoning_content"] = delta.reasoning;
  }
  if (!delta.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCallDelta& call : delta.tool_calls) {
      Json item = Json::object();
      item["index"] = call.index;
      if (call.id) item["id"] = *call.id;
      Json function = Json::object();
      if (call.name) {
        item["type"] = "function";
        function["name"] = *call.name;
      }
      function["arguments"] = call.arguments_fragment;
      item["function"] = std::move(function);
      calls.push_back(std::move(item));
    }
    json["tool_calls"] = std::move(calls);
  }
  return json;
}

namespace {

Json ChatChunk(const ResponseMeta& meta, Json delta, std::optional<std::string_view> finish_reason,
               const Json& logprobs, int index) {
  Json json = Header(meta, "chat.completion.chunk");
  Json choice = Json::object();
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason ? Json(std::string(*finish_reason)) : Json(nullptr);
  json["choices"] = Json::array({std::move(choice)});
  return json;
}

}  // namespace

nlohmann::ordered_json ChatChunkJson(const ResponseMeta& meta, const OutputDelta& delta,
                                     std::optional<std::string_view> finish_reason,
                                     const nlohmann::ordered_json& logprobs, int index) {
  return ChatChunk(meta, ChatDeltaJson(delta), finish_reason, logprobs, index);
}

nlohmann::ordered_json ChatRoleChunkJson(const ResponseMeta& meta, int index) {
  Json delta = Json::object();
  delta["role"] = "assistant";
  delta["content"] = "";
  return ChatChunk(meta, std::move(delta), std::nullopt, nullptr, index);
}

nlohmann::ordered_json ChatUsageChunkJson(const ResponseMeta& meta, const Usage& usage) {
  Json json = Header(meta, "chat.completion.chunk");
  json["choices"] = Json::array();
  json["usage"] = UsageJson(usage);
  return json;
}

namespace {

Json CompletionChoiceJson(const CompletionChoice& choice) {
  Json item = Json::object();
  item["index"] = choice.index;
  item["text"] = choice.text;
  item["logprobs"] = choice.logprobs;
  item["finish_reason"] = OptionalString(choice.finish_reason);
  return item;
}

}  // namespace

nlohmann::ordered_json CompletionJson(const ResponseMeta& meta,
                                      const std::vector<CompletionChoice>& choices,
                                      const Usage& usage) {
  Json json = Header(meta, "text_completion");
  Json list = Json::array();
  for (const CompletionChoice& choice : choices) list.push_back(CompletionChoiceJson(choice));
  json["choices"] = std::move(list);
  json["usage"] = UsageJson(usage);
  return json;
}

nlohmann::ordered_json CompletionChunkJson(const ResponseMeta& meta,
                                           const CompletionChoice& choice) {
  Json json = Header(meta, "text_completion");
  json["choices"] = Json::array({CompletionChoiceJson(choice)});
  return json;
}

nlohmann::ordered_json CompletionUsageChunkJson(const ResponseMeta& meta, const Usage& usage) {
  Json json = Header(meta, "text_completion");
  json["choices"] = Json::array();
  json["usage"] = UsageJson(usage);
  return json;
}

nlohmann::ordered_json ModelListJson(const std::vector<ModelCard>& models) {
  Json data = Json::array();
  for (const ModelCard& model : models) {
    Json card = Json::object();
    card["id"] = model.id;
    card["object"] = "model";
    card["created"] = model.created;
    card["owned_by"] = model.owned_by;
    card["root"] = model.root.empty() ? model.id : model.root;
    card["max_model_len"] = model.max_model_len;
    data.push_back(std::move(card));
  }
  Json json = Json::object();
  json["object"] = "list";
  json["data"] = std::move(data);
  return json;
}

nlohmann::ordered_json TokenizeJson(const std::vector<int32_t>& tokens, int64_t max_model_len,
                                    const std::vector<std::string>* token_strs) {
  Json json = Json::object();
  json["count"] = tokens.size();
  json["max_model_len"] = max_model_len;
  json["tokens"] = tokens;
  if (token_strs != nullptr) json["token_strs"] = *token_strs;
  return json;
}

nlohmann::ordered_json DetokenizeJson(std::string_view text) {
  Json json = Json::object();
  json["prompt"] = std::string(text);
  return json;
}

nlohmann::ordered_json ChatLogprobsJson(const std::vector<TokenLogprob>& tokens) {
  Json content = Json::array();
  for (const TokenLogprob& token : tokens) {
    Json item = Json::object();
    item["token"] = token.token;
    item["logprob"] = LogprobValue(token.logprob);
    item["bytes"] = Bytes(token.token);
    Json top = Json::array();
    for (const TopLogprob& alt : token.top) {
      Json entry = Json::object();
      entry["token"] = alt.token;
      entry["logprob"] = LogprobValue(alt.logprob);
      entry["bytes"] = Bytes(alt.token);
      top.push_back(std::move(entry));
    }
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  Json json = Json::object();
  json["content"] = std::move(content);
  return json;
}

nlohmann::ordered_json CompletionLogprobsJson(const std::vector<TokenLogprob>& tokens,
                                              int64_t text_offset) {
  Json token_texts = Json::array();
  Json token_logprobs = Json::array();
  Json top_logprobs = Json::array();
  Json offsets = Json::array();
  for (const TokenLogprob& token : tokens) {
    token_texts.push_back(token.token);
    token_logprobs.push_back(LogprobValue(token.logprob));
    if (token.top.empty() && !token.logprob) {
      top_logprobs.push_back(nullptr);
    } else {
      Json top = Json::object();
      for (const TopLogprob& alt : token.top) top[alt.token] = LogprobValue(alt.logprob);
      top_logprobs.push_back(std::move(top));
    }
    offsets.push_back(text_offset);
    text_offset += CodePoints(token.token);
  }
  Json json = Json::object();
  json["tokens"] = std::move(token_texts);
  json["token_logprobs"] = std::move(token_logprobs);
  json["top_logprobs"] = std::move(top_logprobs);
  json["text_offset"] = std::move(offsets);
  return json;
}

std::string SseData(const nlohmann::ordered_json& json) {
  std::string frame = "data: ";
  frame += DumpJson(json);
  frame += "\n\n";
  return frame;
}

std::string SseDone() { return "data: [DONE]\n\n"; }

std::string SseError(const ApiError& error) { return SseData(ErrorJson(error)); }

}  // namespace glm::openai
