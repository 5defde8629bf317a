#include "controller/gateway/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace glm::jinja {

void Fail(std::string message) {
  throw RenderError{absl::StatusCode::kInvalidArgument, std::move(message)};
}
void FailLimit(std::string message) {
  throw RenderError{absl::StatusCode::kResourceExhausted, std::move(message)};
}

Value Value::Undefined(std::string reason) {
  Value v;
  v.payload_ = std::make_shared<const std::string>(std::move(reason));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.payload_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.payload_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.payload_ = f;
  return v;
}
Value Value::Str(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.payload_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.payload_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeTuple(List items) {
  Value v;
  v.kind_ = Kind::kTuple;
  v.payload_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.payload_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}
Value Value::MakeNamespace(std::shared_ptr<Namespace> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.payload_ = std::move(ns);
  return v;
}
Value Value::MakeCallable(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.payload_ = std::move(fn);
  return v;
}
Value Value::MakeLoop(std::shared_ptr<const LoopInfo> loop) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.payload_ = std::move(loop);
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null:
      return None();
    case Type::boolean:
      return Bool(json.get<bool>());
    case Type::number_integer:
      return Int(json.get<int64_t>());
    case Type::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Int(static_cast<int64_t>(u));
      return Float(static_cast<double>(u));
    }
    case Type::number_float:
      return Float(json.get<double>());
    case Type::string:
      return Str(json.get_ref<const std::string&>());
    case Type::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case Type::object: {
      Dict dict;
      dict.items.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        dict.items.emplace_back(Str(it.key()), FromJson(it.value()));
      }
      return MakeDict(std::move(dict));
    }
    default:
      return None();  // binary / discarded: not produced by JSON text
  }
}

int64_t Value::as_int() const {
  if (kind_ == Kind::kBool) return std::get<bool>(payload_) ? 1 : 0;
  return std::get<int64_t>(payload_);
}

double Value::as_float() const {
  if (kind_ == Kind::kFloat) return std::get<double>(payload_);
  return static_cast<double>(as_int());
}

std::string Value::undefined_reason() const {
  if (const auto* reason = std::get_if<StrPtr>(&payload_); reason && *reason) return **reason;
  return "value is undefined";
}

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (PyEquals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (PyEquals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return "list";
    case Value::Kind::kTuple: return "tuple";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
    case Value::Kind::kLoop: return "LoopContext";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_float() != 0.0;
    case Value::Kind::kString: return !v.str().empty();
    case Value::Kind::kList:
    case Value::Kind::kTuple: return !v.list().empty();
    case Value::Kind::kDict: return !v.dict().items.empty();
    default: return true;
  }
}

bool PyEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      return a.as_float() == b.as_float();
    }
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) {
    return false;  // list vs tuple too: [1] != (1,)
  }
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (&a.list() == &b.list()) return true;
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!PyEquals(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.Find(k);
        if (other == nullptr || !PyEquals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.ns() == &b.ns();
    case Value::Kind::kCallable: return &a.fn() == &b.fn();
    case Value::Kind::kLoop: return &a.loop() == &b.loop();
    default: return false;
  }
}

// ---- UTF-8 ------------------------------------------------------------------------------------

size_t Utf8Next(std::string_view s, size_t pos, uint32_t* code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = byte(pos);
  size_t len = 0;
  uint32_t cp = 0;
  if (c < 0x80) {
    *code_point = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    *code_point = 0xFFFD;
    return 1;
  }
  if (pos + len > s.size()) {
    *code_point = 0xFFFD;
    return 1;
  }
  for (size_t i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) {
      *code_point = 0xFFFD;
      return 1;
    }
    cp = (cp << 6) | (byte(pos + i) & 0x3F);
  }
  *code_point = cp;
  return len;
}

std::vector<std::string_view> Utf8Chars(std::string_view s) {
  std::vector<std::string_view> chars;
  chars.reserve(s.size());
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = Utf8Next(s, pos, &cp);
    chars.push_back(s.substr(pos, n));
    pos += n;
  }
  return chars;
}

int64_t Utf8Length(std::string_view s) {
  int64_t count = 0;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size(); ++count) pos += Utf8Next(s, pos, &cp);
  return count;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool IsPySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

// str.isprintable() for code points >= 0x7f; an approximation without the Unicode database:
// controls, separators other than ' ', format characters, surrogates, private use and the
// noncharacters are not printable.
bool IsPyPrintable(uint32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (IsPySpace(c)) return false;
  if ((c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) ||
      (c >= 0x2060 && c <= 0x206F) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB)) {
    return false;
  }
  if (c >= 0xD800 && c <= 0xF8FF) return false;  // surrogates, private use
  if ((c & 0xFFFE) == 0xFFFE || (c >= 0xFDD0 && c <= 0xFDEF)) return false;
  if (c >= 0xF0000 || (c >= 0xE0000 && c <= 0xE0FFF)) return false;  // private use, tags
  if (c == 0x061C || c == 0x180E || (c >= 0x0600 && c <= 0x0605) || c == 0x06DD ||
      c == 0x070F || c == 0x08E2 || c == 0x110BD || c == 0x110CD ||
      (c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A)) {
    return false;
  }
  return true;
}

