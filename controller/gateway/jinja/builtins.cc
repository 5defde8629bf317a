// Python operators, jinja2's builtin filters and tests, str/dict/list methods and the globals
// transformers provides, each following the Python/jinja2 3.1 function it names.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "controller/gateway/jinja/ast.h"
#include "controller/gateway/jinja/interpreter.h"
#include "controller/gateway/jinja/text.h"

namespace glm::jinja {
namespace {

constexpr std::string_view kUnsafePrefix = "access to attribute ";
constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

// Binds call arguments to parameter names like a Python signature (no *args).
class Params {
 public:
  Params(const CallArgs& args, std::string_view fn, std::initializer_list<std::string_view> names)
      : names_(names), values_(names.size()) {
    if (args.positional.size() > names_.size()) {
      Fail(Cat(fn, "() takes at most ", names_.size(), " argument(s) (",
                        args.positional.size(), " given)"));
    }
    for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = &args.positional[i];
    for (const auto& [key, value] : args.keywords) {
      size_t i = 0;
      while (i < names_.size() && names_[i] != key) ++i;
      if (i == names_.size()) Fail(Cat(fn, "() got an unexpected keyword argument '", key, "'"));
      if (values_[i] != nullptr) Fail(Cat(fn, "() got multiple values for argument '", key, "'"));
      values_[i] = &value;
    }
  }
  bool Has(size_t i) const { return values_[i] != nullptr; }
  // Given and not None.
  bool HasValue(size_t i) const { return values_[i] != nullptr && !values_[i]->is_none(); }
  Value Get(size_t i, Value def = Value::None()) const { return values_[i] ? *values_[i] : def; }
  const Value& Ref(size_t i) const { return *values_[i]; }

 private:
  std::vector<std::string_view> names_;
  std::vector<const Value*> values_;
};

[[noreturn]] void FailUndefined(const Value& v) { Fail(v.undefined_reason()); }

int64_t AsIndex(const Value& v, std::string_view what) {
  if (v.is_undefined()) FailUndefined(v);
  if (!v.is_int()) Fail(Cat("TypeError: '", TypeName(v), "' object cannot be interpreted as an integer (", what, ")"));
  return v.as_int();
}

std::string AsString(const Value& v, std::string_view what) {
  if (v.is_undefined()) FailUndefined(v);
  if (!v.is_string()) Fail(Cat("TypeError: ", what, " must be str, not ", TypeName(v)));
  return v.str();
}

int64_t CheckedMul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) Fail("OverflowError: integer overflow (64-bit integers)");
  return r;
}

Value Repeat(Renderer& r, const Value& seq, int64_t count) {
  if (count < 0) count = 0;
  if (seq.is_string()) {
    size_t total = static_cast<size_t>(CheckedMul(static_cast<int64_t>(seq.str().size()), count));
    r.CheckStringSize(total);
    r.Step(static_cast<int64_t>(total / 64));
    std::string out;
    out.reserve(total);
    for (int64_t i = 0; i < count; ++i) out += seq.str();
    return Value::Str(std::move(out));
  }
  size_t total = static_cast<size_t>(CheckedMul(static_cast<int64_t>(seq.list().size()), count));
  r.CheckListSize(total);
  r.Step(static_cast<int64_t>(total));
  List out;
  out.reserve(total);
  for (int64_t i = 0; i < count; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return seq.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out)) : Value::MakeList(std::move(out));
}

// printf-style `str % args` for %s %r %d %i %f %%.
std::string PercentFormat(const std::string& fmt, const Value& args) {
  List items;
  if (args.kind() == Value::Kind::kTuple) {
    items = args.list();
  } else {
    items.push_back(args);
  }
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) Fail("ValueError: incomplete format");
    char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= items.size()) Fail("TypeError: not enough arguments for format string");
    const Value& v = items[next++];
    if (c == 's') {
      out += PyStr(v);
    } else if (c == 'r') {
      out += PyRepr(v);
    } else if (c == 'd' || c == 'i') {
      if (!v.is_number()) Fail("TypeError: %d format: a real number is required, not " + TypeName(v));
      out += std::to_string(v.kind() == Value::Kind::kFloat ? static_cast<int64_t>(v.as_float()) : v.as_int());
    } else if (c == 'f') {
      if (!v.is_number()) Fail("TypeError: must be real number, not " + TypeName(v));
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%f", v.as_float());
      out += buf;
    } else {
      Fail(Cat("unsupported format character '", std::string(1, c), "'"));
    }
  }
  if (next < items.size() && args.kind() == Value::Kind::kTuple) {
    Fail("TypeError: not all arguments converted during string formatting");
  }
  return out;
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (item.is_undefined()) FailUndefined(item);
      if (!item.is_string()) {
        Fail("TypeError: 'in <string>' requires string as left operand, not " + TypeName(item));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& v : container.list()) {
        if (PyEquals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict: return container.dict().Find(item) != nullptr;
    default:
      Fail("TypeError: argument of type '" + TypeName(container) + "' is not iterable");
  }
}

// Python `a < b`; TypeError for unorderable types.
bool Less(const Value& a, const Value& b, std::string_view op = "<") {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_sequence() && a.kind() == b.kind()) {
    const List& x = a.list();
    const List& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!PyEquals(x[i], y[i])) return Less(x[i], y[i], op);
    }
    return x.size() < y.size();
  }
  Fail(Cat("TypeError: '", op, "' not supported between instances of '", TypeName(a), "' and '",
                    TypeName(b), "'"));
}

