#include "controller/gateway/openai/responses.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;

const ResponseMeta kChatMeta{"chatcmpl-abc", 1700000000, "glm-5"};
const ResponseMeta kTextMeta{"cmpl-abc", 1700000000, "glm-5"};

TEST(ResponsesTest, ChatCompletionWithContentAndReasoning) {
  ChatChoice choice;
  choice.content = "4";
  choice.reasoning = "2+2";
  choice.finish_reason = "stop";
  EXPECT_EQ(DumpJson(ChatCompletionJson(kChatMeta, {choice}, Usage{10, 3})),
            R"({"id":"chatcmpl-abc","object":"chat.completion","created":1700000000,)"
            R"("model":"glm-5","choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":"4","reasoning":"2+2","reasoning_content":"2+2","tool_calls":[]},)"
            R"("logprobs":null,"finish_reason":"stop"}],)"
            R"("usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}})");
}

TEST(ResponsesTest, ChatCompletionFromParserWithToolCall) {
  ParserOptions options;
  options.tools = true;
  options.new_tool_call_id = [] { return std::string("chatcmpl-tool-1"); };
  OutputParser parser(options);
  parser.Feed("<tool_call>now</tool_call>");
  parser.Finish();
  ChatChoice choice = ChatChoiceFromParser(parser, "tool_calls");
  EXPECT_EQ(DumpJson(ChatCompletionJson(kChatMeta, {choice}, Usage{5, 4})),
            R"({"id":"chatcmpl-abc","object":"chat.completion","created":1700000000,)"
            R"("model":"glm-5","choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":null,"reasoning":null,"reasoning_content":null,"tool_calls":[)"
            R"({"id":"chatcmpl-tool-1","type":"function","function":{"name":"now",)"
            R"("arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}})");
}

TEST(ResponsesTest, ChatChoiceFromParserKeepsEmptyContentWithoutCallsOrReasoning) {
  OutputParser parser(ParserOptions{});
  parser.Finish();
  ChatChoice choice = ChatChoiceFromParser(parser, "length");
  EXPECT_EQ(choice.content, "");
  EXPECT_FALSE(choice.reasoning.has_value());
}

TEST(ResponsesTest, ChatChunks) {
  EXPECT_EQ(DumpJson(ChatRoleChunkJson(kChatMeta)),
            R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,)"
            R"("model":"glm-5","choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
            R"("logprobs":null,"finish_reason":null}]})");
  OutputDelta content;
  content.content = "Hel";
  EXPECT_EQ(DumpJson(ChatChunkJson(kChatMeta, content)),
            R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,)"
            R"("model":"glm-5","choices":[{"index":0,"delta":{"content":"Hel"},)"
            R"("logprobs":null,"finish_reason":null}]})");
  OutputDelta reasoning;
  reasoning.reasoning = "hmm";
  EXPECT_EQ(DumpJson(ChatDeltaJson(reasoning)), R"({"reasoning":"hmm","reasoning_content":"hmm"})");
  OutputDelta calls;
  calls.tool_calls.push_back({0, "chatcmpl-tool-1", "get_weather", ""});
  calls.tool_calls.push_back({0, std::nullopt, std::nullopt, R"({"city": "Pa)"});
  EXPECT_EQ(DumpJson(ChatDeltaJson(calls)),
            R"({"tool_calls":[{"index":0,"id":"chatcmpl-tool-1","type":"function",)"
            R"("function":{"name":"get_weather","arguments":""}},)"
            R"({"index":0,"function":{"arguments":"{\"city\": \"Pa"}}]})");
  EXPECT_EQ(DumpJson(ChatChunkJson(kChatMeta, OutputDelta{}, "stop")),
            R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,)"
            R"("model":"glm-5","choices":[{"index":0,"delta":{},"logprobs":null,)"
            R"("finish_reason":"stop"}]})");
  EXPECT_EQ(DumpJson(ChatUsageChunkJson(kChatMeta, Usage{7, 2})),
            R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,)"
            R"("model":"glm-5","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,)"
            R"("total_tokens":9}})");
}

