// The parsed template: expression and statement trees (jinja2/nodes.py, reduced to the subset
// glm_jinja supports). Built once by the parser, then only read, from any number of threads.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "controller/gateway/jinja/value.h"

namespace glm::jinja {

using FilterFn = Value (*)(Renderer& renderer, const Value& input, CallArgs& args);
using TestFn = bool (*)(Renderer& renderer, const Value& input, CallArgs& args);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // literal
    kName,     // name
    kList,     // items
    kTuple,    // items
    kDict,     // items: key, value, key, value, ...
    kGetAttr,  // a.name
    kGetItem,  // a[b]
    kSlice,    // a[b:c:d]; b/c/d may be null
    kCall,     // a(items, keywords)
    kFilter,   // a | name(items, keywords); a is null inside a filter block (the body)
    kTest,     // a is [not] name(items, keywords)
    kNeg,      // -a
    kPos,      // +a
    kNot,      // not a
    kBinary,   // a name b, name one of + - * / // % ** ~
    kCompare,  // a ops[0] items[0] ops[1] items[1] ...  (== != < <= > >= in notin)
    kAnd,      // a and b
    kOr,       // a or b
    kCond,     // b if a else c (c may be null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 1;
  int col = 1;
  size_t begin = 0;  // source span, for error messages
  size_t end = 0;
  Value literal;
  std::string name;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  bool negated = false;        // kTest: `is not`
  FilterFn filter = nullptr;   // kFilter; null: unknown filter (an error if evaluated)
  TestFn test = nullptr;       // kTest; null: unknown test (an error if evaluated)
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind : uint8_t {
    kData,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i]; else_body
    kFor,          // for targets in expr [if cond] body [else else_body]
    kSet,          // set targets = expr  |  set targets[0].attr = expr (attr non-empty)
    kSetBlock,     // set targets[0] [| expr filter chain] body endset
    kMacro,        // macro name(params = defaults) body
    kBreak,
    kContinue,
    kFilterBlock,  // filter expr body endfilter (expr: a filter chain whose innermost a is null)
    kWith,         // with targets = values body
  };
  Kind kind = Kind::kData;
  int line = 1;
  int col = 1;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  bool unpack = false;  // targets came from a tuple: unpack the value
  std::string attr;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned with params (kMacro) or values (kWith)
};

struct Program {
  std::string source;  // newline-normalized; Expr spans index it
  Body body;
};

// The builtin filters and tests (builtins.cc); null when unknown.
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);

}  // namespace glm::jinja
