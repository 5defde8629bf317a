#include "controller/gateway/openai/requests.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>


namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;
using MaybeError = std::optional<ApiError>;

// Message text from pieces: strings, characters arrays, integers and doubles (as %g).
void Append(std::string& out, std::string_view piece) { out.append(piece); }
void Append(std::string& out, double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  out.append(buffer);
}
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
void Append(std::string& out, Int value) {
  out.append(std::to_string(value));
}
template <typename... Pieces>
std::string Cat(const Pieces&... pieces) {
  std::string out;
  (Append(out, pieces), ...);
  return out;
}

// Propagates a MaybeError out of the enclosing function.
#define GLM_OPENAI_RETURN_IF_ERROR(expr) \
  do {                                   \
    if (MaybeError e_ = (expr)) {        \
      return *std::move(e_);             \
    }                                    \
  } while (false)

// Bodies nest no deeper than this and no object has more members: nlohmann's serialiser
// recurses and ordered_json inserts in linear time per key, so both bound the work an
// adversarial body can cause.
constexpr int kMaxDepth = 128;
constexpr int kMaxObjectMembers = 1024;
constexpr int kMaxStops = 16;
constexpr int kMaxLogprobs = 20;

// A short rendering of a rejected value for messages: `got "hot"`.
std::string Got(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return Cat(" (got ", text, ")");
}

const char* TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::discarded: return "invalid";
    default: return "a number";
  }
}

// Depth and object-size limits, checked on the bytes before nlohmann builds anything.
MaybeError CheckShape(std::string_view body) {
  struct Level {
    bool object;
    int members;
  };
  std::vector<Level> stack;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '{':
      case '[':
        stack.push_back({c == '{', 1});
        if (static_cast<int>(stack.size()) > kMaxDepth) {
          return BadRequest("", Cat("The request body nests deeper than ", kMaxDepth,
                                             " levels; flatten it."));
        }
        break;
      case '}':
      case ']':
        if (!stack.empty()) stack.pop_back();
        break;
      case ',':
        if (!stack.empty() && stack.back().object && ++stack.back().members > kMaxObjectMembers) {
          return BadRequest("", Cat("A JSON object in the request body has more than ",
                                             kMaxObjectMembers, " members."));
        }
        break;
      default: break;
    }
  }
  return std::nullopt;
}

Result<Json> ParseBody(std::string_view body) {
  if (MaybeError e = CheckShape(body)) return *std::move(e);
  Json parsed;
  try {
    parsed = Json::parse(body.begin(), body.end());
  } catch (const Json::exception& e) {
    // parse_error (syntax, invalid UTF-8) and out_of_range (a number beyond double).
    std::string what = e.what();
    if (size_t at = what.find("] "); what.rfind("[json.exception", 0) == 0 && at != std::string::npos) {
      what = what.substr(at + 2);
    }
    std::string where;
    if (const auto* parse_error = dynamic_cast<const Json::parse_error*>(&e)) {
      where = Cat(" (byte ", parse_error->byte, ")");
    }
    return BadRequest("", Cat("The request body is not valid JSON: ", what, where, "."));
  }
  if (!parsed.is_object()) {
    return BadRequest("", Cat("The request body must be a JSON object, not ",
                                       TypeName(parsed), "."));
  }
  return parsed;
}

// The member `key` of `object`, or nullptr when absent or null.
const Json* Find(const Json& object, std::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

bool IntegralNumber(const Json& value, int64_t& out) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    out = value.get<int64_t>();
    return true;
  }
  if (value.is_number_float()) {
    double d = value.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
    out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

MaybeError GetBool(const Json& object, std::string_view key, bool& out) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) {
    return BadRequest(std::string(key), Cat(key, " must be true or false", Got(*value)));
  }
  out = value->get<bool>();
  return std::nullopt;
}

MaybeError GetString(const Json& object, std::string_view key, std::string& out,
                     std::string_view param) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) {
    return BadRequest(std::string(param), Cat(param, " must be a string", Got(*value)));
  }
  out = value->get<std::string>();
  return std::nullopt;
}

// An integer in [lo, hi]; `what` completes "<key> must be ...".
MaybeError GetInt(const Json& object, std::string_view key, int64_t lo, int64_t hi,
                  std::string_view what, std::optional<int64_t>& out) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  int64_t n = 0;
  if (!IntegralNumber(*value, n) || n < lo || n > hi) {
    return BadRequest(std::string(key), Cat(key, " must be ", what, Got(*value)));
  }
  out = n;
  return std::nullopt;
}

