#include "controller/gateway/openai/output_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;

const char* const kWeatherTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                   "note": {"type": ["string", "null"]}, "unit": {"enum": ["c", "f"]},
                   "flags": {"type": "object"}}}}},
  {"type": "function", "function": {"name": "now"}}])";

ParserOptions Options(bool starts_in_reasoning = false, bool tools = true) {
  ParserOptions options;
  options.reasoning = true;
  options.starts_in_reasoning = starts_in_reasoning;
  options.tools = tools;
  options.tools_schema = Json::parse(kWeatherTools);
  return options;
}

struct Call {
  std::string id;
  std::string name;
  std::string arguments;
  bool operator==(const Call&) const = default;
};

struct Parsed {
  std::string reasoning;
  std::string content;
  std::vector<Call> calls;
  bool operator==(const Parsed&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Parsed& p) {
  os << "{reasoning=" << Json(p.reasoning).dump() << " content=" << Json(p.content).dump()
     << " calls=[";
  for (const Call& c : p.calls) os << c.id << ":" << c.name << ":" << c.arguments << " ";
  return os << "]}";
}

// Feeds `pieces` as deltas and accumulates what was streamed; checks that the streamed result
// equals the parser's complete (non-streaming) result.
Parsed Stream(ParserOptions options, const std::vector<std::string>& pieces) {
  int next_id = 0;
  options.new_tool_call_id = [&next_id] { return "chatcmpl-tool-" + std::to_string(next_id++); };
  OutputParser parser(options);
  Parsed streamed;
  auto take = [&](const OutputDelta& delta) {
    EXPECT_EQ(delta.empty(), delta.reasoning.empty() && delta.content.empty() &&
                                 delta.tool_calls.empty());
    streamed.reasoning += delta.reasoning;
    streamed.content += delta.content;
    for (const ToolCallDelta& call : delta.tool_calls) {
      if (call.name) {
        // The name comes once, first, with the id and empty arguments.
        EXPECT_EQ(call.index, static_cast<int>(streamed.calls.size()));
        EXPECT_TRUE(call.id.has_value());
        EXPECT_EQ(call.arguments_fragment, "");
        streamed.calls.push_back({*call.id, *call.name, ""});
      } else {
        EXPECT_FALSE(call.id.has_value());
        EXPECT_FALSE(call.arguments_fragment.empty());
      }
      EXPECT_GE(call.index, 0);
      EXPECT_LT(call.index, static_cast<int>(streamed.calls.size()));
      if (call.index >= 0 && call.index < static_cast<int>(streamed.calls.size())) {
        streamed.calls[call.index].arguments += call.arguments_fragment;
      }
    }
  };
  for (const std::string& piece : pieces) take(parser.Feed(piece));
  take(parser.Finish());
  EXPECT_EQ(parser.reasoning(), streamed.reasoning);
  EXPECT_EQ(parser.content(), streamed.content);
  EXPECT_EQ(parser.saw_tool_calls(), !streamed.calls.empty());
  Json calls = parser.tool_calls();
  EXPECT_EQ(calls.size(), streamed.calls.size());
  for (size_t i = 0; i < calls.size() && i < streamed.calls.size(); ++i) {
    EXPECT_EQ(calls[i]["id"], streamed.calls[i].id);
    EXPECT_EQ(calls[i]["type"], "function");
    EXPECT_EQ(calls[i]["function"]["name"], streamed.calls[i].name);
    // The concatenated fragments are exactly the final arguments, a JSON object.
    EXPECT_EQ(calls[i]["function"]["arguments"], streamed.calls[i].arguments);
    Json arguments = Json::parse(streamed.calls[i].arguments, nullptr, false);
    EXPECT_TRUE(arguments.is_object()) << streamed.calls[i].arguments;
  }
  return streamed;
}

std::vector<std::string> Chunks(const std::string& text, size_t size) {
  std::vector<std::string> pieces;
  for (size_t i = 0; i < text.size(); i += size) pieces.push_back(text.substr(i, size));
  return pieces;
}

// Parses `text` whole, then in chunks of 1, 2, 3 and 5 bytes and split in two at every
// position; every way must give the same result. Returns it.
Parsed ParseEverySplit(const ParserOptions& options, const std::string& text) {
  Parsed whole = Stream(options, {text});
  for (size_t size : {1u, 2u, 3u, 5u}) {
    EXPECT_EQ(Stream(options, Chunks(text, size)), whole) << "chunks of " << size;
  }
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(Stream(options, {text.substr(0, cut), text.substr(cut)}), whole) << "cut at " << cut;
  }
  return whole;
}

