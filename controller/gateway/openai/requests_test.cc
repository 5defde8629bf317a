#include "controller/gateway/openai/requests.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kMessages = R"("messages": [{"role": "user", "content": "Hi"}])";

// A chat body: the base messages plus `extra` members ("" for none).
std::string Chat(std::string_view extra) {
  std::string body = "{";
  body += kMessages;
  if (!extra.empty()) {
    body += ", ";
    body += extra;
  }
  body += "}";
  return body;
}

ChatRequest ParseChatOk(const std::string& body) {
  Result<ChatRequest> result = ParseChatRequest(body);
  EXPECT_TRUE(result.ok()) << body << " -> " << (result.ok() ? "" : result.error().message);
  return result.ok() ? std::move(result).value() : ChatRequest{};
}

TEST(ChatRequestTest, Defaults) {
  ChatRequest request = ParseChatOk(Chat(""));
  EXPECT_EQ(request.model, "");
  EXPECT_EQ(request.messages.size(), 1u);
  EXPECT_TRUE(request.tools.is_null());
  EXPECT_EQ(request.tool_choice, "auto");
  EXPECT_TRUE(request.parallel_tool_calls);
  EXPECT_EQ(request.chat_template_kwargs, Json::object());
  EXPECT_TRUE(request.add_generation_prompt);
  EXPECT_FALSE(request.continue_final_message);
  EXPECT_FALSE(request.echo);
  EXPECT_TRUE(request.thinking_enabled());
  EXPECT_FALSE(request.tools_enabled());
  const SamplingOptions& s = request.sampling;
  EXPECT_FALSE(s.max_tokens.has_value());
  EXPECT_EQ(s.temperature, 1.0f);
  EXPECT_EQ(s.top_p, 1.0f);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_FALSE(s.temperature_set || s.top_p_set || s.top_k_set);
  EXPECT_FALSE(s.seed.has_value());
  EXPECT_TRUE(s.stop.empty());
  EXPECT_FALSE(s.logprobs.has_value());
  EXPECT_FALSE(s.stream);
  EXPECT_FALSE(s.include_usage);
}

TEST(ChatRequestTest, EverySamplingParameter) {
  ChatRequest request = ParseChatOk(Chat(R"(
    "model": "glm-5", "max_tokens": 100, "max_completion_tokens": 50, "temperature": 0.5,
    "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1234, "stop": ["END", "###"],
    "stop_token_ids": [7, 9], "ignore_eos": true, "min_tokens": 3, "logprobs": true,
    "top_logprobs": 5, "mtp_draft_tokens": 2, "stream": true, "stream_options": {"include_usage": true}, "n": 1,
    "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1,
    "logit_bias": {}, "response_format": {"type": "text"}, "user": "u1", "echo": true,
    "parallel_tool_calls": false, "add_generation_prompt": true)"));
  EXPECT_EQ(request.model, "glm-5");
  const SamplingOptions& s = request.sampling;
  EXPECT_EQ(s.max_tokens, 50);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_TRUE(s.temperature_set && s.top_p_set && s.top_k_set);
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"END", "###"}));
  EXPECT_EQ(s.stop_token_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.min_tokens, 3);
  EXPECT_EQ(s.logprobs, 5);
  EXPECT_EQ(s.mtp_draft_tokens, 2);
  EXPECT_TRUE(s.stream);
  EXPECT_TRUE(s.include_usage);
  EXPECT_TRUE(request.echo);
  EXPECT_FALSE(request.parallel_tool_calls);
}