MaybeError GetNumber(const Json& object, std::string_view key, double lo, bool lo_open, double hi,
                     std::string_view what, float& out, bool* set = nullptr) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) {
    return BadRequest(std::string(key), Cat(key, " must be ", what, Got(*value)));
  }
  double d = value->get<double>();
  if (!(lo_open ? d > lo : d >= lo) || !(d <= hi)) {
    return BadRequest(std::string(key), Cat(key, " must be ", what, Got(*value)));
  }
  out = static_cast<float>(d);
  if (set != nullptr) *set = true;
  return std::nullopt;
}

// A number parameter we accept only at its neutral value.
MaybeError NeutralNumber(const Json& object, std::string_view key, double neutral) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) {
    return BadRequest(std::string(key), Cat(key, " must be a number", Got(*value)));
  }
  if (value->get<double>() != neutral) {
    return BadRequest(std::string(key),
                      Cat(key, " is not supported yet; send ", neutral,
                                   " or leave it out", Got(*value)));
  }
  return std::nullopt;
}

// n / best_of: only 1.
MaybeError OnlyOne(const Json& object, std::string_view key) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  int64_t n = 0;
  if (!IntegralNumber(*value, n) || n != 1) {
    return BadRequest(std::string(key),
                      Cat("only ", key, "=1 is supported", Got(*value)));
  }
  return std::nullopt;
}

// Known vLLM parameters this gateway cannot honour: rejected rather than silently ignored.
MaybeError Unsupported(const Json& object, std::string_view key, std::string_view why) {
  if (Find(object, key) == nullptr) return std::nullopt;
  return BadRequest(std::string(key), Cat(key, " is not supported", why));
}