Parsed Expect(std::string reasoning, std::string content, std::vector<Call> calls = {}) {
  return Parsed{std::move(reasoning), std::move(content), std::move(calls)};
}

TEST(OutputParserTest, SpecExampleToolCallWithTypedArguments) {
  const std::string text =
      "<think>Need tool.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
      "</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>";
  Parsed expected = Expect("Need tool.", "",
                           {{"chatcmpl-tool-0", "get_weather", R"({"city": "Paris", "days": 2})"}});
  EXPECT_EQ(ParseEverySplit(Options(), text), expected);
  // Thinking on: the prompt ended in <think>, the model does not repeat it.
  EXPECT_EQ(ParseEverySplit(Options(/*starts_in_reasoning=*/true), text.substr(7)), expected);
  // A repeated <think> while reasoning is swallowed.
  EXPECT_EQ(ParseEverySplit(Options(/*starts_in_reasoning=*/true), text), expected);
  // The turn ends with <|observation|>, which is never content.
  EXPECT_EQ(ParseEverySplit(Options(), text + "<|observation|>"), expected);
}

TEST(OutputParserTest, ReasoningThenContent) {
  EXPECT_EQ(ParseEverySplit(Options(true), "Let me think.</think>The answer is 4."),
            Expect("Let me think.", "The answer is 4."));
  EXPECT_EQ(ParseEverySplit(Options(true, /*tools=*/false), "a<b</think> x <c> y\n"),
            Expect("a<b", " x <c> y\n"));
  // Reasoning only (cut off by the length limit): nothing is content.
  EXPECT_EQ(ParseEverySplit(Options(true), "still thinking <thi"), Expect("still thinking <thi", ""));
  // <think> at the start opens reasoning even when the prompt did not.
  EXPECT_EQ(ParseEverySplit(Options(false, false), "  <think>r</think>c"), Expect("r", "  c"));
}

TEST(OutputParserTest, StrayThinkMarkersAreSwallowed) {
  EXPECT_EQ(ParseEverySplit(Options(false, false), "A<think>B</think>C"), Expect("", "ABC"));
  EXPECT_EQ(ParseEverySplit(Options(true, false), "r<think>s</think>c<think>d</think>e"),
            Expect("rs", "cde"));
}

TEST(OutputParserTest, ReasoningOffMakesEverythingContent) {
  ParserOptions options = Options(true, false);
  options.reasoning = false;
  EXPECT_EQ(ParseEverySplit(options, "<think>x</think>y"), Expect("", "<think>x</think>y"));
}

TEST(OutputParserTest, ToolCallEndsReasoning) {
  EXPECT_EQ(ParseEverySplit(Options(true), "plan<tool_call>now</tool_call>"),
            Expect("plan", "", {{"chatcmpl-tool-0", "now", "{}"}}));
  // Without tool parsing the marker ends reasoning and stays as content text.
  EXPECT_EQ(ParseEverySplit(Options(true, false), "plan<tool_call>now</tool_call>"),
            Expect("plan", "<tool_call>now</tool_call>"));
}

TEST(OutputParserTest, PlainContentWithAngleBracketsIsKept) {
  EXPECT_EQ(ParseEverySplit(Options(), "Use <b>bold</b>, a < b, <tool and <arg_key> here."),
            Expect("", "Use <b>bold</b>, a < b, <tool and <arg_key> here."));
  EXPECT_EQ(ParseEverySplit(Options(), "ends with <"), Expect("", "ends with <"));
  EXPECT_EQ(ParseEverySplit(Options(), "ends with <tool_ca"), Expect("", "ends with <tool_ca"));
  EXPECT_EQ(ParseEverySplit(Options(), "  spaced  \n"), Expect("", "  spaced  \n"));
}

TEST(OutputParserTest, StopMarkersEndTheOutput) {
  EXPECT_EQ(ParseEverySplit(Options(), "Answer.<|user|>junk"), Expect("", "Answer."));
  EXPECT_EQ(ParseEverySplit(Options(), "Answer.<|endoftext|>"), Expect("", "Answer."));
  EXPECT_EQ(ParseEverySplit(Options(true), "r<|observation|>x"), Expect("r", ""));
}

TEST(OutputParserTest, ZeroArgumentsAndSeveralCalls) {
  const std::string text =
      "I'll check.\n<tool_call>now</tool_call>\n<tool_call>get_weather<arg_key>city</arg_key>"
      "<arg_value>Oslo</arg_value></tool_call>\n";
  EXPECT_EQ(ParseEverySplit(Options(), text),
            Expect("", "I'll check.\n",
                   {{"chatcmpl-tool-0", "now", "{}"},
                    {"chatcmpl-tool-1", "get_weather", R"({"city": "Oslo"})"}}));
  ParserOptions single = Options();
  single.parallel_tool_calls = false;
  EXPECT_EQ(ParseEverySplit(single, text),
            Expect("", "I'll check.\n", {{"chatcmpl-tool-0", "now", "{}"}}));
}

