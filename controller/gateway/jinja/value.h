// Value: a Python object as the templates see it (None, bool, int, float, str, list, tuple,
// dict, jinja2's Undefined and Namespace, callables, the loop object), with Python's printing
// (str/repr), equality, truthiness and json.dumps. Internal to glm_jinja.
//
// Lists, tuples, dicts and strings are immutable once built (the immutable sandbox forbids
// mutating them), so values share them freely through shared_ptr. A Namespace is the one mutable
// object; it lives inside one Render call.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace glm::jinja {

// Render-time failure. Thrown inside the interpreter only; Template::Render turns it into an
// absl::Status, so it never crosses the public API.
struct RenderError {
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  std::string message;
  bool located = false;  // message already says where (or is raise_exception's own text)
};
// absl::StrCat for std::string_view too (this absl's string_view is its own type).
namespace cat_internal {
inline void Append(std::string& out, std::string_view s) { out.append(s); }
inline void Append(std::string& out, const char* s) { out.append(s); }
inline void Append(std::string& out, const std::string& s) { out.append(s); }
template <typename T>
  requires std::is_integral_v<T>
void Append(std::string& out, T v) {
  out += std::to_string(v);
}
}  // namespace cat_internal
template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (cat_internal::Append(out, args), ...);
  return out;
}

[[noreturn]] void Fail(std::string message);
[[noreturn]] void FailLimit(std::string message);

class Value;
using List = std::vector<Value>;
struct Dict;
struct Namespace;
struct Callable;
struct LoopInfo;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace,
    kCallable, kLoop
  };

  Value() = default;  // Undefined
  static Value Undefined(std::string reason);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s);
  static Value MakeList(List items);
  static Value MakeTuple(List items);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace(std::shared_ptr<Namespace> ns);
  static Value MakeCallable(std::shared_ptr<const Callable> fn);
  static Value MakeLoop(std::shared_ptr<const LoopInfo> loop);
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // Python: bool is int
  bool is_number() const { return is_int() || kind_ == Kind::kFloat; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }

  bool as_bool() const { return std::get<bool>(payload_); }
  int64_t as_int() const;  // kInt or kBool
  double as_float() const;  // any number
  const std::string& str() const { return *std::get<StrPtr>(payload_); }
  const List& list() const { return *std::get<ListPtr>(payload_); }
  std::shared_ptr<const List> list_ptr() const { return std::get<ListPtr>(payload_); }
  const Dict& dict() const { return *std::get<DictPtr>(payload_); }
  Namespace& ns() const { return *std::get<NsPtr>(payload_); }
  const Callable& fn() const { return *std::get<FnPtr>(payload_); }
  const LoopInfo& loop() const { return *std::get<LoopPtr>(payload_); }
  // Why a value is undefined, e.g. "'x' is undefined" (jinja2's UndefinedError text).
  std::string undefined_reason() const;

 private:
  using StrPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NsPtr = std::shared_ptr<Namespace>;
  using FnPtr = std::shared_ptr<const Callable>;
  using LoopPtr = std::shared_ptr<const LoopInfo>;

  Kind kind_ = Kind::kUndefined;
  std::variant<std::monostate, bool, int64_t, double, StrPtr, ListPtr, DictPtr, NsPtr, FnPtr,
               LoopPtr>
      payload_;
};

// A Python dict: insertion-ordered, keys compared with Python ==. Linear lookup: template dicts
// (messages, tool schemas) are small.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  void Set(Value key, Value value);  // replaces an equal key in place, else appends
};

struct Namespace {
  Dict attrs;
};

class Renderer;  // interpreter.h
struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keywords;
};
// Globals, macros and bound methods (`s.strip`). Call may throw RenderError.
struct Callable {
  virtual ~Callable() = default;
  virtual Value Call(Renderer& renderer, CallArgs& args) const = 0;
  virtual std::string Repr() const = 0;
};

// The `loop` variable of one for-loop iteration.
struct LoopInfo {
  std::shared_ptr<const List> items;  // after the loop's `if` filter
  int64_t index0 = 0;
};

// Python type name as in error messages: "str", "int", "dict", "list", "NoneType", ...
std::string TypeName(const Value& v);
bool Truthy(const Value& v);
bool PyEquals(const Value& a, const Value& b);
// Python str() and repr(). str(Undefined) is "".
std::string PyStr(const Value& v);
std::string PyRepr(const Value& v);
std::string PyReprString(std::string_view s);
std::string PyFloatRepr(double f);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // used when has_indent
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// Python json.dumps. Undefined, namespaces and callables are a TypeError (Fail).
std::string JsonDumps(const Value& v, const JsonDumpOptions& options);

// UTF-8 helpers. Invalid bytes count as one code point each (never throws).
size_t Utf8Next(std::string_view s, size_t pos, uint32_t* code_point);
std::vector<std::string_view> Utf8Chars(std::string_view s);
int64_t Utf8Length(std::string_view s);
void AppendUtf8(std::string& out, uint32_t code_point);
bool IsPySpace(uint32_t code_point);  // str.isspace()

}  // namespace glm::jinja