MaybeError TokenIds(const Json& value, std::string_view param, std::vector<int32_t>& out) {
  out.clear();
  out.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    int64_t id = 0;
    if (!IntegralNumber(value[i], id) || id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return BadRequest(std::string(param),
                        Cat(param, "[", i, "] must be a token id (an integer >= 0)",
                                     Got(value[i])));
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

MaybeError ParseStop(const Json& body, SamplingOptions& out) {
  const Json* stop = Find(body, "stop");
  if (stop == nullptr) return std::nullopt;
  constexpr std::string_view kAccepted = "a non-empty string or an array of up to 16 non-empty strings";
  if (stop->is_string()) {
    if (stop->get_ref<const std::string&>().empty()) {
      return BadRequest("stop", Cat("stop must be ", kAccepted, Got(*stop)));
    }
    out.stop = {stop->get<std::string>()};
    return std::nullopt;
  }
  if (!stop->is_array() || stop->size() > kMaxStops) {
    return BadRequest("stop", Cat("stop must be ", kAccepted, Got(*stop)));
  }
  for (size_t i = 0; i < stop->size(); ++i) {
    const Json& item = (*stop)[i];
    if (!item.is_string() || item.get_ref<const std::string&>().empty()) {
      return BadRequest("stop", Cat("stop[", i, "] must be a non-empty string", Got(item)));
    }
    out.stop.push_back(item.get<std::string>());
  }
  return std::nullopt;
}

MaybeError ParseSampling(const Json& body, bool chat, SamplingOptions& out) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> n;
  if (chat) {
    std::optional<int64_t> max_completion_tokens;
    GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "max_tokens", 1, kIntMax, "an integer >= 1", n));
    GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "max_completion_tokens", 1, kIntMax,
                                      "an integer >= 1", max_completion_tokens));
    if (max_completion_tokens) n = max_completion_tokens;
    if (n) out.max_tokens = static_cast<int>(*n);
  } else {
    GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "max_tokens", 1, kIntMax, "an integer >= 1", n));
    if (n) {
      out.max_tokens = static_cast<int>(*n);
    } else if (!body.contains("max_tokens")) {
      out.max_tokens = 16;  // OpenAI's and vLLM's default for /v1/completions
    }
  }
  GLM_OPENAI_RETURN_IF_ERROR(GetNumber(body, "temperature", 0.0, false, 2.0,
                                       "a number between 0 and 2", out.temperature,
                                       &out.temperature_set));
  GLM_OPENAI_RETURN_IF_ERROR(GetNumber(body, "top_p", 0.0, true, 1.0,
                                       "a number in (0, 1]", out.top_p, &out.top_p_set));
  GLM_OPENAI_RETURN_IF_ERROR(GetNumber(body, "min_p", 0.0, false, 1.0, "a number in [0, 1]",
                                       out.min_p));
  std::optional<int64_t> top_k;
  GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "top_k", -1, kIntMax,
                                    "an integer >= 0 (0 or -1 turn it off)", top_k));
  if (top_k) {
    out.top_k = *top_k < 0 ? 0 : static_cast<int>(*top_k);
    out.top_k_set = true;
  }
  if (const Json* seed = Find(body, "seed")) {
    if (seed->is_number_unsigned()) {
      out.seed = seed->get<uint64_t>();
    } else if (int64_t value = 0; IntegralNumber(*seed, value)) {
      out.seed = static_cast<uint64_t>(value);
    } else {
      return BadRequest("seed", Cat("seed must be an integer", Got(*seed)));
    }
  }
  GLM_OPENAI_RETURN_IF_ERROR(ParseStop(body, out));
  if (const Json* ids = Find(body, "stop_token_ids")) {
    if (!ids->is_array()) {
      return BadRequest("stop_token_ids",
                        Cat("stop_token_ids must be an array of token ids", Got(*ids)));
    }
    GLM_OPENAI_RETURN_IF_ERROR(TokenIds(*ids, "stop_token_ids", out.stop_token_ids));
  }
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "ignore_eos", out.ignore_eos));
  std::optional<int64_t> drafts;
  GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "mtp_draft_tokens", 0, 16,
                                    "an integer in [0, 16] (MTP drafts per step; 0 turns "
                                    "speculative decoding off for this request)",
                                    drafts));
  if (drafts) out.mtp_draft_tokens = static_cast<int>(*drafts);
  std::optional<int64_t> min_tokens;
  GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "min_tokens", 0, kIntMax, "an integer >= 0", min_tokens));
  if (min_tokens) {
    if (out.max_tokens && *min_tokens > *out.max_tokens) {
      return BadRequest("min_tokens", Cat("min_tokens must be at most max_tokens (",
                                                   *out.max_tokens, ")", Got(*Find(body, "min_tokens"))));
    }
    out.min_tokens = static_cast<int>(*min_tokens);
  }

  if (chat) {
    bool logprobs = false;
    GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "logprobs", logprobs));
    std::optional<int64_t> top;
    GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "top_logprobs", 0, kMaxLogprobs,
                                      "an integer between 0 and 20", top));
    if (top && !logprobs) {
      return BadRequest("top_logprobs", "top_logprobs needs logprobs: true");
    }
    if (logprobs) out.logprobs = static_cast<int>(top.value_or(0));
  } else {
    std::optional<int64_t> logprobs;
    GLM_OPENAI_RETURN_IF_ERROR(GetInt(body, "logprobs", 0, kMaxLogprobs,
                                      "an integer between 0 and 20", logprobs));
    if (logprobs) out.logprobs = static_cast<int>(*logprobs);
  }

  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "stream", out.stream));
  if (const Json* options = Find(body, "stream_options")) {
    if (!out.stream) {
      return BadRequest("stream_options", "stream_options is only allowed when stream is true");
    }
    if (!options->is_object()) {
      return BadRequest("stream_options",
                        Cat("stream_options must be an object such as "
                                     "{\"include_usage\": true}", Got(*options)));
    }
    out.include_usage = true;  // vLLM's default once stream_options is sent
    if (const Json* usage = Find(*options, "include_usage")) {
      if (!usage->is_boolean()) {
        return BadRequest("stream_options.include_usage",
                          Cat("stream_options.include_usage must be true or false",
                                       Got(*usage)));
      }
      out.include_usage = usage->get<bool>();
    }
  }

  GLM_OPENAI_RETURN_IF_ERROR(OnlyOne(body, "n"));
  GLM_OPENAI_RETURN_IF_ERROR(OnlyOne(body, "best_of"));
  GLM_OPENAI_RETURN_IF_ERROR(NeutralNumber(body, "presence_penalty", 0.0));
  GLM_OPENAI_RETURN_IF_ERROR(NeutralNumber(body, "frequency_penalty", 0.0));
  GLM_OPENAI_RETURN_IF_ERROR(NeutralNumber(body, "repetition_penalty", 1.0));
  if (const Json* bias = Find(body, "logit_bias")) {
    if (!bias->is_object()) {
      return BadRequest("logit_bias",
                        Cat("logit_bias must be an object of token id → bias", Got(*bias)));
    }
    if (!bias->empty()) {
      return BadRequest("logit_bias", "logit_bias is not supported yet; send {} or leave it out");
    }
  }
  if (const Json* format = Find(body, "response_format")) {
    const Json* type = format->is_object() ? Find(*format, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return BadRequest("response_format",
                        Cat("response_format must be an object with a type",
                                     Got(*format)));
    }
    if (*type != "text") {
      return BadRequest("response_format",
                        Cat("response_format type ", type->get<std::string>(),
                                     " is not supported yet; only {\"type\": \"text\"}"));
    }
  }
  for (std::string_view key : {"prompt_logprobs", "guided_json", "guided_regex", "guided_choice",
                               "guided_grammar", "structured_outputs", "logits_processors"}) {
    GLM_OPENAI_RETURN_IF_ERROR(Unsupported(body, key, " by this server; leave it out"));
  }
  return std::nullopt;
}