TEST(ChatRequestTest, SmallerForms) {
  EXPECT_EQ(ParseChatOk(Chat(R"("max_tokens": 7)")).sampling.max_tokens, 7);
  EXPECT_EQ(ParseChatOk(Chat(R"("max_tokens": 7.0)")).sampling.max_tokens, 7);  // integral float
  EXPECT_EQ(ParseChatOk(Chat(R"("top_k": -1)")).sampling.top_k, 0);
  EXPECT_EQ(ParseChatOk(Chat(R"("seed": -1)")).sampling.seed, UINT64_MAX);
  EXPECT_EQ(ParseChatOk(Chat(R"("stop": "\n\n")")).sampling.stop,
            std::vector<std::string>{"\n\n"});
  EXPECT_EQ(ParseChatOk(Chat(R"("logprobs": true)")).sampling.logprobs, 0);
  EXPECT_FALSE(ParseChatOk(Chat(R"("logprobs": false)")).sampling.logprobs.has_value());
  // stream_options without include_usage: on (vLLM's default once stream_options is sent).
  EXPECT_TRUE(ParseChatOk(Chat(R"("stream": true, "stream_options": {})")).sampling.include_usage);
  EXPECT_FALSE(ParseChatOk(Chat(R"("stream": true, "stream_options": {"include_usage": false})"))
                   .sampling.include_usage);
  // null means absent everywhere.
  ChatRequest nulls = ParseChatOk(Chat(R"("max_tokens": null, "temperature": null, "stop": null,
      "tools": null, "tool_choice": null, "n": null, "stream_options": null, "seed": null)"));
  EXPECT_FALSE(nulls.sampling.max_tokens.has_value());
  EXPECT_FALSE(nulls.sampling.temperature_set);
  // Unknown fields are ignored.
  ParseChatOk(Chat(R"("some_future_field": {"x": [1, 2]}, "store": true, "metadata": {})"));
}

struct ErrorCase {
  std::string body;
  std::string param;
  std::string message_part;
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.body; }

class ChatRequestErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(ChatRequestErrorTest, RejectsWithTheParameterNamed) {
  const ErrorCase& c = GetParam();
  Result<ChatRequest> result = ParseChatRequest(c.body);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().status, 400);
  EXPECT_EQ(result.error().type, "BadRequestError");
  EXPECT_EQ(result.error().param, c.param);
  EXPECT_NE(result.error().message.find(c.message_part), std::string::npos)
      << result.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Sampling, ChatRequestErrorTest,
    testing::Values(
        ErrorCase{Chat(R"("n": 2)"), "n", "only n=1 is supported"},
        ErrorCase{Chat(R"("n": "1")"), "n", "only n=1"},
        ErrorCase{Chat(R"("best_of": 3)"), "best_of", "only best_of=1"},
        ErrorCase{Chat(R"("stream_options": {"include_usage": true})"), "stream_options",
                  "only allowed when stream is true"},
        ErrorCase{Chat(R"("stream": false, "stream_options": {})"), "stream_options", "stream"},
        ErrorCase{Chat(R"("stream": true, "stream_options": 1)"), "stream_options", "object"},
        ErrorCase{Chat(R"("stream": true, "stream_options": {"include_usage": 1})"),
                  "stream_options.include_usage", "true or false"},
        ErrorCase{Chat(R"("stream": "yes")"), "stream", "true or false"},
        ErrorCase{Chat(R"("max_tokens": 0)"), "max_tokens", ">= 1"},
        ErrorCase{Chat(R"("max_tokens": 1.5)"), "max_tokens", "integer"},
        ErrorCase{Chat(R"("max_completion_tokens": -3)"), "max_completion_tokens", ">= 1"},
        ErrorCase{Chat(R"("temperature": 2.5)"), "temperature", "between 0 and 2"},
        ErrorCase{Chat(R"("temperature": "hot")"), "temperature", "(got \"hot\")"},
        ErrorCase{Chat(R"("top_p": 0)"), "top_p", "(0, 1]"},
        ErrorCase{Chat(R"("top_p": 1.01)"), "top_p", "(0, 1]"},
        ErrorCase{Chat(R"("top_k": -2)"), "top_k", ">= 0"},
        ErrorCase{Chat(R"("min_p": 2)"), "min_p", "[0, 1]"},
        ErrorCase{Chat(R"("seed": "x")"), "seed", "integer"},
        ErrorCase{Chat(R"("stop": "")"), "stop", "non-empty"},
        ErrorCase{Chat(R"("stop": ["a", ""])"), "stop", "stop[1]"},
        ErrorCase{Chat(R"("stop": [1])"), "stop", "stop[0]"},
        ErrorCase{Chat(R"("stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14",
                                   "15","16","17"])"),
                  "stop", "up to 16"},
        ErrorCase{Chat(R"("stop_token_ids": [1, -1])"), "stop_token_ids", "stop_token_ids[1]"},
        ErrorCase{Chat(R"("stop_token_ids": 5)"), "stop_token_ids", "array"},
        ErrorCase{Chat(R"("ignore_eos": 1)"), "ignore_eos", "true or false"},
        ErrorCase{Chat(R"("min_tokens": -1)"), "min_tokens", ">= 0"},
        ErrorCase{Chat(R"("mtp_draft_tokens": 17)"), "mtp_draft_tokens", "[0, 16]"},
        ErrorCase{Chat(R"("mtp_draft_tokens": 1.5)"), "mtp_draft_tokens", "[0, 16]"},
        ErrorCase{Chat(R"("max_tokens": 5, "min_tokens": 6)"), "min_tokens", "at most max_tokens"},
        ErrorCase{Chat(R"("logprobs": 1)"), "logprobs", "true or false"},
        ErrorCase{Chat(R"("top_logprobs": 3)"), "top_logprobs", "logprobs: true"},
        ErrorCase{Chat(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs", "0 and 20"},
        ErrorCase{Chat(R"("presence_penalty": 0.5)"), "presence_penalty", "not supported yet"},
        ErrorCase{Chat(R"("frequency_penalty": -1)"), "frequency_penalty", "not supported yet"},
        ErrorCase{Chat(R"("repetition_penalty": 1.1)"), "repetition_penalty", "not supported yet"},
        ErrorCase{Chat(R"("presence_penalty": "x")"), "presence_penalty", "a number"},
        ErrorCase{Chat(R"("logit_bias": {"5": 10})"), "logit_bias", "not supported yet"},
        ErrorCase{Chat(R"("logit_bias": [1])"), "logit_bias", "object"},
        ErrorCase{Chat(R"("response_format": {"type": "json_object"})"), "response_format",
                  "json_object is not supported"},
        ErrorCase{Chat(R"("response_format": "json")"), "response_format", "object"},
        ErrorCase{Chat(R"("guided_json": {"type": "object"})"), "guided_json", "not supported"},
        ErrorCase{Chat(R"("chat_template": "{{ x }}")"), "chat_template", "not accepted"},
        ErrorCase{Chat(R"("model": 5)"), "model", "string"}));

INSTANTIATE_TEST_SUITE_P(
    Messages, ChatRequestErrorTest,
    testing::Values(
        ErrorCase{"{}", "messages", "non-empty array"},
        ErrorCase{R"({"messages": []})", "messages", "non-empty array"},
        ErrorCase{R"({"messages": "hi"})", "messages", "non-empty array"},
        ErrorCase{R"({"messages": [5]})", "messages[0]", "object"},
        ErrorCase{R"({"messages": [{"content": "x"}]})", "messages[0].role", "(missing)"},
        ErrorCase{R"({"messages": [{"role": "bot", "content": "x"}]})", "messages[0].role",
                  "system, developer, user, assistant, tool"},
        ErrorCase{R"({"messages": [{"role": "user"}]})", "messages[0].content", "required"},
        ErrorCase{R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
                  "string or an array of text parts"},
        ErrorCase{R"({"messages": [{"role": "user", "content": [{"type": "image_url",
                    "image_url": {"url": "x"}}]}]})",
                  "messages[0].content[0].type", "only text parts"},
        ErrorCase{R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
                  "messages[0].content[0].text", "string"},
        ErrorCase{R"({"messages": [{"role": "user", "content": "x", "name": 1}]})",
                  "messages[0].name", "string"},
        ErrorCase{R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": 3}]})",
                  "messages[0].tool_call_id", "string"},
        ErrorCase{R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant",
                    "tool_calls": [{"type": "function", "function": {"name": "f",
                    "arguments": "{bad json"}}]}]})",
                  "messages[1].tool_calls[0].function.arguments", "not valid JSON"},
        ErrorCase{R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                    "arguments": "[1, 2]"}}]}]})",
                  "messages[0].tool_calls[0].function.arguments", "JSON object"},
        ErrorCase{R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                    "arguments": 5}}]}]})",
                  "messages[0].tool_calls[0].function.arguments", "string or an object"},
        ErrorCase{R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {
                    "arguments": "{}"}}]}]})",
                  "messages[0].tool_calls[0].function.name", "non-empty string"},
        ErrorCase{R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "web"}]}]})",
                  "messages[0].tool_calls[0].type", "\"function\""},
        ErrorCase{R"({"messages": [{"role": "assistant", "tool_calls": {}}]})",
                  "messages[0].tool_calls", "array"},
        ErrorCase{R"({"messages": [{"role": "assistant", "content": "x", "reasoning": 1}]})",
                  "messages[0].reasoning", "string"}));

