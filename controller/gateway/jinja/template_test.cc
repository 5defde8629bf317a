#include "controller/gateway/jinja/template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"

namespace glm::jinja {
namespace {

using Json = nlohmann::ordered_json;

// Renders `source` with `context`; a parse or render error comes back as "ERROR: <message>".
std::string R(std::string_view source, const Json& context = Json::object()) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  RenderOptions options;
  options.now = [] { return std::time_t{1700000000}; };
  absl::StatusOr<std::string> out = t->Render(context, options);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

bool IsError(const std::string& s) { return s.rfind("ERROR: ", 0) == 0; }

TEST(JinjaTemplate, PlainTextAndExpressions) {
  EXPECT_EQ(R("hello"), "hello");
  EXPECT_EQ(R("{{ 1 + 2 }}-{{ 'a' ~ 'b' }}"), "3-ab");
  EXPECT_EQ(R("{{ x }}", {{"x", "y"}}), "y");
  EXPECT_EQ(R("{# comment #}x"), "x");
}

TEST(JinjaTemplate, PythonPrinting) {
  EXPECT_EQ(R("{{ true }} {{ false }} {{ none }}"), "True False None");
  EXPECT_EQ(R("{{ x }}", {{"x", Json::parse(R"([true, null, "a", 1, 1.0])")}}),
            "[True, None, 'a', 1, 1.0]");
  EXPECT_EQ(R("{{ x }}", {{"x", Json::parse(R"({"k": "v", "n": {"m": [1]}})")}}),
            "{'k': 'v', 'n': {'m': [1]}}");
  EXPECT_EQ(R("{{ 1.0 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 4 / 2 }}"),
            "1.0 1e+16 1e-05 0.30000000000000004 2.5 2.0");
  EXPECT_EQ(R("{{ [\"it's\", 'a\"b', 'n\\nl'] }}"), "[\"it's\", 'a\"b', 'n\\nl']");
  EXPECT_EQ(R("{{ (1,) }} {{ (1, 2) }} {{ () }}"), "(1,) (1, 2) ()");
}

TEST(JinjaTemplate, StringLiteralEscapes) {
  EXPECT_EQ(R("{{ 'a\\nb\\t\\'\\\\' }}"), "a\nb\t'\\");
  EXPECT_EQ(R("{{ \"\\u00e9\\x41\\101\" }}"), "\xC3\xA9" "AA");
  EXPECT_EQ(R("{{ 'a' 'b' }}"), "ab");
}

TEST(JinjaTemplate, TojsonMatchesPythonJsonDumps) {
  Json ctx = {{"x", Json::parse(R"({"b": 1, "a": [1.5, true, null, "é\"\\\n😀"], "c": {}})")}};
  EXPECT_EQ(R("{{ x | tojson }}", ctx),
            "{\"b\": 1, \"a\": [1.5, true, null, \"é\\\"\\\\\\n😀\"], \"c\": {}}");
  EXPECT_EQ(R("{{ x | tojson(indent=2) }}", {{"x", Json::parse(R"({"a": [1], "b": []})")}}),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(R("{{ x | tojson(sort_keys=true) }}", {{"x", Json::parse(R"({"b": 1, "a": 2})")}}),
            "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(R("{{ 'é' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\"");
  EXPECT_EQ(R("{{ x | tojson(separators=(',', ':')) }}", {{"x", Json::parse(R"({"a": [1, 2]})")}}),
            "{\"a\":[1,2]}");
  EXPECT_TRUE(IsError(R("{{ nope | tojson }}")));
}

TEST(JinjaTemplate, WhitespaceControlTrimAndLstrip) {
  // lstrip_blocks removes the indentation before a block tag, trim_blocks the newline after.
  EXPECT_EQ(R("  {% if true %}\n  yes\n  {% endif %}\nafter"), "  yes\nafter");
  EXPECT_EQ(R("a\n  {%- if true -%}\n  b  \n{%- endif %}\nc"), "abc");
  EXPECT_EQ(R("x {% if true %}y{% endif %} z"), "x y z");  // not at a line start: kept
  EXPECT_EQ(R("  {%+ if true %}a{% endif %}"), "  a");      // `+` disables lstrip
  EXPECT_EQ(R("{% if true +%}\nA{% endif %}"), "\nA");      // `+%}` disables trim
  EXPECT_EQ(R("  {{ 'v' }}\n"), "  v");  // no lstrip for {{ }}; trailing newline dropped
  EXPECT_EQ(R("{{- '  a  ' -}}   b"), "  a  b");
  EXPECT_EQ(R("line1\n    {# c #}\nline2"), "line1\nline2");
  EXPECT_EQ(R("a\r\nb\r\n"), "a\nb");
  EXPECT_EQ(R("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(JinjaTemplate, IfElifElse) {
  const char* t = "{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif %}";
  EXPECT_EQ(R(t, {{"x", 3}}), "big");
  EXPECT_EQ(R(t, {{"x", 2}}), "two");
  EXPECT_EQ(R(t, {{"x", 1}}), "small");
  EXPECT_EQ(R("{{ 'y' if x else 'n' }}|{{ 'y' if not x }}|", {{"x", false}}), "n|y|");
}

TEST(JinjaTemplate, ForLoops) {
  EXPECT_EQ(R("{% for x in [10, 20, 30] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
              "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}"),
            "10TrueFalse332;21FalseFalse321;32FalseTrue310;");
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {% endfor %}"),
            "<1>2 1<2>3 2<3> ");
  EXPECT_EQ(R("{% for x in range(10) if x is odd %}{{ x }}/{{ loop.length }} {% endfor %}"),
            "1/5 3/5 5/5 7/5 9/5 ");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
              "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "0134");
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
              {{"d", Json::parse(R"({"z": 1, "a": 2})")}}),
            "z=1;a=2;");
  EXPECT_EQ(R("{% for c in 'h\xC3\xA9' %}[{{ c }}]{% endfor %}"), "[h][\xC3\xA9]");
}

TEST(JinjaTemplate, ScopingSetNamespaceMacro) {
  // A set inside a loop body does not leak; a namespace attribute does.
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"),
            "231");
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
              "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(R("{% set x %}a{{ 1 }}b{% endset %}[{{ x }}]"), "[a1b]");
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(R("{% macro m(name, greeting='Hi') %}{{ greeting }} {{ name }}{% endmacro %}"
              "{{ m('A') }}/{{ m('B', greeting='Yo') }}"),
            "Hi A/Yo B");
  EXPECT_EQ(R("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(R("{% with a = 5 %}{{ a }}{% endwith %}{{ a }}"), "5");
  EXPECT_TRUE(IsError(R("{% set x = 1 %}{% set x.y = 2 %}")));
}

TEST(JinjaTemplate, UndefinedSemantics) {
  EXPECT_EQ(R("[{{ nope }}]{{ nope is defined }}{{ nope is undefined }}{{ nope | default('d') }}"),
            "[]FalseTrued");
  EXPECT_EQ(R("{% if nope %}y{% else %}n{% endif %}{{ nope | length }}"), "n0");
  EXPECT_EQ(R("{{ d.missing is defined }}", {{"d", Json::object()}}), "False");
  // jinja2's default Undefined: an attribute of an undefined value is an error.
  std::string err = R("{{ nope.attr }}");
  EXPECT_TRUE(IsError(err));
  EXPECT_NE(err.find("'nope' is undefined"), std::string::npos) << err;
  EXPECT_NE(err.find("nope.attr"), std::string::npos) << err;  // names the expression
  EXPECT_TRUE(IsError(R("{{ d.missing.deeper }}", {{"d", Json::object()}})));
}

TEST(JinjaTemplate, DictAndStringMethods) {
  Json ctx = {{"d", Json::parse(R"({"a": 1, "items": "x"})")}};
  EXPECT_EQ(R("{{ d.a }}{{ d['a'] }}{{ d.get('a') }}{{ d.get('z', 9) }}{{ d.get('z') }}", ctx),
            "1119None");
  EXPECT_EQ(R("{{ d['items'] }}|{{ d.items() | list }}", ctx),
            "x|[('a', 1), ('items', 'x')]");  // attribute lookup prefers the method
  EXPECT_EQ(R("{{ d.keys() | list }}{{ d.values() | list }}", ctx), "['a', 'items'][1, 'x']");
  EXPECT_EQ(R("{{ '  a  '.strip() }}|{{ 'xax'.strip('x') }}|{{ 'a,b'.split(',') }}|{{ ' a  b '.split() }}"),
            "a|a|['a', 'b']|['a', 'b']");
  EXPECT_EQ(R("{{ 'ab'.startswith('a') }}{{ 'ab'.endswith(('x', 'b')) }}{{ 'abc'.find('c') }}"
              "{{ 'a b'.title() }}{{ 'aB'.capitalize() }}{{ 'aa'.replace('a', 'b', 1) }}"
              "{{ 'a.b.c'.rsplit('.', 1) }}{{ 'X'.lower() }}{{ 'x'.upper() }}"),
            "TrueTrue2A BAbba['a.b', 'c']xX");
  EXPECT_EQ(R("{{ '<think>r</think>text'.split('</think>')[-1] }}"), "text");
}

TEST(JinjaTemplate, ImmutableSandbox) {
  std::string err = R("{% set x = [] %}{{ x.append(1) }}");
  EXPECT_TRUE(IsError(err));
  EXPECT_NE(err.find("unsafe"), std::string::npos) << err;
  EXPECT_TRUE(IsError(R("{{ d.update({'a': 1}) }}", {{"d", Json::object()}})));
}

TEST(JinjaTemplate, Filters) {
  Json ctx = {{"msgs", Json::parse(R"([{"role": "user", "c": 1}, {"role": "assistant", "c": 2},
                                       {"role": "user", "c": 3}])")}};
  EXPECT_EQ(R("{{ msgs | map(attribute='role') | join(',') }}", ctx), "user,assistant,user");
  EXPECT_EQ(R("{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }}", ctx),
            "[1, 3]");
  EXPECT_EQ(R("{{ msgs | rejectattr('role', 'eq', 'user') | list | length }}", ctx), "1");
  EXPECT_EQ(R("{{ [3, 1, 2] | sort }}{{ msgs | sort(attribute='c', reverse=true) | map(attribute='c') | list }}", ctx),
            "[1, 2, 3][3, 2, 1]");
  EXPECT_EQ(R("{{ [1, 2] | first }}{{ [1, 2] | last }}{{ 'abc' | length }}{{ [1, 2] | reverse | list }}"),
            "123[2, 1]");
  EXPECT_EQ(R("{{ ' x ' | trim }}{{ 'ab' | upper }}{{ 'hello world' | title }}{{ 'aB' | capitalize }}"
              "{{ 'aa' | replace('a', 'b') }}{{ 3.7 | int }}{{ '2.5' | float }}{{ -3 | abs }}"
              "{{ 2.5 | round }}{{ 3.14159 | round(2) }}{{ 1 | string }}"),
            "xABHello WorldAbbb32.532.03.141");
  EXPECT_EQ(R("{{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, first=true) }}"), "a\n  b|  a\n  b");
  EXPECT_EQ(R("{{ d | items | list }}", {{"d", Json::parse(R"({"k": 1})")}}), "[('k', 1)]");
  EXPECT_EQ(R("{{ '<b>' | safe }}{{ '<b>' | e }}"), "<b>&lt;b&gt;");
  EXPECT_EQ(R("{{ none | default('x') }}{{ '' | d('x', true) }}"), "Nonex");
}

TEST(JinjaTemplate, TestsAndOperators) {
  EXPECT_EQ(R("{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}"
              "{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is sequence }}"
              "{{ none is none }}{{ true is boolean }}{{ 3 is odd }}{{ 4 is even }}"
              "{{ 9 is divisibleby 3 }}{{ 'a' is eq 'a' }}{{ x is not defined }}"),
            "TrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ 'ab' * 2 }}"),
            "3 -4 2 64 abab");
  EXPECT_EQ(R("{{ 'a' in 'cat' }}{{ 1 not in [1] }}{{ 'k' in {'k': 1} }}{{ 1 < 2 < 3 }}{{ 1 == 1.0 }}"),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(R("{{ l[1:] }}{{ l[::-1] }}{{ l[-1] }}{{ l[:-1] }}", {{"l", Json::parse("[1, 2, 3]")}}),
            "[2, 3][3, 2, 1]3[1, 2]");
  EXPECT_EQ(R("{{ 'h\xC3\xA9llo'[1] }}{{ 'abc'[::-1] }}"), "\xC3\xA9" "cba");
  EXPECT_EQ(R("{{ false or 'x' }}{{ true and 'y' }}{{ not 0 }}"), "xyTrue");
  EXPECT_TRUE(IsError(R("{{ 1 + 'a' }}")));
  EXPECT_TRUE(IsError(R("{{ 1 / 0 }}")));
}

TEST(JinjaTemplate, Globals) {
  EXPECT_EQ(R("{{ range(3) | list }}{{ range(1, 7, 2) | list }}"), "[0, 1, 2][1, 3, 5]");
  EXPECT_EQ(R("{{ dict(a=1) }}"), "{'a': 1}");
  EXPECT_TRUE(IsError(R("{{ range(1000000) | length }}")));  // the sandbox's MAX_RANGE
  // strftime_now uses the injected clock (local time, as Python's datetime.now()).
  std::time_t t = 1700000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char expected[32];
  std::strftime(expected, sizeof(expected), "%d %b %Y", &tm);
  EXPECT_EQ(R("{{ strftime_now('%d %b %Y') }}"), expected);
}

TEST(JinjaTemplate, RaiseExceptionReturnsItsMessage) {
  absl::StatusOr<Template> t = Template::Parse(
      "{% if messages | length > 1 %}{{ raise_exception('Roles must alternate!') }}{% endif %}ok");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Render({{"messages", Json::array({1})}}), "ok");
  absl::StatusOr<std::string> out = t->Render({{"messages", Json::array({1, 2})}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Roles must alternate!");
}

TEST(JinjaTemplate, SyntaxErrorsNameLineAndExpectation) {
  absl::StatusOr<Template> t = Template::Parse("line one\n{% if x %}\n{% for %}\n{% endif %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("line 3:"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("expected"), std::string::npos) << t.status();

  t = Template::Parse("{% if x %}\nno end");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("expected 'elif' or 'else' or 'endif'"), std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find("line 1"), std::string::npos) << t.status();

  EXPECT_FALSE(Template::Parse("{{ x | nosuchfilter }}").ok());
  EXPECT_TRUE(Template::Parse("{% if false %}{{ x | nosuchfilter }}{% endif %}").ok());  // as jinja2
  EXPECT_FALSE(Template::Parse("{% include 'x' %}").ok());
  EXPECT_FALSE(Template::Parse("{{ 'unterminated }}").ok());
  EXPECT_FALSE(Template::Parse("{# never closed").ok());
  EXPECT_FALSE(Template::Parse("{% break %}").ok());
}

TEST(JinjaTemplate, LimitsStopRunawayTemplates) {
  RenderOptions options;
  options.limits.max_output_bytes = 1 << 16;
  options.limits.max_steps = 100000;
  absl::StatusOr<Template> t = Template::Parse(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> out = t->Render(Json::object(), options);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);

  t = Template::Parse("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json::object(), options).status().code(), absl::StatusCode::kResourceExhausted);

  t = Template::Parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json::object()).status().code(), absl::StatusCode::kResourceExhausted);

  t = Template::Parse(
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json::object(), options).status().code(), absl::StatusCode::kResourceExhausted);

  std::string deep(5000, '(');
  EXPECT_FALSE(Template::Parse("{{ " + deep + " }}").ok());
  std::string deep_blocks;
  for (int i = 0; i < 5000; ++i) deep_blocks += "{% if true %}";
  EXPECT_FALSE(Template::Parse(deep_blocks).ok());
}

// The rendered example of shared/specs/serving.md §2.3 (GLM-4.7 / GLM-5), through the corpus
// template tests/chat_templates/templates/glm47.jinja.
TEST(JinjaTemplate, Glm47SpecExample) {
  const char* dir = std::getenv("GLM_SOURCE_DIR");
  ASSERT_NE(dir, nullptr) << "GLM_SOURCE_DIR is set by ctest";
  std::ifstream in(std::string(dir) + "/tests/chat_templates/templates/glm47.jinja");
  ASSERT_TRUE(in) << "missing glm47.jinja";
  std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<Template> t = Template::Parse(source);
  ASSERT_TRUE(t.ok()) << t.status();
  Json context = Json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "Need tool.",
       "tool_calls": [{"type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
      {"role": "tool", "content": "18C"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true})");
  const std::string expected =
      "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with the "
      "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
      "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
      "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n</tools>\n\n"
      "For each function call, output the function name and arguments within the following XML "
      "format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
      "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
      "<|system|>Be brief.<|user|>Paris?<|assistant|><think>Need tool.</think><tool_call>get_weather"
      "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2"
      "</arg_value></tool_call><|observation|><tool_response>18C</tool_response><|assistant|><think>";
  EXPECT_EQ(*t->Render(context), expected);

  Json off = Json::parse(R"({"messages": [{"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    "add_generation_prompt": true, "enable_thinking": false})");
  EXPECT_EQ(*t->Render(off), "[gMASK]<sop><|user|>Hi<|assistant|></think>Hello!<|user|>2+2?<|assistant|></think>");
}

TEST(JinjaTemplate, CopiesRenderConcurrently) {
  absl::StatusOr<Template> parsed = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.k %}"
      "{{ m.k }},{% endfor %}={{ ns.n }}");
  ASSERT_TRUE(parsed.ok());
  const Template t = *parsed;  // copies share the parsed program
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      Json messages = Json::array();
      for (int k = 0; k <= i; ++k) messages.push_back({{"k", k}});
      for (int rep = 0; rep < 200; ++rep) results[i] = *t.Render({{"messages", messages}});
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(results[0], "0,=0");
  EXPECT_EQ(results[3], "0,1,2,3,=6");
  EXPECT_EQ(results[7], "0,1,2,3,4,5,6,7,=28");
}

}  // namespace
}  // namespace glm::jinja