MaybeError ParseModel(const Json& body, std::string& model) {
  return GetString(body, "model", model, "model");
}

// An assistant message's tool_calls[j].function.arguments: a JSON string becomes the object it
// encodes (the GLM template iterates a mapping and drops a string).
MaybeError NormalizeArguments(Json& function, const std::string& param) {
  auto it = function.find("arguments");
  if (it == function.end() || it->is_null()) {
    function["arguments"] = Json::object();
    return std::nullopt;
  }
  if (it->is_object()) return std::nullopt;
  if (!it->is_string()) {
    return BadRequest(param, Cat(param, " must be a JSON string or an object",
                                          Got(*it)));
  }
  const std::string& text = it->get_ref<const std::string&>();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    *it = Json::object();
    return std::nullopt;
  }
  MaybeError shape = CheckShape(text);
  Json parsed = shape ? Json(nullptr)
                      : Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (shape || parsed.is_discarded()) {
    return BadRequest(param, Cat(param, " is not valid JSON; send a JSON object encoded "
                                                 "as a string, e.g. \"{\\\"city\\\": \\\"Paris\\\"}\"",
                                          Got(*it)));
  }
  if (!parsed.is_object()) {
    return BadRequest(param, Cat(param, " must encode a JSON object, not ",
                                          TypeName(parsed), Got(*it)));
  }
  *it = std::move(parsed);
  return std::nullopt;
}

MaybeError ValidateContent(const Json& message, const std::string& prefix,
                           const std::string& role) {
  const Json* content = Find(message, "content");
  std::string param = prefix + ".content";
  if (content == nullptr) {
    if (role == "assistant") return std::nullopt;
    return BadRequest(param, Cat(param, " is required for a ", role,
                                          " message: a string or an array of text parts"));
  }
  if (content->is_string()) return std::nullopt;
  if (!content->is_array()) {
    return BadRequest(param, Cat(param,
                                          " must be a string or an array of text parts "
                                          "({\"type\": \"text\", \"text\": ...})",
                                          Got(*content)));
  }
  for (size_t j = 0; j < content->size(); ++j) {
    const Json& part = (*content)[j];
    std::string part_param = Cat(param, "[", j, "]");
    if (!part.is_object()) {
      return BadRequest(part_param, Cat(part_param, " must be an object ",
                                                 "{\"type\": \"text\", \"text\": ...}", Got(part)));
    }
    const Json* type = Find(part, "type");
    if (type != nullptr && *type != "text") {
      return BadRequest(part_param + ".type",
                        Cat(part_param, ".type: only text parts are supported",
                                     Got(*type)));
    }
    const Json* text = Find(part, "text");
    if (text == nullptr || !text->is_string()) {
      return BadRequest(part_param + ".text",
                        Cat(part_param, ".text must be a string",
                                     text ? Got(*text) : std::string()));
    }
  }
  return std::nullopt;
}