INSTANTIATE_TEST_SUITE_P(
    ToolsAndTemplate, ChatRequestErrorTest,
    testing::Values(
        ErrorCase{Chat(R"("tools": {})"), "tools", "array"},
        ErrorCase{Chat(R"("tools": [1])"), "tools[0]", "object"},
        ErrorCase{Chat(R"("tools": [{"type": "retrieval"}])"), "tools[0].type", "\"function\""},
        ErrorCase{Chat(R"("tools": [{"type": "function"}])"), "tools[0].function", "object"},
        ErrorCase{Chat(R"("tools": [{"type": "function", "function": {"name": ""}}])"),
                  "tools[0].function.name", "non-empty"},
        ErrorCase{Chat(R"("tools": [{"type": "function", "function": {"name": "f",
                    "parameters": []}}])"),
                  "tools[0].function.parameters", "JSON Schema object"},
        ErrorCase{Chat(R"("tools": [{"type": "function", "function": {"name": "f",
                    "description": 3}}])"),
                  "tools[0].function.description", "string"},
        ErrorCase{Chat(R"("tool_choice": "required")"), "tool_choice", "needs a non-empty tools"},
        ErrorCase{Chat(R"("tool_choice": "sometimes")"), "tool_choice", "\"required\""},
        ErrorCase{Chat(R"("tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "function", "function": {"name": "g"}})"),
                  "tool_choice", "not in tools"},
        ErrorCase{Chat(R"("tool_choice": {"type": "function"})"), "tool_choice", "\"auto\""},
        ErrorCase{Chat(R"("parallel_tool_calls": "no")"), "parallel_tool_calls", "true or false"},
        ErrorCase{Chat(R"("chat_template_kwargs": [])"), "chat_template_kwargs", "object"},
        ErrorCase{Chat(R"("reasoning_effort": "extreme")"), "reasoning_effort", "one of none"},
        ErrorCase{Chat(R"("thinking": {"type": "maybe"})"), "thinking.type", "enabled"},
        ErrorCase{Chat(R"("thinking": "on")"), "thinking", "boolean"},
        ErrorCase{Chat(R"("thinking": {"type": "enabled", "clear_thinking": 1})"),
                  "thinking.clear_thinking", "true or false"},
        ErrorCase{Chat(R"("clear_thinking": "yes")"), "clear_thinking", "true or false"},
        ErrorCase{Chat(R"("continue_final_message": true)"), "continue_final_message",
                  "cannot both be true"},
        ErrorCase{Chat(R"("continue_final_message": true, "add_generation_prompt": false)"),
                  "continue_final_message", "last message to be an assistant"},
        ErrorCase{Chat(R"("echo": "x")"), "echo", "true or false"}));