// jinja2's make_attrgetter: "a.b.0" looked up with getitem per part.
Value GetAttrPath(Renderer& r, const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = r.GetItem(v, digits ? Value::Int(std::atoll(part.c_str())) : Value::Str(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// ---- methods ------------------------------------------------------------------------------------

using MethodImpl = Value (*)(Renderer&, const Value& self, CallArgs&);

class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string name, MethodImpl impl)
      : self_(std::move(self)), name_(std::move(name)), impl_(impl) {}
  Value Call(Renderer& renderer, CallArgs& args) const override { return impl_(renderer, self_, args); }
  std::string Repr() const override {
    return Cat("<built-in method ", name_, " of ", TypeName(self_), " object>");
  }

 private:
  Value self_;
  std::string name_;
  MethodImpl impl_;
};

std::optional<std::string> OptString(const Params& p, size_t i, std::string_view what) {
  if (!p.HasValue(i)) return std::nullopt;
  return AsString(p.Ref(i), what);
}

Value StrStrip(const Value& self, CallArgs& args, StripSide side, std::string_view name) {
  Params p(args, name, {"chars"});
  return Value::Str(std::string(PyStrip(self.str(), OptString(p, 0, "chars"), side)));
}

Value StrAffix(const Value& self, CallArgs& args, bool prefix) {
  Params p(args, prefix ? "startswith" : "endswith", {"prefix"});
  if (!p.Has(0)) Fail("TypeError: startswith/endswith takes at least 1 argument");
  const Value& arg = p.Ref(0);
  List options;
  if (arg.kind() == Value::Kind::kTuple) {
    options = arg.list();
  } else {
    options.push_back(arg);
  }
  const std::string& s = self.str();
  for (const Value& o : options) {
    std::string x = AsString(o, "startswith/endswith argument");
    if (x.size() <= s.size() &&
        (prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

Value StrSplit(const Value& self, CallArgs& args, bool from_right) {
  Params p(args, from_right ? "rsplit" : "split", {"sep", "maxsplit"});
  int64_t maxsplit = p.Has(1) ? AsIndex(p.Ref(1), "maxsplit") : -1;
  List out;
  for (auto& part : PySplit(self.str(), OptString(p, 0, "sep"), maxsplit, from_right)) {
    out.push_back(Value::Str(std::move(part)));
  }
  return Value::MakeList(std::move(out));
}

Value StrFind(const Value& self, CallArgs& args, bool from_right, bool must_find) {
  Params p(args, "find", {"sub"});
  if (!p.Has(0)) Fail("TypeError: find() takes at least 1 argument");
  int64_t at = PyFind(self.str(), AsString(p.Ref(0), "substring"), from_right);
  if (at < 0 && must_find) Fail("ValueError: substring not found");
  return Value::Int(at);
}

Value StrJoin(Renderer& r, const Value& self, CallArgs& args) {
  Params p(args, "join", {"iterable"});
  if (!p.Has(0)) Fail("TypeError: join() takes exactly one argument");
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(p.Ref(0))) {
    if (!first) out += self.str();
    first = false;
    if (!item.is_string()) Fail("TypeError: sequence item: expected str instance, " + TypeName(item) + " found");
    out += item.str();
    r.CheckStringSize(out.size());
  }
  return Value::Str(std::move(out));
}

Value StrMethod(Renderer& r, const Value& self, CallArgs& args, const std::string& name) {
  const std::string& s = self.str();
  const auto no_args = [&] { Params p(args, name, {}); };
  if (name == "strip") return StrStrip(self, args, StripSide::kBoth, name);
  if (name == "lstrip") return StrStrip(self, args, StripSide::kLeft, name);
  if (name == "rstrip") return StrStrip(self, args, StripSide::kRight, name);
  if (name == "startswith") return StrAffix(self, args, true);
  if (name == "endswith") return StrAffix(self, args, false);
  if (name == "split") return StrSplit(self, args, false);
  if (name == "rsplit") return StrSplit(self, args, true);
  if (name == "find") return StrFind(self, args, false, false);
  if (name == "rfind") return StrFind(self, args, true, false);
  if (name == "index") return StrFind(self, args, false, true);
  if (name == "rindex") return StrFind(self, args, true, true);
  if (name == "join") return StrJoin(r, self, args);
  if (name == "replace") {
    Params p(args, name, {"old", "new", "count"});
    if (!p.Has(1)) Fail("TypeError: replace() takes at least 2 arguments");
    int64_t count = p.Has(2) ? AsIndex(p.Ref(2), "count") : -1;
    std::string out = PyReplace(s, AsString(p.Ref(0), "old"), AsString(p.Ref(1), "new"), count);
    r.CheckStringSize(out.size());
    return Value::Str(std::move(out));
  }
  if (name == "count") {
    Params p(args, name, {"sub"});
    if (!p.Has(0)) Fail("TypeError: count() takes at least 1 argument");
    return Value::Int(PyCount(s, AsString(p.Ref(0), "substring")));
  }
  if (name == "splitlines") {
    Params p(args, name, {"keepends"});
    List out;
    for (auto& line : PySplitLines(s, Truthy(p.Get(0, Value::Bool(false))))) out.push_back(Value::Str(std::move(line)));
    return Value::MakeList(std::move(out));
  }
  no_args();
  if (name == "upper") return Value::Str(PyUpper(s));
  if (name == "lower") return Value::Str(PyLower(s));
  if (name == "title") return Value::Str(PyTitle(s));
  if (name == "capitalize") return Value::Str(PyCapitalize(s));
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") return Value::Bool(PyIsDigit(s));
  if (name == "isalpha") return Value::Bool(PyIsAlpha(s));
  if (name == "isspace") return Value::Bool(PyIsSpace(s));
  if (name == "islower") return Value::Bool(PyIsLower(s));
  if (name == "isupper") return Value::Bool(PyIsUpper(s));
  Fail("str." + name + "() is not supported");
}

constexpr std::string_view kStrMethods[] = {
    "strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit", "find", "rfind",
    "index", "rindex", "join", "replace", "count", "splitlines", "upper", "lower", "title",
    "capitalize", "isdigit", "isnumeric", "isdecimal", "isalpha", "isspace", "islower", "isupper"};

class StrMethodFn : public Callable {
 public:
  StrMethodFn(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  Value Call(Renderer& renderer, CallArgs& args) const override {
    return StrMethod(renderer, self_, args, name_);
  }
  std::string Repr() const override { return "<built-in method " + name_ + " of str object>"; }

 private:
  Value self_;
  std::string name_;
};

Value DictItems(Renderer&, const Value& self, CallArgs& args) {
  Params p(args, "items", {});
  List out;
  for (const auto& [k, v] : self.dict().items) out.push_back(Value::MakeTuple({k, v}));
  return Value::MakeList(std::move(out));
}
Value DictKeys(Renderer&, const Value& self, CallArgs& args) {
  Params p(args, "keys", {});
  List out;
  for (const auto& [k, v] : self.dict().items) out.push_back(k);
  return Value::MakeList(std::move(out));
}
Value DictValues(Renderer&, const Value& self, CallArgs& args) {
  Params p(args, "values", {});
  List out;
  for (const auto& [k, v] : self.dict().items) out.push_back(v);
  return Value::MakeList(std::move(out));
}
Value DictGet(Renderer&, const Value& self, CallArgs& args) {
  Params p(args, "get", {"key", "default"});
  if (!p.Has(0)) Fail("TypeError: get expected at least 1 argument, got 0");
  if (const Value* v = self.dict().Find(p.Ref(0))) return *v;
  return p.Get(1);
}
Value ListIndex(Renderer&, const Value& self, CallArgs& args) {
  Params p(args, "index", {"value"});
  if (!p.Has(0)) Fail("TypeError: index expected 1 argument");
  for (size_t i = 0; i < self.list().size(); ++i) {
    if (PyEquals(self.list()[i], p.Ref(0))) return Value::Int(static_cast<int64_t>(i));
  }
  Fail("ValueError: " + PyRepr(p.Ref(0)) + " is not in list");
}
Value ListCount(Renderer&, const Value& self, CallArgs& args) {
  Params p(args, "count", {"value"});
  if (!p.Has(0)) Fail("TypeError: count expected 1 argument");
  int64_t n = 0;
  for (const Value& v : self.list()) n += PyEquals(v, p.Ref(0)) ? 1 : 0;
  return Value::Int(n);
}
Value LoopCycle(Renderer&, const Value& self, CallArgs& args) {
  if (args.positional.empty()) Fail("TypeError: no items for cycling given");
  return args.positional[static_cast<size_t>(self.loop().index0) % args.positional.size()];
}

Value Unsafe(const std::string& name, const Value& obj) {
  return Value::Undefined(Cat(kUnsafePrefix, "'", name, "' of '", TypeName(obj), "' object is unsafe."));
}

// ---- filters ------------------------------------------------------------------------------------

int64_t Len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return Utf8Length(v.str());
    case Value::Kind::kList:
    case Value::Kind::kTuple: return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict().items.size());
    default: Fail("TypeError: object of type '" + TypeName(v) + "' has no len()");
  }
}

Value FilterTojson(Renderer& r, const Value& x, CallArgs& args) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  Params p(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = Truthy(p.Get(0, Value::Bool(false)));
  if (p.HasValue(1)) {
    const Value& indent = p.Ref(1);
    o.has_indent = true;
    o.item_separator = ",";
    if (indent.is_string()) {
      o.indent = indent.str();
    } else if (indent.is_int()) {
      int64_t n = indent.as_int();
      if (n > 1000) Fail("tojson: indent too large");
      o.indent = std::string(n > 0 ? static_cast<size_t>(n) : 0, ' ');
    } else {
      Fail("TypeError: tojson indent must be an int or a str, not " + TypeName(indent));
    }
  }
  if (p.HasValue(2)) {
    const Value& sep = p.Ref(2);
    if (!sep.is_sequence() || sep.list().size() != 2) Fail("ValueError: tojson separators must be a pair");
    o.item_separator = AsString(sep.list()[0], "item separator");
    o.key_separator = AsString(sep.list()[1], "key separator");
  }
  o.sort_keys = Truthy(p.Get(3, Value::Bool(false)));
  std::string out = JsonDumps(x, o);
  r.CheckStringSize(out.size());
  return Value::Str(std::move(out));
}

Value FilterString(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "string", {});
  return x.is_string() ? x : Value::Str(PyStr(x));
}

Value FilterTrim(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "trim", {"chars"});
  return Value::Str(std::string(PyStrip(PyStr(x), OptString(p, 0, "chars"), StripSide::kBoth)));
}