TEST(OutputParserTest, TextBetweenCallsIsContentUnlessOnlyWhitespace) {
  EXPECT_EQ(ParseEverySplit(Options(), "<tool_call>now</tool_call> Done. "),
            Expect("", " Done. ", {{"chatcmpl-tool-0", "now", "{}"}}));
  EXPECT_EQ(ParseEverySplit(Options(), "A \n<tool_call>now</tool_call>\n B\n<tool_call>now</tool_call>\n"),
            Expect("", "A \n\n B\n", {{"chatcmpl-tool-0", "now", "{}"}, {"chatcmpl-tool-1", "now", "{}"}}));
}

TEST(OutputParserTest, WhitespaceAndLiteralNewlinesAroundNamesAndValues) {
  const std::string text =
      "<tool_call> get_weather\n<arg_key> city </arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\\n<arg_value> 3 </arg_value>\n</tool_call>";
  EXPECT_EQ(ParseEverySplit(Options(), text),
            Expect("", "", {{"chatcmpl-tool-0", "get_weather", R"({"city": "Paris", "days": 3})"}}));
  EXPECT_EQ(ParseEverySplit(Options(), "<tool_call>\\nnow\\n</tool_call>"),
            Expect("", "", {{"chatcmpl-tool-0", "now", "{}"}}));
}

TEST(OutputParserTest, ArgumentTypingFollowsTheSchema) {
  auto args = [](const std::string& pairs, const char* name = "get_weather") {
    Parsed parsed = ParseEverySplit(Options(), std::string("<tool_call>") + name + pairs +
                                                   "</tool_call>");
    return parsed.calls.empty() ? std::string("<no call>") : parsed.calls[0].arguments;
  };
  // Declared string: raw and untrimmed, even when it looks like JSON.
  EXPECT_EQ(args("<arg_key>city</arg_key><arg_value> 2 </arg_value>"), R"({"city": " 2 "})");
  EXPECT_EQ(args("<arg_key>note</arg_key><arg_value>null</arg_value>"), R"({"note": "null"})");
  EXPECT_EQ(args("<arg_key>unit</arg_key><arg_value>c</arg_value>"), R"({"unit": "c"})");
  // Others: JSON, then Python literal, else the stripped text.
  EXPECT_EQ(args("<arg_key>days</arg_key><arg_value>\n2\n</arg_value>"), R"({"days": 2})");
  EXPECT_EQ(args(R"(<arg_key>flags</arg_key><arg_value>{"a":[1,2],"b":null}</arg_value>)"),
            R"({"flags": {"a": [1, 2], "b": null}})");
  EXPECT_EQ(args("<arg_key>flags</arg_key><arg_value>{'a': True, 'b': None}</arg_value>"),
            R"({"flags": {"a": true, "b": null}})");
  EXPECT_EQ(args("<arg_key>days</arg_key><arg_value>two days</arg_value>"),
            R"({"days": "two days"})");
  // Unknown tool or key: no schema, so typed like a non-string.
  EXPECT_EQ(args("<arg_key>x</arg_key><arg_value>1.5</arg_value>", "other"), R"({"x": 1.5})");
  EXPECT_EQ(args("<arg_key>x</arg_key><arg_value>Paris</arg_value>", "other"), R"({"x": "Paris"})");
  EXPECT_EQ(args("<arg_key>x</arg_key><arg_value>'q'</arg_value>", "other"), R"({"x": "q"})");
  // A key without a value is dropped.
  EXPECT_EQ(args("<arg_key>x</arg_key><arg_key>city</arg_key><arg_value>A</arg_value>"),
            R"({"city": "A"})");
}

TEST(OutputParserTest, StringValuesAreJsonEscaped) {
  const std::string text =
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>line \"1\"\n\\path\t日本"
      "</arg_value></tool_call>";
  EXPECT_EQ(ParseEverySplit(Options(), text),
            Expect("", "",
                   {{"chatcmpl-tool-0", "get_weather",
                     "{\"city\": \"line \\\"1\\\"\\n\\\\path\\t日本\"}"}}));
}