MaybeError ValidateToolCalls(Json& message, const std::string& prefix) {
  auto it = message.find("tool_calls");
  if (it == message.end() || it->is_null()) return std::nullopt;
  std::string param = prefix + ".tool_calls";
  if (!it->is_array()) {
    return BadRequest(param, Cat(param, " must be an array", Got(*it)));
  }
  for (size_t j = 0; j < it->size(); ++j) {
    Json& call = (*it)[j];
    std::string call_param = Cat(param, "[", j, "]");
    if (!call.is_object()) {
      return BadRequest(call_param, Cat(call_param, " must be an object ",
                                                 "{\"id\", \"type\": \"function\", \"function\"}",
                                                 Got(call)));
    }
    if (const Json* type = Find(call, "type"); type != nullptr && *type != "function") {
      return BadRequest(call_param + ".type",
                        Cat(call_param, ".type must be \"function\"", Got(*type)));
    }
    std::string id;
    GLM_OPENAI_RETURN_IF_ERROR(GetString(call, "id", id, call_param + ".id"));
    auto function = call.find("function");
    if (function == call.end() || !function->is_object()) {
      return BadRequest(call_param + ".function",
                        Cat(call_param, ".function must be an object {\"name\", ",
                                     "\"arguments\"}"));
    }
    const Json* name = Find(*function, "name");
    if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      return BadRequest(call_param + ".function.name",
                        Cat(call_param, ".function.name must be a non-empty string"));
    }
    GLM_OPENAI_RETURN_IF_ERROR(NormalizeArguments(*function, call_param + ".function.arguments"));
  }
  return std::nullopt;
}

// Validates `messages` in place (see ChatRequest::messages).
MaybeError ValidateMessages(const Json& body, Json& messages) {
  const Json* value = Find(body, "messages");
  if (value == nullptr || !value->is_array() || value->empty()) {
    return BadRequest("messages",
                      Cat("messages must be a non-empty array of {\"role\", \"content\"}",
                                   value ? Got(*value) : std::string(" (missing)")));
  }
  messages = *value;
  for (size_t i = 0; i < messages.size(); ++i) {
    Json& message = messages[i];
    std::string prefix = Cat("messages[", i, "]");
    if (!message.is_object()) {
      return BadRequest(prefix, Cat(prefix, " must be an object {\"role\", \"content\"}",
                                             Got(message)));
    }
    const Json* role = Find(message, "role");
    static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant",
                                                  "tool"};
    bool known = false;
    if (role != nullptr && role->is_string()) {
      for (std::string_view r : kRoles) known = known || *role == r;
    }
    if (!known) {
      return BadRequest(prefix + ".role",
                        Cat(prefix, ".role must be one of system, developer, user, "
                                             "assistant, tool",
                                     role ? Got(*role) : std::string(" (missing)")));
    }
    std::string role_name = role->get<std::string>();
    GLM_OPENAI_RETURN_IF_ERROR(ValidateContent(message, prefix, role_name));
    std::string text;
    GLM_OPENAI_RETURN_IF_ERROR(GetString(message, "name", text, prefix + ".name"));
    if (role_name == "tool") {
      GLM_OPENAI_RETURN_IF_ERROR(GetString(message, "tool_call_id", text, prefix + ".tool_call_id"));
    }
    if (role_name == "assistant") {
      GLM_OPENAI_RETURN_IF_ERROR(ValidateToolCalls(message, prefix));
      std::string reasoning;
      GLM_OPENAI_RETURN_IF_ERROR(GetString(message, "reasoning", reasoning, prefix + ".reasoning"));
      GLM_OPENAI_RETURN_IF_ERROR(GetString(message, "reasoning_content", text,
                                           prefix + ".reasoning_content"));
      if (Find(message, "reasoning") != nullptr && Find(message, "reasoning_content") == nullptr) {
        message["reasoning_content"] = reasoning;
      }
    }
  }
  return std::nullopt;
}