INSTANTIATE_TEST_SUITE_P(
    Body, ChatRequestErrorTest,
    testing::Values(ErrorCase{"", "", "not valid JSON"},
                    ErrorCase{R"({"messages": [)", "", "(byte "},
                    ErrorCase{"[1, 2]", "", "must be a JSON object, not an array"},
                    ErrorCase{R"({"max_tokens": 1e999})", "", "number overflow"},
                    ErrorCase{"\"text\"", "", "not a string"},
                    ErrorCase{std::string(200, '[') + std::string(200, ']'), "", "deeper than"}));

TEST(ChatRequestTest, ToolCallArgumentStringsBecomeObjects) {
  ChatRequest request = ParseChatOk(R"({"messages": [
      {"role": "user", "content": "Paris?"},
      {"role": "assistant", "content": null, "reasoning": "Need tool.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
        {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": ""}},
        {"id": "call_3", "type": "function", "function": {"name": "noop"}},
        {"id": "call_4", "type": "function", "function": {"name": "obj", "arguments": {"a": 1}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]})");
  const Json& calls = request.messages[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"], Json::parse(R"({"city": "Paris", "days": 2})"));
  EXPECT_TRUE(calls[0]["function"]["arguments"].is_object());
  // Key order of the client's JSON is kept (the template renders in insertion order).
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"city":"Paris","days":2})");
  EXPECT_EQ(calls[1]["function"]["arguments"], Json::object());
  EXPECT_EQ(calls[2]["function"]["arguments"], Json::object());
  EXPECT_EQ(calls[3]["function"]["arguments"], Json::parse(R"({"a": 1})"));
  // `reasoning` (vLLM's outbound name) is copied to the template's reasoning_content.
  EXPECT_EQ(request.messages[1]["reasoning_content"], "Need tool.");
}

TEST(ChatRequestTest, ContentPartsAndRoles) {
  ChatRequest request = ParseChatOk(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "developer", "content": [{"type": "text", "text": "Dev."}]},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null},
      {"role": "tool", "content": "r"}]})");
  EXPECT_EQ(request.messages.size(), 5u);
  EXPECT_EQ(request.messages[2]["content"][1]["text"], "b");
}