Value FilterLength(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "length", {});
  return Value::Int(Len(x));
}

Value FilterFirst(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "first", {});
  List items = Iterate(x);
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Value FilterLast(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "last", {});
  List items = Iterate(x);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Value FilterJoin(Renderer& r, const Value& x, CallArgs& args) {
  Params p(args, "join", {"d", "attribute"});
  std::string sep = p.Has(0) ? PyStr(p.Ref(0)) : "";
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(x)) {
    if (!first) out += sep;
    first = false;
    out += PyStr(p.HasValue(1) ? GetAttrPath(r, item, PyStr(p.Ref(1))) : item);
    r.CheckStringSize(out.size());
  }
  return Value::Str(std::move(out));
}

Value FilterUpper(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "upper", {});
  return Value::Str(PyUpper(PyStr(x)));
}
Value FilterLower(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "lower", {});
  return Value::Str(PyLower(PyStr(x)));
}
Value FilterTitle(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "title", {});
  return Value::Str(JinjaTitle(PyStr(x)));
}
Value FilterCapitalize(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "capitalize", {});
  return Value::Str(PyCapitalize(PyStr(x)));
}

Value FilterReplace(Renderer& r, const Value& x, CallArgs& args) {
  Params p(args, "replace", {"old", "new", "count"});
  if (!p.Has(1)) Fail("TypeError: replace() missing required arguments 'old' and 'new'");
  int64_t count = p.HasValue(2) ? AsIndex(p.Ref(2), "count") : -1;
  std::string out = PyReplace(PyStr(x), PyStr(p.Ref(0)), PyStr(p.Ref(1)), count);
  r.CheckStringSize(out.size());
  return Value::Str(std::move(out));
}

Value FilterDefault(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "default", {"default_value", "boolean"});
  bool boolean = Truthy(p.Get(1, Value::Bool(false)));
  if (x.is_undefined() || (boolean && !Truthy(x))) return p.Get(0, Value::Str(""));
  return x;
}