TEST(OutputParserTest, UnterminatedCallsAreClosed) {
  EXPECT_EQ(ParseEverySplit(Options(),
                            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Ber"),
            Expect("", "", {{"chatcmpl-tool-0", "get_weather", R"({"city": "Ber"})"}}));
  EXPECT_EQ(ParseEverySplit(Options(), "<tool_call>get_weather<arg_key>days</arg_key><arg_value>1"),
            Expect("", "", {{"chatcmpl-tool-0", "get_weather", R"({"days": 1})"}}));
  EXPECT_EQ(ParseEverySplit(Options(), "<tool_call>get_weather<arg_key>da"),
            Expect("", "", {{"chatcmpl-tool-0", "get_weather", "{}"}}));
  EXPECT_EQ(ParseEverySplit(Options(),
                            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>X<|user|>"),
            Expect("", "", {{"chatcmpl-tool-0", "get_weather", R"({"city": "X"})"}}));
  // A name that never ended is no call.
  EXPECT_EQ(ParseEverySplit(Options(), "ok<tool_call>get_wea"), Expect("", "ok"));
  // A new call before </tool_call> closes the open one.
  EXPECT_EQ(ParseEverySplit(Options(), "<tool_call>now<tool_call>now</tool_call>"),
            Expect("", "", {{"chatcmpl-tool-0", "now", "{}"}, {"chatcmpl-tool-1", "now", "{}"}}));
}

TEST(OutputParserTest, ToolsOffLeavesCallsAsContent) {
  EXPECT_EQ(ParseEverySplit(Options(false, false), "<tool_call>now</tool_call>"),
            Expect("", "<tool_call>now</tool_call>"));
}

TEST(OutputParserTest, StreamingDeltasFollowVllm) {
  ParserOptions options = Options();
  options.new_tool_call_id = [] { return std::string("chatcmpl-tool-x"); };
  OutputParser parser(options);
  EXPECT_TRUE(parser.Feed("<tool_call>get_we").empty());
  OutputDelta name = parser.Feed("ather<arg_key>");
  ASSERT_EQ(name.tool_calls.size(), 1u);
  EXPECT_EQ(name.tool_calls[0].id, "chatcmpl-tool-x");
  EXPECT_EQ(name.tool_calls[0].name, "get_weather");
  EXPECT_EQ(name.tool_calls[0].arguments_fragment, "");
  EXPECT_TRUE(parser.Feed("city</arg_key>").empty());
  OutputDelta open = parser.Feed("<arg_value>Par");
  ASSERT_EQ(open.tool_calls.size(), 1u);
  EXPECT_FALSE(open.tool_calls[0].name.has_value());
  EXPECT_EQ(open.tool_calls[0].arguments_fragment, "{\"city\": \"Par");
  // Held back: "</arg" could begin </arg_value>.
  EXPECT_EQ(parser.Feed("is</arg").tool_calls.at(0).arguments_fragment, "is");
  EXPECT_EQ(parser.Feed("_value>").tool_calls.at(0).arguments_fragment, "\"");
  // A non-string value comes whole at </arg_value>.
  EXPECT_TRUE(parser.Feed("<arg_key>days</arg_key><arg_value>1").tool_calls.at(0)
                  .arguments_fragment == ", \"days\": ");
  EXPECT_EQ(parser.Feed("4</arg_value>").tool_calls.at(0).arguments_fragment, "14");
  EXPECT_EQ(parser.Feed("</tool_call>").tool_calls.at(0).arguments_fragment, "}");
  EXPECT_TRUE(parser.Finish().empty());
  EXPECT_EQ(parser.tool_calls()[0]["function"]["arguments"], R"({"city": "Paris", "days": 14})");
}

TEST(OutputParserTest, HoldsBackPartialMarkersAndUtf8) {
  OutputParser parser(Options(true, false));
  EXPECT_EQ(parser.Feed("abc</thi").reasoning, "abc");
  OutputDelta switched = parser.Feed("nk>caf\xC3");
  EXPECT_EQ(switched.reasoning, "");
  EXPECT_EQ(switched.content, "caf");
  EXPECT_EQ(parser.Feed("\xA9 <thx").content, "\xC3\xA9 <thx");
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(OutputParserTest, FeedAfterFinishIsIgnored) {
  OutputParser parser(Options());
  parser.Feed("a");
  parser.Finish();
  EXPECT_TRUE(parser.Feed("b").empty());
  EXPECT_EQ(parser.content(), "a");
  OutputParser stopped(Options());
  stopped.Feed("x<|user|>");
  EXPECT_TRUE(stopped.saw_stop_marker());
  EXPECT_TRUE(stopped.Feed("more").empty());
}

}  // namespace
}  // namespace glm::openai