MaybeError ValidateTools(const Json& body, Json& tools) {
  const Json* value = Find(body, "tools");
  tools = nullptr;
  if (value == nullptr) return std::nullopt;
  if (!value->is_array()) {
    return BadRequest("tools", Cat("tools must be an array of {\"type\": \"function\", "
                                            "\"function\": {\"name\", \"description\", "
                                            "\"parameters\"}}",
                                            Got(*value)));
  }
  for (size_t i = 0; i < value->size(); ++i) {
    const Json& tool = (*value)[i];
    std::string param = Cat("tools[", i, "]");
    if (!tool.is_object()) {
      return BadRequest(param, Cat(param, " must be an object {\"type\": \"function\", "
                                                   "\"function\": {...}}",
                                            Got(tool)));
    }
    if (const Json* type = Find(tool, "type"); type != nullptr && *type != "function") {
      return BadRequest(param + ".type",
                        Cat(param, ".type must be \"function\"", Got(*type)));
    }
    const Json* function = Find(tool, "function");
    if (function == nullptr || !function->is_object()) {
      return BadRequest(param + ".function",
                        Cat(param, ".function must be an object {\"name\", "
                                            "\"description\", \"parameters\"}"));
    }
    const Json* name = Find(*function, "name");
    if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      return BadRequest(param + ".function.name",
                        Cat(param, ".function.name must be a non-empty string"));
    }
    std::string description;
    GLM_OPENAI_RETURN_IF_ERROR(
        GetString(*function, "description", description, param + ".function.description"));
    if (const Json* parameters = Find(*function, "parameters");
        parameters != nullptr && !parameters->is_object()) {
      return BadRequest(param + ".function.parameters",
                        Cat(param, ".function.parameters must be a JSON Schema object",
                                     Got(*parameters)));
    }
  }
  tools = *value;
  return std::nullopt;
}

bool HasTool(const Json& tools, const std::string& name) {
  if (!tools.is_array()) return false;
  for (const Json& tool : tools) {
    const Json* function = Find(tool, "function");
    const Json* tool_name = function != nullptr ? Find(*function, "name") : nullptr;
    if (tool_name != nullptr && *tool_name == name) return true;
  }
  return false;
}

MaybeError ParseToolChoice(const Json& body, ChatRequest& out) {
  const Json* choice = Find(body, "tool_choice");
  if (choice == nullptr) return std::nullopt;
  bool has_tools = out.tools.is_array() && !out.tools.empty();
  if (choice->is_string()) {
    const std::string& text = choice->get_ref<const std::string&>();
    if (text != "none" && text != "auto" && text != "required") {
      return BadRequest("tool_choice",
                        Cat("tool_choice must be \"none\", \"auto\", \"required\" or "
                                     "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                                     Got(*choice)));
    }
    if (text == "required" && !has_tools) {
      return BadRequest("tool_choice", "tool_choice \"required\" needs a non-empty tools array");
    }
    out.tool_choice = text;
    return std::nullopt;
  }
  const Json* function = choice->is_object() ? Find(*choice, "function") : nullptr;
  const Json* name = function != nullptr && function->is_object() ? Find(*function, "name") : nullptr;
  if (name == nullptr || !name->is_string()) {
    return BadRequest("tool_choice",
                      Cat("tool_choice must be \"none\", \"auto\", \"required\" or "
                                   "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                                   Got(*choice)));
  }
  if (!HasTool(out.tools, name->get<std::string>())) {
    return BadRequest("tool_choice",
                      Cat("tool_choice names function ", name->dump(),
                                   ", which is not in tools"));
  }
  out.tool_choice = "named";
  out.tool_choice_name = name->get<std::string>();
  out.tool_choice_json = *choice;
  return std::nullopt;
}

void SetIfAbsent(Json& object, const char* key, Json value) {
  if (!object.contains(key)) object[key] = std::move(value);
}

// chat_template_kwargs plus the thinking shortcuts clients send (spec §2.5).
MaybeError ParseTemplateKwargs(const Json& body, Json& kwargs) {
  kwargs = Json::object();
  if (const Json* value = Find(body, "chat_template_kwargs")) {
    if (!value->is_object()) {
      return BadRequest("chat_template_kwargs",
                        Cat("chat_template_kwargs must be an object such as "
                                     "{\"enable_thinking\": false}",
                                     Got(*value)));
    }
    kwargs = *value;
  }
  if (const Json* thinking = Find(kwargs, "thinking"); thinking != nullptr && thinking->is_boolean()) {
    SetIfAbsent(kwargs, "enable_thinking", *thinking);
  }
  if (const Json* thinking = Find(body, "thinking")) {
    if (thinking->is_boolean()) {
      SetIfAbsent(kwargs, "enable_thinking", *thinking);
    } else if (thinking->is_object()) {
      const Json* type = Find(*thinking, "type");
      if (type == nullptr || (*type != "enabled" && *type != "disabled")) {
        return BadRequest("thinking.type",
                          Cat("thinking.type must be \"enabled\" or \"disabled\"",
                                       type ? Got(*type) : std::string(" (missing)")));
      }
      SetIfAbsent(kwargs, "enable_thinking", *type == "enabled");
      if (const Json* clear = Find(*thinking, "clear_thinking")) {
        if (!clear->is_boolean()) {
          return BadRequest("thinking.clear_thinking",
                            Cat("thinking.clear_thinking must be true or false",
                                         Got(*clear)));
        }
        SetIfAbsent(kwargs, "clear_thinking", *clear);
      }
    } else {
      return BadRequest("thinking", Cat("thinking must be {\"type\": \"enabled\" | "
                                                 "\"disabled\"} or a boolean",
                                                 Got(*thinking)));
    }
  }
  bool clear = false;
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "clear_thinking", clear));
  if (Find(body, "clear_thinking") != nullptr) SetIfAbsent(kwargs, "clear_thinking", clear);
  if (const Json* effort = Find(body, "reasoning_effort")) {
    static constexpr std::string_view kEfforts[] = {"none", "minimal", "low", "medium",
                                                    "high", "xhigh", "max"};
    bool known = false;
    if (effort->is_string()) {
      for (std::string_view e : kEfforts) known = known || *effort == e;
    }
    if (!known) {
      return BadRequest("reasoning_effort",
                        Cat("reasoning_effort must be one of none, minimal, low, medium, "
                                     "high, xhigh, max",
                                     Got(*effort)));
    }
    SetIfAbsent(kwargs, "reasoning_effort", *effort);
    if (*effort == "none") SetIfAbsent(kwargs, "enable_thinking", false);
  }
  return std::nullopt;
}

MaybeError ParsePromptFlags(const Json& body, const Json& messages, bool& add_generation_prompt,
                            bool& continue_final_message) {
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "add_generation_prompt", add_generation_prompt));
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "continue_final_message", continue_final_message));
  if (continue_final_message && add_generation_prompt) {
    return BadRequest("continue_final_message",
                      "continue_final_message and add_generation_prompt cannot both be true; "
                      "send add_generation_prompt: false to continue the final message");
  }
  if (continue_final_message && messages.back().value("role", "") != "assistant") {
    return BadRequest("continue_final_message",
                      "continue_final_message needs the last message to be an assistant message");
  }
  return std::nullopt;
}