Value FilterItems(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "items", {});
  if (x.is_undefined()) return Value::MakeList({});
  if (!x.is_dict()) Fail("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, v] : x.dict().items) out.push_back(Value::MakeTuple({k, v}));
  return Value::MakeList(std::move(out));
}

Value FilterList(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "list", {});
  return Value::MakeList(Iterate(x));
}

Value FilterMap(Renderer& r, const Value& x, CallArgs& args) {
  List items = Iterate(x);
  List out;
  if (args.positional.empty()) {
    Params p(args, "map", {"attribute", "default"});
    if (!p.Has(0)) Fail("map: expected a filter name or attribute=");
    std::string attribute = PyStr(p.Ref(0));
    for (const Value& item : items) {
      Value v = GetAttrPath(r, item, attribute);
      if (v.is_undefined() && p.Has(1)) v = p.Ref(1);
      out.push_back(std::move(v));
    }
    return Value::MakeList(std::move(out));
  }
  std::string name = AsString(args.positional[0], "map filter name");
  FilterFn fn = FindFilter(name);
  if (fn == nullptr) Fail("no filter named '" + name + "'");
  for (const Value& item : items) {
    CallArgs inner;
    inner.positional.assign(args.positional.begin() + 1, args.positional.end());
    inner.keywords = args.keywords;
    out.push_back(fn(r, item, inner));
  }
  return Value::MakeList(std::move(out));
}

// select/reject/selectattr/rejectattr.
Value SelectImpl(Renderer& r, const Value& x, CallArgs& args, bool with_attr, bool keep_when) {
  const char* fname = with_attr ? (keep_when ? "selectattr" : "rejectattr") : (keep_when ? "select" : "reject");
  size_t next = 0;
  std::optional<std::string> attribute;
  if (with_attr) {
    if (args.positional.empty()) Fail(Cat(fname, ": missing the attribute name"));
    attribute = PyStr(args.positional[next++]);
  }
  TestFn test = nullptr;
  if (next < args.positional.size()) {
    std::string name = AsString(args.positional[next++], "test name");
    test = FindTest(name);
    if (test == nullptr) Fail("no test named '" + name + "'");
  }
  List out;
  for (const Value& item : Iterate(x)) {
    Value subject = attribute ? GetAttrPath(r, item, *attribute) : item;
    bool ok = false;
    if (test == nullptr) {
      ok = Truthy(subject);
    } else {
      CallArgs inner;
      inner.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end());
      inner.keywords = args.keywords;
      ok = test(r, subject, inner);
    }
    if (ok == keep_when) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}
Value FilterSelect(Renderer& r, const Value& x, CallArgs& a) { return SelectImpl(r, x, a, false, true); }
Value FilterReject(Renderer& r, const Value& x, CallArgs& a) { return SelectImpl(r, x, a, false, false); }
Value FilterSelectAttr(Renderer& r, const Value& x, CallArgs& a) { return SelectImpl(r, x, a, true, true); }
Value FilterRejectAttr(Renderer& r, const Value& x, CallArgs& a) { return SelectImpl(r, x, a, true, false); }

// Python float(str): optional whitespace, sign, digits, inf/nan.
std::optional<double> ParseFloat(std::string_view text) {
  std::string s(PyStrip(text, std::nullopt, StripSide::kBoth));
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

Value FilterInt(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "int", {"default", "base"});
  Value def = p.Get(0, Value::Int(0));
  int base = p.Has(1) ? static_cast<int>(AsIndex(p.Ref(1), "base")) : 10;
  if (x.is_int()) return Value::Int(x.as_int());
  if (x.kind() == Value::Kind::kFloat) {
    double d = x.as_float();
    if (std::isnan(d) || std::isinf(d) || std::fabs(d) >= 9.2e18) Fail("OverflowError: cannot convert float to integer");
    return Value::Int(static_cast<int64_t>(d));
  }
  if (x.is_string()) {
    std::string s(PyStrip(x.str(), std::nullopt, StripSide::kBoth));
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty() && base >= 2 && base <= 36) {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(s.c_str(), &end, base);
      if (end == s.c_str() + s.size() && errno == 0) return Value::Int(v);
    }
    if (std::optional<double> d = ParseFloat(x.str()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
      return Value::Int(static_cast<int64_t>(*d));
    }
  }
  return def;
}

Value FilterFloat(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "float", {"default"});
  if (x.is_number()) return Value::Float(x.as_float());
  if (x.is_string()) {
    if (std::optional<double> d = ParseFloat(x.str())) return Value::Float(*d);
  }
  return p.Get(0, Value::Float(0.0));
}

Value FilterAbs(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "abs", {});
  if (x.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(x.as_float()));
  if (x.is_int()) {
    if (x.as_int() == INT64_MIN) Fail("OverflowError: integer overflow");
    return Value::Int(x.as_int() < 0 ? -x.as_int() : x.as_int());
  }
  if (x.is_undefined()) FailUndefined(x);
  Fail("TypeError: bad operand type for abs(): '" + TypeName(x) + "'");
}

Value FilterRound(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "round", {"precision", "method"});
  int64_t precision = p.Has(0) ? AsIndex(p.Ref(0), "precision") : 0;
  std::string method = p.Has(1) ? PyStr(p.Ref(1)) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    Fail("FilterArgumentError: method must be common, ceil or floor");
  }
  if (x.is_undefined()) FailUndefined(x);
  if (!x.is_number()) Fail("TypeError: type " + TypeName(x) + " doesn't define __round__ method");
  if (precision > 300) precision = 300;
  if (precision < -300) precision = -300;
  if (method == "common") {
    if (x.is_int()) return Value::Int(x.as_int());  // Python round(int, n >= 0) keeps the int
    double d = x.as_float();
    if (!std::isfinite(d)) return x;
    if (precision >= 0) {
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), d);  // exact, half-even
      return Value::Float(std::strtod(buf, nullptr));
    }
    double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value::Float(std::nearbyint(d / scale) * scale);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double v = x.as_float() * scale;
  return Value::Float((method == "ceil" ? std::ceil(v) : std::floor(v)) / scale);
}