void AppendHex(std::string& out, uint32_t value, int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = digits - 1; i >= 0; --i) out += kHex[(value >> (4 * i)) & 0xF];
}

}  // namespace

std::string PyReprString(std::string_view s) {
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) {
    quote = '"';
  }
  std::string out;
  out.reserve(s.size() + 2);
  out += quote;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = Utf8Next(s, pos, &cp);
    if (cp == 0xFFFD && n == 1 && static_cast<unsigned char>(s[pos]) >= 0x80) {
      out += "\\udc";  // Python's surrogateescape of an undecodable byte
      AppendHex(out, static_cast<unsigned char>(s[pos]), 2);
    } else if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += "\\x";
      AppendHex(out, cp, 2);
    } else if (cp < 0x7F || IsPyPrintable(cp)) {
      out.append(s.substr(pos, n));
    } else if (cp <= 0xFF) {
      out += "\\x";
      AppendHex(out, cp, 2);
    } else if (cp <= 0xFFFF) {
      out += "\\u";
      AppendHex(out, cp, 4);
    } else {
      out += "\\U";
      AppendHex(out, cp, 8);
    }
    pos += n;
  }
  out += quote;
  return out;
}

std::string PyFloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, result.ptr);  // "-1.2345e+16", shortest round-trip digits
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  exponent < 0 ? -exponent : exponent);
    out += exp_buf;
  }
  return out;
}

std::string PyStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kString: return v.str();
    default: return PyRepr(v);
  }
}

std::string PyRepr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return PyFloatRepr(v.as_float());
    case Value::Kind::kString: return PyReprString(v.str());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      bool tuple = v.kind() == Value::Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      const List& items = v.list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        out += PyRepr(items[i]);
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += PyRepr(k) + ": " + PyRepr(item);
      }
      return out + "}";
    }
    case Value::Kind::kNamespace:
      return "<Namespace " + PyRepr(Value::MakeDict(v.ns().attrs)) + ">";
    case Value::Kind::kCallable: return v.fn().Repr();
    case Value::Kind::kLoop:
      return "<LoopContext " + std::to_string(v.loop().index0 + 1) + "/" +
             std::to_string(v.loop().items->size()) + ">";
  }
  return "";
}

// ---- json.dumps --------------------------------------------------------------------------------

namespace {

void DumpString(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = Utf8Next(s, pos, &cp);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp == 0x7F)) {
          out += "\\u";
          AppendHex(out, cp, 4);
        } else if (ensure_ascii && cp >= 0x80) {
          if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            out += "\\u";
            AppendHex(out, 0xD800 | (v >> 10), 4);
            out += "\\u";
            AppendHex(out, 0xDC00 | (v & 0x3FF), 4);
          } else {
            out += "\\u";
            AppendHex(out, cp, 4);
          }
        } else {
          out.append(s.substr(pos, n));
        }
    }
    pos += n;
  }
  out += '"';
}

std::string JsonFloat(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return PyFloatRepr(f);
}

std::string JsonKey(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString: return key.str();
    case Value::Kind::kBool: return key.as_bool() ? "true" : "false";
    case Value::Kind::kInt: return std::to_string(key.as_int());
    case Value::Kind::kFloat: return JsonFloat(key.as_float());
    case Value::Kind::kNone: return "null";
    default:
      Fail("TypeError: keys must be str, int, float, bool or None, not " + TypeName(key));
  }
}

void Dump(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  if (level > 512) Fail("RecursionError: maximum recursion depth exceeded in json.dumps");
  const auto newline = [&](int depth) {
    if (!o.has_indent) return;
    out += '\n';
    for (int i = 0; i < depth; ++i) out += o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: out += JsonFloat(v.as_float()); return;
    case Value::Kind::kString: DumpString(out, v.str(), o.ensure_ascii); return;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      newline(level + 1);
      bool first = true;
      for (const Value& item : v.list()) {
        if (!first) {
          out += o.item_separator;
          newline(level + 1);
        }
        first = false;
        Dump(out, item, o, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict().items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, item] : v.dict().items) items.emplace_back(JsonKey(k), &item);
      if (o.sort_keys) {
        for (const auto& [k, item] : v.dict().items) {
          if (!k.is_string()) Fail("TypeError: '<' not supported between keys of mixed types");
        }
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      newline(level + 1);
      bool first = true;
      for (const auto& [k, item] : items) {
        if (!first) {
          out += o.item_separator;
          newline(level + 1);
        }
        first = false;
        DumpString(out, k, o.ensure_ascii);
        out += o.key_separator;
        Dump(out, *item, o, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      Fail("TypeError: Object of type " + TypeName(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string JsonDumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  Dump(out, v, options, 0);
  return out;
}

}  // namespace glm::jinja