TEST(ChatRequestTest, ToolsAndToolChoice) {
  std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city":
      {"type": "string"}}}, "strict": true}}])";
  ChatRequest automatic = ParseChatOk(Chat(tools));
  EXPECT_TRUE(automatic.tools_enabled());
  EXPECT_EQ(automatic.tools[0]["function"]["strict"], true);  // extra keys kept
  ChatRequest none = ParseChatOk(Chat(tools + R"(, "tool_choice": "none")"));
  EXPECT_EQ(none.tool_choice, "none");
  EXPECT_FALSE(none.tools_enabled());
  EXPECT_EQ(ParseChatOk(Chat(tools + R"(, "tool_choice": "required")")).tool_choice, "required");
  ChatRequest named = ParseChatOk(
      Chat(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(named.tool_choice, "named");
  EXPECT_EQ(named.tool_choice_name, "get_weather");
  EXPECT_EQ(named.tool_choice_json["function"]["name"], "get_weather");
  EXPECT_FALSE(ParseChatOk(Chat(R"("tools": [])")).tools_enabled());
}

TEST(ChatRequestTest, ThinkingShortcutsFoldIntoTemplateKwargs) {
  auto kwargs = [](std::string_view extra) {
    return ParseChatOk(Chat(extra)).chat_template_kwargs;
  };
  EXPECT_EQ(kwargs(R"("chat_template_kwargs": {"enable_thinking": false})"),
            Json::parse(R"({"enable_thinking": false})"));
  EXPECT_EQ(kwargs(R"("chat_template_kwargs": {"thinking": false})"),
            Json::parse(R"({"thinking": false, "enable_thinking": false})"));
  EXPECT_EQ(kwargs(R"("thinking": {"type": "disabled"})"),
            Json::parse(R"({"enable_thinking": false})"));
  EXPECT_EQ(kwargs(R"("thinking": {"type": "enabled", "clear_thinking": false})"),
            Json::parse(R"({"enable_thinking": true, "clear_thinking": false})"));
  EXPECT_EQ(kwargs(R"("thinking": true, "clear_thinking": true)"),
            Json::parse(R"({"enable_thinking": true, "clear_thinking": true})"));
  EXPECT_EQ(kwargs(R"("reasoning_effort": "high")"), Json::parse(R"({"reasoning_effort": "high"})"));
  EXPECT_EQ(kwargs(R"("reasoning_effort": "none")"),
            Json::parse(R"({"reasoning_effort": "none", "enable_thinking": false})"));
  // The client's own kwargs win over every shortcut.
  EXPECT_EQ(kwargs(R"("chat_template_kwargs": {"enable_thinking": true, "reasoning_effort": "max"},
                     "thinking": {"type": "disabled"}, "reasoning_effort": "none")"),
            Json::parse(R"({"enable_thinking": true, "reasoning_effort": "max"})"));
  EXPECT_FALSE(ParseChatOk(Chat(R"("thinking": {"type": "disabled"})")).thinking_enabled());
  EXPECT_TRUE(ParseChatOk(Chat(R"("reasoning_effort": "high")")).thinking_enabled());
}

TEST(ChatRequestTest, ContinueFinalMessage) {
  ChatRequest request = ParseChatOk(R"({"messages": [{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hel"}], "continue_final_message": true,
      "add_generation_prompt": false})");
  EXPECT_TRUE(request.continue_final_message);
  EXPECT_FALSE(request.add_generation_prompt);
}