Value FilterIndent(Renderer& r, const Value& x, CallArgs& args) {
  Params p(args, "indent", {"width", "first", "blank"});
  std::string indention;
  Value width = p.Get(0, Value::Int(4));
  if (width.is_string()) {
    indention = width.str();
  } else {
    int64_t n = AsIndex(width, "width");
    if (n > 10000) Fail("indent: width too large");
    indention = std::string(n > 0 ? static_cast<size_t>(n) : 0, ' ');
  }
  bool first = Truthy(p.Get(1, Value::Bool(false)));
  bool blank = Truthy(p.Get(2, Value::Bool(false)));
  std::string s = AsString(x, "indent input") + "\n";
  std::vector<std::string> lines = PySplitLines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += indention;
        rv += lines[i];
      }
    }
  }
  if (first) rv = indention + rv;
  r.CheckStringSize(rv.size());
  return Value::Str(std::move(rv));
}

Value FilterSafe(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "safe", {});
  return x;
}

Value FilterEscape(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "escape", {});
  std::string out;
  for (char c : PyStr(x)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::Str(std::move(out));
}

// Sort key for sort/unique/min/max: attribute lookup and case folding of strings.
Value SortKey(Renderer& r, const Value& item, const std::optional<std::string>& attribute, bool case_sensitive) {
  Value v = attribute ? GetAttrPath(r, item, *attribute) : item;
  if (!case_sensitive && v.is_string()) return Value::Str(PyLower(v.str()));
  return v;
}

Value FilterSort(Renderer& r, const Value& x, CallArgs& args) {
  Params p(args, "sort", {"reverse", "case_sensitive", "attribute"});
  bool reverse = Truthy(p.Get(0, Value::Bool(false)));
  bool case_sensitive = Truthy(p.Get(1, Value::Bool(false)));
  std::optional<std::string> attribute;
  if (p.HasValue(2)) attribute = PyStr(p.Ref(2));
  List items = Iterate(x);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(SortKey(r, items[i], attribute, case_sensitive), i);
  r.Step(static_cast<int64_t>(items.size()) * 8);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? Less(b.first, a.first) : Less(a.first, b.first);
  });
  List out;
  for (const auto& [key, i] : keyed) out.push_back(items[i]);
  return Value::MakeList(std::move(out));
}