Result<ChatRequest> ParseChatObject(const Json& body) {
  ChatRequest out;
  GLM_OPENAI_RETURN_IF_ERROR(ParseModel(body, out.model));
  GLM_OPENAI_RETURN_IF_ERROR(ValidateMessages(body, out.messages));
  GLM_OPENAI_RETURN_IF_ERROR(ValidateTools(body, out.tools));
  GLM_OPENAI_RETURN_IF_ERROR(ParseToolChoice(body, out));
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "parallel_tool_calls", out.parallel_tool_calls));
  GLM_OPENAI_RETURN_IF_ERROR(ParseTemplateKwargs(body, out.chat_template_kwargs));
  GLM_OPENAI_RETURN_IF_ERROR(ParsePromptFlags(body, out.messages, out.add_generation_prompt,
                                              out.continue_final_message));
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "echo", out.echo));
  GLM_OPENAI_RETURN_IF_ERROR(Unsupported(body, "chat_template",
                                         ": per-request templates are not accepted; the served "
                                         "checkpoint's template is used"));
  GLM_OPENAI_RETURN_IF_ERROR(ParseSampling(body, /*chat=*/true, out.sampling));
  return out;
}

Result<CompletionRequest> ParseCompletionObject(const Json& body) {
  CompletionRequest out;
  GLM_OPENAI_RETURN_IF_ERROR(ParseModel(body, out.model));
  constexpr std::string_view kAccepted =
      "a non-empty string, an array of token ids, or an array holding one of those";
  const Json* prompt = Find(body, "prompt");
  if (prompt == nullptr) {
    return BadRequest("prompt", Cat("prompt is required: ", kAccepted));
  }
  const Json* single = prompt;
  if (prompt->is_array() && !prompt->empty() && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    if (prompt->size() > 1) {
      return BadRequest("prompt", "batched prompts are not supported; send one prompt per request");
    }
    single = &(*prompt)[0];
  }
  if (single->is_string()) {
    if (single->get_ref<const std::string&>().empty()) {
      return BadRequest("prompt", Cat("prompt must not be empty: ", kAccepted));
    }
    out.prompt = single->get<std::string>();
  } else if (single->is_array()) {
    if (single->empty()) {
      return BadRequest("prompt", Cat("prompt must not be empty: ", kAccepted));
    }
    std::vector<int32_t> ids;
    GLM_OPENAI_RETURN_IF_ERROR(TokenIds(*single, "prompt", ids));
    out.prompt = std::move(ids);
  } else {
    return BadRequest("prompt", Cat("prompt must be ", kAccepted, Got(*prompt)));
  }
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "echo", out.echo));
  if (const Json* suffix = Find(body, "suffix")) {
    if (!suffix->is_string() || !suffix->get_ref<const std::string&>().empty()) {
      return BadRequest("suffix", "suffix is not supported; leave it out");
    }
  }
  GLM_OPENAI_RETURN_IF_ERROR(ParseSampling(body, /*chat=*/false, out.sampling));
  return out;
}