CompletionRequest ParseCompletionOk(const std::string& body) {
  Result<CompletionRequest> result = ParseCompletionRequest(body);
  EXPECT_TRUE(result.ok()) << body << " -> " << (result.ok() ? "" : result.error().message);
  return result.ok() ? std::move(result).value() : CompletionRequest{};
}

TEST(CompletionRequestTest, PromptForms) {
  EXPECT_EQ(std::get<std::string>(ParseCompletionOk(R"({"prompt": "Once"})").prompt), "Once");
  EXPECT_EQ(std::get<std::string>(ParseCompletionOk(R"({"prompt": ["Once"]})").prompt), "Once");
  EXPECT_EQ(std::get<std::vector<int32_t>>(ParseCompletionOk(R"({"prompt": [1, 2, 3]})").prompt),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(std::get<std::vector<int32_t>>(ParseCompletionOk(R"({"prompt": [[4, 5]]})").prompt),
            (std::vector<int32_t>{4, 5}));
}

TEST(CompletionRequestTest, ParametersAndDefaults) {
  CompletionRequest request = ParseCompletionOk(R"({"model": "m", "prompt": "x", "echo": true,
      "logprobs": 3, "suffix": "", "stream": true, "stream_options": {"include_usage": true},
      "temperature": 0, "stop": "\n"})");
  EXPECT_EQ(request.model, "m");
  EXPECT_TRUE(request.echo);
  EXPECT_EQ(request.sampling.logprobs, 3);
  EXPECT_EQ(request.sampling.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_TRUE(request.sampling.include_usage);
  EXPECT_EQ(request.sampling.temperature, 0.0f);
  EXPECT_FALSE(ParseCompletionOk(R"({"prompt": "x", "max_tokens": null})").sampling.max_tokens);
  EXPECT_EQ(ParseCompletionOk(R"({"prompt": "x", "max_tokens": 64})").sampling.max_tokens, 64);
}

class CompletionRequestErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(CompletionRequestErrorTest, RejectsWithTheParameterNamed) {
  const ErrorCase& c = GetParam();
  Result<CompletionRequest> result = ParseCompletionRequest(c.body);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().status, 400);
  EXPECT_EQ(result.error().param, c.param);
  EXPECT_NE(result.error().message.find(c.message_part), std::string::npos)
      << result.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    All, CompletionRequestErrorTest,
    testing::Values(
        ErrorCase{R"({})", "prompt", "required"},
        ErrorCase{R"({"prompt": ""})", "prompt", "not be empty"},
        ErrorCase{R"({"prompt": []})", "prompt", "not be empty"},
        ErrorCase{R"({"prompt": [[]]})", "prompt", "not be empty"},
        ErrorCase{R"({"prompt": ["a", "b"]})", "prompt", "batched prompts are not supported"},
        ErrorCase{R"({"prompt": [[1], [2]]})", "prompt", "batched prompts are not supported"},
        ErrorCase{R"({"prompt": [1, "a"]})", "prompt", "prompt[1]"},
        ErrorCase{R"({"prompt": [1, -5]})", "prompt", "token id"},
        ErrorCase{R"({"prompt": 5})", "prompt", "non-empty string"},
        ErrorCase{R"({"prompt": "x", "suffix": "end"})", "suffix", "not supported"},
        ErrorCase{R"({"prompt": "x", "logprobs": true})", "logprobs", "0 and 20"},
        ErrorCase{R"({"prompt": "x", "logprobs": 21})", "logprobs", "0 and 20"},
        ErrorCase{R"({"prompt": "x", "n": 2})", "n", "only n=1 is supported"},
        ErrorCase{R"({"prompt": "x", "best_of": 2})", "best_of", "only best_of=1"},
        ErrorCase{R"({"prompt": "x", "stream_options": {}})", "stream_options", "stream is true"},
        ErrorCase{R"({"prompt": "x", "echo": 1})", "echo", "true or false"},
        ErrorCase{R"({"prompt": "x", "max_tokens": 0})", "max_tokens", ">= 1"}));