Value FilterUnique(Renderer& r, const Value& x, CallArgs& args) {
  Params p(args, "unique", {"case_sensitive", "attribute"});
  bool case_sensitive = Truthy(p.Get(0, Value::Bool(false)));
  std::optional<std::string> attribute;
  if (p.HasValue(1)) attribute = PyStr(p.Ref(1));
  List out;
  List seen;
  for (const Value& item : Iterate(x)) {
    Value key = SortKey(r, item, attribute, case_sensitive);
    bool dup = false;
    for (const Value& s : seen) dup = dup || PyEquals(s, key);
    r.Step(static_cast<int64_t>(seen.size()));
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeList(std::move(out));
}

Value MinMax(Renderer& r, const Value& x, CallArgs& args, bool want_max) {
  Params p(args, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  bool case_sensitive = Truthy(p.Get(0, Value::Bool(false)));
  std::optional<std::string> attribute;
  if (p.HasValue(1)) attribute = PyStr(p.Ref(1));
  List items = Iterate(x);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = SortKey(r, items[0], attribute, case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = SortKey(r, items[i], attribute, case_sensitive);
    if (want_max ? Less(best_key, key) : Less(key, best_key)) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}
Value FilterMin(Renderer& r, const Value& x, CallArgs& a) { return MinMax(r, x, a, false); }
Value FilterMax(Renderer& r, const Value& x, CallArgs& a) { return MinMax(r, x, a, true); }

Value FilterSum(Renderer& r, const Value& x, CallArgs& args) {
  Params p(args, "sum", {"attribute", "start"});
  Value total = p.Get(1, Value::Int(0));
  for (const Value& item : Iterate(x)) {
    total = BinaryOp(r, "+", total, p.HasValue(0) ? GetAttrPath(r, item, PyStr(p.Ref(0))) : item);
  }
  return total;
}

Value FilterReverse(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "reverse", {});
  if (x.is_string()) {
    auto chars = Utf8Chars(x.str());
    std::string out;
    out.reserve(x.str().size());
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out.append(*it);
    return Value::Str(std::move(out));
  }
  List items = Iterate(x);
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

Value FilterFormat(Renderer&, const Value& x, CallArgs& args) {
  if (!args.keywords.empty()) Fail("format: keyword arguments are not supported");
  return Value::Str(PercentFormat(PyStr(x), Value::MakeTuple(args.positional)));
}

Value FilterWordcount(Renderer&, const Value& x, CallArgs& args) {
  Params p(args, "wordcount", {});
  int64_t n = 0;
  bool in_word = false;
  for (char c : PyStr(x)) {
    bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                (static_cast<unsigned char>(c) >= 0x80);
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value::Int(n);
}

const std::unordered_map<std::string_view, FilterFn>& Filters() {
  static const auto* filters = new std::unordered_map<std::string_view, FilterFn>{
      {"tojson", FilterTojson},   {"string", FilterString},     {"trim", FilterTrim},
      {"length", FilterLength},   {"count", FilterLength},      {"first", FilterFirst},
      {"last", FilterLast},       {"join", FilterJoin},         {"upper", FilterUpper},
      {"lower", FilterLower},     {"title", FilterTitle},       {"capitalize", FilterCapitalize},
      {"replace", FilterReplace}, {"default", FilterDefault},   {"d", FilterDefault},
      {"items", FilterItems},     {"list", FilterList},         {"map", FilterMap},
      {"select", FilterSelect},   {"reject", FilterReject},     {"selectattr", FilterSelectAttr},
      {"rejectattr", FilterRejectAttr}, {"int", FilterInt},     {"float", FilterFloat},
      {"abs", FilterAbs},         {"round", FilterRound},       {"indent", FilterIndent},
      {"safe", FilterSafe},       {"escape", FilterEscape},     {"e", FilterEscape},
      {"sort", FilterSort},       {"unique", FilterUnique},     {"min", FilterMin},
      {"max", FilterMax},         {"sum", FilterSum},           {"reverse", FilterReverse},
      {"format", FilterFormat},   {"wordcount", FilterWordcount},
  };
  return *filters;
}

// ---- tests --------------------------------------------------------------------------------------

const Value& OneArg(const CallArgs& args, const char* test) {
  if (args.positional.size() != 1 || !args.keywords.empty()) {
    Fail(Cat("test '", test, "' takes exactly one argument"));
  }
  return args.positional[0];
}
void NoArgs(const CallArgs& args, const char* test) {
  if (!args.positional.empty() || !args.keywords.empty()) Fail(Cat("test '", test, "' takes no arguments"));
}

#define GLM_SIMPLE_TEST(fn, name, expr)                  \
  bool fn(Renderer&, const Value& v, CallArgs& args) {   \
    NoArgs(args, name);                                  \
    return (expr);                                       \
  }
GLM_SIMPLE_TEST(TestDefined, "defined", !v.is_undefined())
GLM_SIMPLE_TEST(TestUndefined, "undefined", v.is_undefined())
GLM_SIMPLE_TEST(TestNone, "none", v.is_none())
GLM_SIMPLE_TEST(TestBoolean, "boolean", v.kind() == Value::Kind::kBool)
GLM_SIMPLE_TEST(TestTrue, "true", v.kind() == Value::Kind::kBool && v.as_bool())
GLM_SIMPLE_TEST(TestFalse, "false", v.kind() == Value::Kind::kBool && !v.as_bool())
GLM_SIMPLE_TEST(TestInteger, "integer", v.kind() == Value::Kind::kInt)
GLM_SIMPLE_TEST(TestFloat, "float", v.kind() == Value::Kind::kFloat)
GLM_SIMPLE_TEST(TestNumber, "number", v.is_number())
GLM_SIMPLE_TEST(TestString, "string", v.is_string())
GLM_SIMPLE_TEST(TestMapping, "mapping", v.is_dict())
GLM_SIMPLE_TEST(TestIterable, "iterable",
                v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict())
GLM_SIMPLE_TEST(TestSequence, "sequence",
                v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict())
GLM_SIMPLE_TEST(TestCallable, "callable", v.is_undefined() || v.kind() == Value::Kind::kCallable)
GLM_SIMPLE_TEST(TestLower, "lower", v.is_string() && PyIsLower(v.str()))
GLM_SIMPLE_TEST(TestUpper, "upper", v.is_string() && PyIsUpper(v.str()))
#undef GLM_SIMPLE_TEST

Value ModValue(Renderer& r, const Value& v, const Value& n) { return BinaryOp(r, "%", v, n); }

bool TestOdd(Renderer& r, const Value& v, CallArgs& args) {
  NoArgs(args, "odd");
  return PyEquals(ModValue(r, v, Value::Int(2)), Value::Int(1));
}
bool TestEven(Renderer& r, const Value& v, CallArgs& args) {
  NoArgs(args, "even");
  return PyEquals(ModValue(r, v, Value::Int(2)), Value::Int(0));
}
bool TestDivisibleBy(Renderer& r, const Value& v, CallArgs& args) {
  return PyEquals(ModValue(r, v, OneArg(args, "divisibleby")), Value::Int(0));
}
bool TestEq(Renderer&, const Value& v, CallArgs& args) { return CompareOp("==", v, OneArg(args, "eq")); }
bool TestNe(Renderer&, const Value& v, CallArgs& args) { return CompareOp("!=", v, OneArg(args, "ne")); }
bool TestLt(Renderer&, const Value& v, CallArgs& args) { return CompareOp("<", v, OneArg(args, "lt")); }
bool TestLe(Renderer&, const Value& v, CallArgs& args) { return CompareOp("<=", v, OneArg(args, "le")); }
bool TestGt(Renderer&, const Value& v, CallArgs& args) { return CompareOp(">", v, OneArg(args, "gt")); }
bool TestGe(Renderer&, const Value& v, CallArgs& args) { return CompareOp(">=", v, OneArg(args, "ge")); }
bool TestIn(Renderer&, const Value& v, CallArgs& args) { return CompareOp("in", v, OneArg(args, "in")); }
bool TestSameAs(Renderer&, const Value& v, CallArgs& args) {
  const Value& other = OneArg(args, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kUndefined: return true;
    case Value::Kind::kBool: return v.as_bool() == other.as_bool();
    case Value::Kind::kInt: return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    default: return false;
  }
}
bool TestFilter(Renderer&, const Value& v, CallArgs& args) {
  NoArgs(args, "filter");
  return v.is_string() && FindFilter(v.str()) != nullptr;
}
bool TestTest(Renderer&, const Value& v, CallArgs& args) {
  NoArgs(args, "test");
  return v.is_string() && FindTest(v.str()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& Tests() {
  static const auto* tests = new std::unordered_map<std::string_view, TestFn>{
      {"defined", TestDefined},   {"undefined", TestUndefined}, {"none", TestNone},
      {"boolean", TestBoolean},   {"true", TestTrue},           {"false", TestFalse},
      {"integer", TestInteger},   {"float", TestFloat},         {"number", TestNumber},
      {"string", TestString},     {"mapping", TestMapping},     {"iterable", TestIterable},
      {"sequence", TestSequence}, {"callable", TestCallable},   {"lower", TestLower},
      {"upper", TestUpper},       {"odd", TestOdd},             {"even", TestEven},
      {"divisibleby", TestDivisibleBy}, {"eq", TestEq},         {"equalto", TestEq},
      {"==", TestEq},             {"ne", TestNe},               {"!=", TestNe},
      {"lt", TestLt},             {"lessthan", TestLt},         {"<", TestLt},
      {"le", TestLe},             {"<=", TestLe},               {"gt", TestGt},
      {"greaterthan", TestGt},    {">", TestGt},                {"ge", TestGe},
      {">=", TestGe},             {"in", TestIn},               {"sameas", TestSameAs},
      {"filter", TestFilter},     {"test", TestTest},
  };
  return *tests;
}

// ---- globals ------------------------------------------------------------------------------------

class NativeFn : public Callable {
 public:
  using Impl = Value (*)(Renderer&, CallArgs&);
  NativeFn(std::string name, Impl impl) : name_(std::move(name)), impl_(impl) {}
  Value Call(Renderer& renderer, CallArgs& args) const override { return impl_(renderer, args); }
  std::string Repr() const override { return "<function " + name_ + ">"; }

 private:
  std::string name_;
  Impl impl_;
};

Value GlobalRange(Renderer& r, CallArgs& args) {
  if (!args.keywords.empty()) Fail("TypeError: range() takes no keyword arguments");
  const List& a = args.positional;
  if (a.empty() || a.size() > 3) Fail(Cat("TypeError: range expected 1 to 3 arguments, got ", a.size()));
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (a.size() == 1) {
    stop = AsIndex(a[0], "range");
  } else {
    start = AsIndex(a[0], "range");
    stop = AsIndex(a[1], "range");
    if (a.size() == 3) step = AsIndex(a[2], "range");
  }
  if (step == 0) Fail("ValueError: range() arg 3 must not be zero");
  uint64_t count = 0;
  if (step > 0 && stop > start) {
    count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
  }
  if (step < 0 && stop < start) {
    count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / (0 - static_cast<uint64_t>(step)) + 1;
  }
  if (count > static_cast<uint64_t>(kMaxRange)) {
    Fail("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  r.Step(static_cast<int64_t>(count));
  List out;
  out.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) out.push_back(Value::Int(start + static_cast<int64_t>(i) * step));
  return Value::MakeList(std::move(out));
}

// dict(mapping_or_pairs?, **kwargs), as Python's dict() and jinja2's Namespace() take them.
Dict BuildDict(const CallArgs& args, const char* name) {
  Dict dict;
  if (args.positional.size() > 1) Fail(Cat(name, "() expected at most 1 positional argument"));
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict()) {
      dict = src.dict();
    } else {
      for (const Value& pair : Iterate(src)) {
        List kv = Iterate(pair);
        if (kv.size() != 2) Fail(Cat(name, "(): sequence elements must have length 2"));
        dict.Set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keywords) dict.Set(Value::Str(key), value);
  return dict;
}

Value GlobalDict(Renderer&, CallArgs& args) { return Value::MakeDict(BuildDict(args, "dict")); }

Value GlobalNamespace(Renderer&, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  ns->attrs = BuildDict(args, "namespace");
  return Value::MakeNamespace(std::move(ns));
}

Value GlobalRaiseException(Renderer&, CallArgs& args) {
  Params p(args, "raise_exception", {"message"});
  throw RenderError{absl::StatusCode::kInvalidArgument, p.Has(0) ? PyStr(p.Ref(0)) : "", true};
}

Value GlobalStrftimeNow(Renderer& r, CallArgs& args) {
  Params p(args, "strftime_now", {"format"});
  if (!p.Has(0)) Fail("TypeError: strftime_now() missing 1 required positional argument: 'format'");
  std::string fmt = AsString(p.Ref(0), "format");
  if (fmt.empty()) return Value::Str("");
  std::time_t now = r.Now();
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string buf(fmt.size() * 8 + 256, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::Str(std::move(buf));
}

}  // namespace

FilterFn FindFilter(std::string_view name) {
  auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : it->second;
}

TestFn FindTest(std::string_view name) {
  auto it = Tests().find(name);
  return it == Tests().end() ? nullptr : it->second;
}

bool IsUnsafe(const Value& v) {
  return v.is_undefined() && v.undefined_reason().rfind(kUnsafePrefix, 0) == 0;
}

Value MethodOf(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kString:
      for (std::string_view m : kStrMethods) {
        if (m == name) return Value::MakeCallable(std::make_shared<StrMethodFn>(obj, name));
      }
      break;
    case Value::Kind::kDict:
      if (name == "items") return Value::MakeCallable(std::make_shared<BoundMethod>(obj, name, DictItems));
      if (name == "keys") return Value::MakeCallable(std::make_shared<BoundMethod>(obj, name, DictKeys));
      if (name == "values") return Value::MakeCallable(std::make_shared<BoundMethod>(obj, name, DictValues));
      if (name == "get") return Value::MakeCallable(std::make_shared<BoundMethod>(obj, name, DictGet));
      if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear") {
        return Unsafe(name, obj);
      }
      break;
    case Value::Kind::kList:
      if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
          name == "reverse" || name == "sort" || name == "clear") {
        return Unsafe(name, obj);
      }
      [[fallthrough]];
    case Value::Kind::kTuple:
      if (name == "index") return Value::MakeCallable(std::make_shared<BoundMethod>(obj, name, ListIndex));
      if (name == "count") return Value::MakeCallable(std::make_shared<BoundMethod>(obj, name, ListCount));
      break;
    case Value::Kind::kLoop:
      if (name == "cycle") return Value::MakeCallable(std::make_shared<BoundMethod>(obj, name, LoopCycle));
      break;
    default:
      break;
  }
  return Value::Undefined("'" + TypeName(obj) + " object' has no attribute '" + name + "'");
}

Value MakeGlobals() {
  Dict globals;
  const auto add = [&](const char* name, NativeFn::Impl impl) {
    globals.Set(Value::Str(name), Value::MakeCallable(std::make_shared<NativeFn>(name, impl)));
  };
  add("range", GlobalRange);
  add("dict", GlobalDict);
  add("namespace", GlobalNamespace);
  add("raise_exception", GlobalRaiseException);
  add("strftime_now", GlobalStrftimeNow);
  return Value::MakeDict(std::move(globals));
}

List Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList:
    case Value::Kind::kTuple: return v.list();
    case Value::Kind::kDict: {
      List keys;
      keys.reserve(v.dict().items.size());
      for (const auto& [k, item] : v.dict().items) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (std::string_view c : Utf8Chars(v.str())) chars.push_back(Value::Str(std::string(c)));
      return chars;
    }
    default:
      Fail("TypeError: '" + TypeName(v) + "' object is not iterable");
  }
}

Value Slice(Renderer& r, const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (!obj.is_string() && !obj.is_sequence()) {
    return Value::Undefined("'" + TypeName(obj) + " object' is not sliceable");
  }
  const auto index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (v.is_undefined()) FailUndefined(v);
    if (!v.is_int()) Fail("TypeError: slice indices must be integers or None or have an __index__ method");
    return v.as_int();
  };
  std::optional<int64_t> start = index(start_v);
  std::optional<int64_t> stop = index(stop_v);
  int64_t step = index(step_v).value_or(1);
  if (step == 0) Fail("ValueError: slice step cannot be zero");
  std::vector<std::string_view> chars;
  int64_t n = 0;
  if (obj.is_string()) {
    chars = Utf8Chars(obj.str());
    n = static_cast<int64_t>(chars.size());
  } else {
    n = static_cast<int64_t>(obj.list().size());
  }
  const auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t begin = adjust(start, step < 0 ? n - 1 : 0);
  int64_t end = adjust(stop, step < 0 ? -1 : n);
  r.Step(n / 16);
  std::string out_str;
  List out_list;
  for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) {
    if (obj.is_string()) {
      out_str.append(chars[static_cast<size_t>(i)]);
    } else {
      out_list.push_back(obj.list()[static_cast<size_t>(i)]);
    }
  }
  if (obj.is_string()) return Value::Str(std::move(out_str));
  return obj.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out_list)) : Value::MakeList(std::move(out_list));
}