Result<TokenizeRequest> ParseTokenizeObject(const Json& body) {
  TokenizeRequest out;
  GLM_OPENAI_RETURN_IF_ERROR(ParseModel(body, out.model));
  const Json* prompt = Find(body, "prompt");
  const Json* messages = Find(body, "messages");
  if ((prompt == nullptr) == (messages == nullptr)) {
    return BadRequest(prompt ? "messages" : "prompt",
                      "send exactly one of prompt (a string) and messages (a chat)");
  }
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "return_token_strs", out.return_token_strs));
  if (prompt != nullptr) {
    if (!prompt->is_string()) {
      return BadRequest("prompt", Cat("prompt must be a string", Got(*prompt)));
    }
    out.prompt = prompt->get<std::string>();
    out.add_special_tokens = true;
    GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "add_special_tokens", out.add_special_tokens));
    return out;
  }
  GLM_OPENAI_RETURN_IF_ERROR(ValidateMessages(body, out.messages));
  GLM_OPENAI_RETURN_IF_ERROR(ValidateTools(body, out.tools));
  GLM_OPENAI_RETURN_IF_ERROR(ParseTemplateKwargs(body, out.chat_template_kwargs));
  GLM_OPENAI_RETURN_IF_ERROR(ParsePromptFlags(body, out.messages, out.add_generation_prompt,
                                              out.continue_final_message));
  out.add_special_tokens = false;
  GLM_OPENAI_RETURN_IF_ERROR(GetBool(body, "add_special_tokens", out.add_special_tokens));
  return out;
}

Result<DetokenizeRequest> ParseDetokenizeObject(const Json& body) {
  DetokenizeRequest out;
  GLM_OPENAI_RETURN_IF_ERROR(ParseModel(body, out.model));
  const Json* tokens = Find(body, "tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return BadRequest("tokens", Cat("tokens must be an array of token ids",
                                             tokens ? Got(*tokens) : std::string(" (missing)")));
  }
  GLM_OPENAI_RETURN_IF_ERROR(TokenIds(*tokens, "tokens", out.tokens));
  return out;
}

template <typename T>
Result<T> ParseWith(std::string_view body, Result<T> (*parse)(const Json&)) {
  Result<Json> json = ParseBody(body);
  if (!json.ok()) return json.error();
  return parse(json.value());
}

#undef GLM_OPENAI_RETURN_IF_ERROR

}  // namespace

bool ChatRequest::thinking_enabled() const {
  if (!chat_template_kwargs.is_object()) return true;
  auto it = chat_template_kwargs.find("enable_thinking");
  return it == chat_template_kwargs.end() || !(it->is_boolean() && !it->get<bool>());
}

bool ChatRequest::tools_enabled() const {
  return tools.is_array() && !tools.empty() && tool_choice != "none";
}

Result<ChatRequest> ParseChatRequest(std::string_view body) {
  return ParseWith<ChatRequest>(body, &ParseChatObject);
}
Result<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  return ParseWith<CompletionRequest>(body, &ParseCompletionObject);
}
Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  return ParseWith<TokenizeRequest>(body, &ParseTokenizeObject);
}
Result<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body) {
  return ParseWith<DetokenizeRequest>(body, &ParseDetokenizeObject);
}

}  // namespace glm::openai