TEST(ResponsesTest, TextCompletionAndChunks) {
  CompletionChoice choice{0, " upon a time", nullptr, "length"};
  EXPECT_EQ(DumpJson(CompletionJson(kTextMeta, {choice}, Usage{2, 4})),
            R"({"id":"cmpl-abc","object":"text_completion","created":1700000000,"model":"glm-5",)"
            R"("choices":[{"index":0,"text":" upon a time","logprobs":null,"finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":2,"completion_tokens":4,"total_tokens":6}})");
  EXPECT_EQ(DumpJson(CompletionChunkJson(kTextMeta, CompletionChoice{0, " upon", nullptr, {}})),
            R"({"id":"cmpl-abc","object":"text_completion","created":1700000000,"model":"glm-5",)"
            R"("choices":[{"index":0,"text":" upon","logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(DumpJson(CompletionUsageChunkJson(kTextMeta, Usage{2, 4})),
            R"({"id":"cmpl-abc","object":"text_completion","created":1700000000,"model":"glm-5",)"
            R"("choices":[],"usage":{"prompt_tokens":2,"completion_tokens":4,"total_tokens":6}})");
}

TEST(ResponsesTest, ModelsTokenizeDetokenize) {
  EXPECT_EQ(DumpJson(ModelListJson({ModelCard{"glm-5", 1700000000, "glmctl", "", 202752}})),
            R"({"object":"list","data":[{"id":"glm-5","object":"model","created":1700000000,)"
            R"("owned_by":"glmctl","root":"glm-5","max_model_len":202752}]})");
  EXPECT_EQ(DumpJson(TokenizeJson({5, 6}, 4096)),
            R"({"count":2,"max_model_len":4096,"tokens":[5,6]})");
  std::vector<std::string> strs = {"a", "b"};
  EXPECT_EQ(DumpJson(TokenizeJson({5, 6}, 4096, &strs)),
            R"({"count":2,"max_model_len":4096,"tokens":[5,6],"token_strs":["a","b"]})");
  EXPECT_EQ(DumpJson(DetokenizeJson("hi")), R"({"prompt":"hi"})");
}

TEST(ResponsesTest, ChatLogprobs) {
  std::vector<TokenLogprob> tokens = {
      {"é", -0.25, {{"é", -0.25}, {"e", -1.5}}},
      {"x", -std::numeric_limits<double>::infinity(), {}},
  };
  EXPECT_EQ(DumpJson(ChatLogprobsJson(tokens)),
            R"({"content":[{"token":"é","logprob":-0.25,"bytes":[195,169],"top_logprobs":[)"
            R"({"token":"é","logprob":-0.25,"bytes":[195,169]},)"
            R"({"token":"e","logprob":-1.5,"bytes":[101]}]},)"
            R"({"token":"x","logprob":-9999.0,"bytes":[120],"top_logprobs":[]}]})");
}

TEST(ResponsesTest, CompletionLogprobsOffsetsCountCodePoints) {
  std::vector<TokenLogprob> tokens = {
      {"Hi", std::nullopt, {}},  // an echoed prompt's first token
      {"é", -0.5, {{"é", -0.5}, {"e", -2.0}}},
      {"!", -0.125, {{"!", -0.125}}},
  };
  EXPECT_EQ(DumpJson(CompletionLogprobsJson(tokens, 3)),
            R"({"tokens":["Hi","é","!"],"token_logprobs":[null,-0.5,-0.125],)"
            R"("top_logprobs":[null,{"é":-0.5,"e":-2.0},{"!":-0.125}],"text_offset":[3,5,6]})");
}

TEST(ResponsesTest, SseFraming) {
  EXPECT_EQ(SseData(Json::parse(R"({"a":1})")), "data: {\"a\":1}\n\n");
  EXPECT_EQ(SseDone(), "data: [DONE]\n\n");
  EXPECT_EQ(SseError(Unavailable("engine died")),
            "data: {\"error\":{\"message\":\"engine died\",\"type\":\"ServiceUnavailableError\","
            "\"param\":null,\"code\":503}}\n\n");
}

TEST(ResponsesTest, DumpJsonReplacesInvalidUtf8) {
  OutputDelta delta;
  delta.content = "ok\xff";
  EXPECT_EQ(DumpJson(ChatDeltaJson(delta)), "{\"content\":\"ok\xEF\xBF\xBD\"}");
}

TEST(ResponsesTest, NewIdIsPrefixPlus32HexAndUniqueAcrossThreads) {
  std::string id = NewId("chatcmpl-");
  ASSERT_EQ(id.size(), 9u + 32u);
  EXPECT_EQ(id.substr(0, 9), "chatcmpl-");
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 9), std::string::npos);
  std::vector<std::vector<std::string>> per_thread(4);
  std::vector<std::thread> threads;
  for (auto& ids : per_thread) {
    threads.emplace_back([&ids] {
      for (int i = 0; i < 1000; ++i) ids.push_back(NewId("cmpl-"));
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<std::string> all;
  for (const auto& ids : per_thread) all.insert(ids.begin(), ids.end());
  EXPECT_EQ(all.size(), 4000u);
}

}  // namespace
}  // namespace glm::openai