bool CompareOp(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return PyEquals(a, b);
  if (op == "!=") return !PyEquals(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "notin") return !Contains(b, a);
  if (op == "<") return Less(a, b, op);
  if (op == ">") return Less(b, a, op);
  if (op == "<=") return Less(a, b, op) || PyEquals(a, b);
  if (op == ">=") return Less(b, a, op) || PyEquals(a, b);
  Fail(Cat("unknown comparison '", op, "'"));
}

Value BinaryOp(Renderer& r, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string out = PyStr(a);
    out += PyStr(b);
    r.CheckStringSize(out.size());
    return Value::Str(std::move(out));
  }
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  const bool ints = a.is_int() && b.is_int();
  const bool nums = a.is_number() && b.is_number();
  const auto type_error = [&]() {
    Fail(Cat("TypeError: unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '",
                      TypeName(b), "'"));
  };
  if (op == "+") {
    if (ints) {
      int64_t out = 0;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &out)) Fail("OverflowError: integer overflow");
      return Value::Int(out);
    }
    if (nums) return Value::Float(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      r.CheckStringSize(a.str().size() + b.str().size());
      return Value::Str(a.str() + b.str());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      r.CheckListSize(a.list().size() + b.list().size());
      r.Step(static_cast<int64_t>(a.list().size() + b.list().size()));
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return a.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out)) : Value::MakeList(std::move(out));
    }
    type_error();
  }
  if (op == "-") {
    if (ints) {
      int64_t out = 0;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &out)) Fail("OverflowError: integer overflow");
      return Value::Int(out);
    }
    if (nums) return Value::Float(a.as_float() - b.as_float());
    type_error();
  }
  if (op == "*") {
    if (ints) return Value::Int(CheckedMul(a.as_int(), b.as_int()));
    if (nums) return Value::Float(a.as_float() * b.as_float());
    if ((a.is_string() || a.is_sequence()) && b.is_int()) return Repeat(r, a, b.as_int());
    if ((b.is_string() || b.is_sequence()) && a.is_int()) return Repeat(r, b, a.as_int());
    type_error();
  }
  if (op == "/") {
    if (!nums) type_error();
    if (b.as_float() == 0) Fail("ZeroDivisionError: division by zero");
    return Value::Float(a.as_float() / b.as_float());
  }
  if (op == "//") {
    if (!nums) type_error();
    if (ints) {
      int64_t x = a.as_int();
      int64_t y = b.as_int();
      if (y == 0) Fail("ZeroDivisionError: integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) Fail("OverflowError: integer overflow");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::Int(q);
    }
    if (b.as_float() == 0) Fail("ZeroDivisionError: float floor division by zero");
    return Value::Float(std::floor(a.as_float() / b.as_float()));
  }
  if (op == "%") {
    if (a.is_string()) return Value::Str(PercentFormat(a.str(), b));
    if (!nums) type_error();
    if (ints) {
      int64_t x = a.as_int();
      int64_t y = b.as_int();
      if (y == 0) Fail("ZeroDivisionError: integer division or modulo by zero");
      if (y == -1) return Value::Int(0);
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Int(m);
    }
    double y = b.as_float();
    if (y == 0) Fail("ZeroDivisionError: float modulo");
    double m = std::fmod(a.as_float(), y);
    if (m != 0) {
      if ((y < 0) != (m < 0)) m += y;
    } else {
      m = std::copysign(0.0, y);
    }
    return Value::Float(m);
  }
  if (op == "**") {
    if (!nums) type_error();
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int();
      int64_t exp = b.as_int();
      int64_t result = 1;
      while (exp > 0) {
        if (exp & 1) result = CheckedMul(result, base);
        exp >>= 1;
        if (exp > 0) base = CheckedMul(base, base);
      }
      return Value::Int(result);
    }
    double x = a.as_float();
    double y = b.as_float();
    if (x == 0 && y < 0) Fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y)) Fail("ValueError: complex results are not supported");
    return Value::Float(std::pow(x, y));
  }
  Fail(Cat("unknown operator '", op, "'"));
}

}  // namespace glm::jinja