TEST(TokenizeRequestTest, PromptAndChatForms) {
  Result<TokenizeRequest> prompt = ParseTokenizeRequest(R"({"model": "m", "prompt": "hi",
      "return_token_strs": true})");
  ASSERT_TRUE(prompt.ok());
  EXPECT_FALSE(prompt->is_chat());
  EXPECT_EQ(prompt->prompt, "hi");
  EXPECT_TRUE(prompt->add_special_tokens);
  EXPECT_TRUE(prompt->return_token_strs);

  Result<TokenizeRequest> chat = ParseTokenizeRequest(R"({"messages": [{"role": "user",
      "content": "hi"}], "add_generation_prompt": false, "chat_template_kwargs":
      {"enable_thinking": false}, "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  EXPECT_TRUE(chat->is_chat());
  EXPECT_FALSE(chat->add_special_tokens);
  EXPECT_FALSE(chat->add_generation_prompt);
  EXPECT_EQ(chat->chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(chat->tools.size(), 1u);

  Result<TokenizeRequest> both = ParseTokenizeRequest(R"({"prompt": "a", "messages": []})");
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.error().param, "messages");
  Result<TokenizeRequest> neither = ParseTokenizeRequest(R"({})");
  ASSERT_FALSE(neither.ok());
  EXPECT_EQ(neither.error().param, "prompt");
  Result<TokenizeRequest> bad_message = ParseTokenizeRequest(R"({"messages": [{"role": "x"}]})");
  ASSERT_FALSE(bad_message.ok());
  EXPECT_EQ(bad_message.error().param, "messages[0].role");
  Result<TokenizeRequest> bad_prompt = ParseTokenizeRequest(R"({"prompt": [1]})");
  ASSERT_FALSE(bad_prompt.ok());
  EXPECT_EQ(bad_prompt.error().param, "prompt");
}

TEST(DetokenizeRequestTest, TokensAreValidated) {
  Result<DetokenizeRequest> ok = ParseDetokenizeRequest(R"({"model": "m", "tokens": [1, 2]})");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(ok->model, "m");
  Result<DetokenizeRequest> missing = ParseDetokenizeRequest(R"({})");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().param, "tokens");
  Result<DetokenizeRequest> negative = ParseDetokenizeRequest(R"({"tokens": [3, -1]})");
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.error().param, "tokens");
  EXPECT_NE(negative.error().message.find("tokens[1]"), std::string::npos);
  Result<DetokenizeRequest> too_big = ParseDetokenizeRequest(R"({"tokens": [4294967296]})");
  ASSERT_FALSE(too_big.ok());
}

}  // namespace
}  // namespace glm::openai
