#include "controller/gateway/openai/python_literal.h"

#include <gtest/gtest.h>

#include <string>

namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;

std::string Literal(std::string_view text) {
  auto value = ParsePythonLiteral(text);
  return value ? PythonJsonDumps(*value) : "<none>";
}

TEST(PythonLiteralTest, Constants) {
  EXPECT_EQ(Literal("True"), "true");
  EXPECT_EQ(Literal("False"), "false");
  EXPECT_EQ(Literal("None"), "null");
  EXPECT_EQ(Literal("true"), "<none>");  // a name, not a Python literal
  EXPECT_EQ(Literal("Truex"), "<none>");
}

TEST(PythonLiteralTest, Numbers) {
  EXPECT_EQ(Literal("42"), "42");
  EXPECT_EQ(Literal("-42"), "-42");
  EXPECT_EQ(Literal("+7"), "7");
  EXPECT_EQ(Literal("1_000"), "1000");
  EXPECT_EQ(Literal("0x1F"), "31");
  EXPECT_EQ(Literal("0o17"), "15");
  EXPECT_EQ(Literal("0b101"), "5");
  EXPECT_EQ(Literal("2.5"), "2.5");
  EXPECT_EQ(Literal("1."), "1.0");
  EXPECT_EQ(Literal(".5"), "0.5");
  EXPECT_EQ(Literal("1e3"), "1000.0");
  EXPECT_EQ(Literal("007"), "<none>");
  EXPECT_EQ(Literal("1j"), "<none>");
  EXPECT_EQ(Literal("1__0"), "<none>");
  EXPECT_EQ(Literal("99999999999999999999999"), "<none>");
}

TEST(PythonLiteralTest, Strings) {
  EXPECT_EQ(Literal("'Paris'"), "\"Paris\"");
  EXPECT_EQ(Literal("\"it's\""), "\"it's\"");
  EXPECT_EQ(Literal(R"('a\'b\n\t\\')"), R"("a'b\n\t\\")");
  EXPECT_EQ(Literal(R"('\x41\u00e9\U0001F600')"), "\"A\xC3\xA9\xF0\x9F\x98\x80\"");
  EXPECT_EQ(Literal(R"(r'\n')"), R"("\\n")");
  EXPECT_EQ(Literal("'a' 'b'"), "\"ab\"");
  EXPECT_EQ(Literal("'''x'y'''"), "\"x'y\"");
  EXPECT_EQ(Literal("'unterminated"), "<none>");
  EXPECT_EQ(Literal("b'bytes'"), "<none>");
}

TEST(PythonLiteralTest, Containers) {
  EXPECT_EQ(Literal("[1, 'a', None, True]"), R"([1, "a", null, true])");
  EXPECT_EQ(Literal("(1, 2)"), "[1, 2]");
  EXPECT_EQ(Literal("(1,)"), "[1]");
  EXPECT_EQ(Literal("(1)"), "1");
  EXPECT_EQ(Literal("()"), "[]");
  EXPECT_EQ(Literal("{'b': 1, 'a': [2, 3],}"), R"({"b": 1, "a": [2, 3]})");
  EXPECT_EQ(Literal("{1: 'x', True: 'y', None: 'z'}"), R"({"1": "x", "true": "y", "null": "z"})");
  EXPECT_EQ(Literal("{1, 2}"), "<none>");  // a set: json.dumps cannot write it
  EXPECT_EQ(Literal("[1, 2"), "<none>");
  EXPECT_EQ(Literal("[f(1)]"), "<none>");
  EXPECT_EQ(Literal(std::string(200, '[') + std::string(200, ']')), "<none>");  // too deep
}

TEST(PythonLiteralTest, DumpsUsesPythonSeparatorsAndRawUtf8) {
  Json value = Json::parse(R"({"z": [1, {"k": "v"}], "a": "日本\n", "f": 1.5, "e": {}, "l": []})");
  EXPECT_EQ(PythonJsonDumps(value), "{\"z\": [1, {\"k\": \"v\"}], \"a\": \"日本\\n\", \"f\": 1.5, "
                                    "\"e\": {}, \"l\": []}");
  EXPECT_EQ(PythonJsonDumps(Json("\x01")), "\"\\u0001\"");
  EXPECT_EQ(PythonJsonDumps(Json(std::string("bad\xff"))), "\"bad\xEF\xBF\xBD\"");
}

TEST(PythonLiteralTest, DeserializeTriesJsonThenPythonThenString) {
  EXPECT_EQ(PythonJsonDumps(DeserializeArgument("2")), "2");
  EXPECT_EQ(PythonJsonDumps(DeserializeArgument("[1,2]")), "[1, 2]");
  EXPECT_EQ(PythonJsonDumps(DeserializeArgument("true")), "true");
  EXPECT_EQ(PythonJsonDumps(DeserializeArgument("True")), "true");
  EXPECT_EQ(PythonJsonDumps(DeserializeArgument("{'a': None}")), R"({"a": null})");
  EXPECT_EQ(PythonJsonDumps(DeserializeArgument("Paris")), "\"Paris\"");
  EXPECT_EQ(PythonJsonDumps(DeserializeArgument("")), "\"\"");
}

}  // namespace
}  // namespace glm::openai
