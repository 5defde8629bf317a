#include "controller/gateway/jinja/interpreter.h"


namespace glm::jinja {

const Value* Frame::Find(std::string_view name) const {
  for (const Frame* f = this; f != nullptr; f = f->parent.get()) {
    for (auto it = f->vars.rbegin(); it != f->vars.rend(); ++it) {
      if (it->first == name) return &it->second;
    }
  }
  return nullptr;
}

void Frame::Set(const std::string& name, Value value) {
  for (auto& [n, v] : vars) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

namespace {

class MacroFn : public Callable {
 public:
  MacroFn(const Stmt& stmt, FramePtr closure) : stmt_(stmt), closure_(std::move(closure)) {}
  Value Call(Renderer& renderer, CallArgs& args) const override {
    return renderer.RunMacro(stmt_, closure_, args);
  }
  std::string Repr() const override { return "<Macro '" + stmt_.name + "'>"; }

 private:
  const Stmt& stmt_;
  FramePtr closure_;  // NOTE: a macro stored in its own frame makes a cycle; freed at render end
};

}  // namespace

Renderer::Renderer(const Program& program, const RenderOptions& options)
    : program_(program), options_(options) {}

std::string Renderer::Render(const nlohmann::ordered_json& context) {
  auto globals = std::make_shared<Frame>();
  const Value builtins = MakeGlobals();
  for (const auto& [name, value] : builtins.dict().items) globals->Set(name.str(), value);
  auto context_frame = std::make_shared<Frame>();
  context_frame->parent = globals;
  if (!context.is_object()) Fail("the render context must be a JSON object");
  for (auto it = context.begin(); it != context.end(); ++it) {
    context_frame->Set(it.key(), Value::FromJson(it.value()));
  }
  auto root = std::make_shared<Frame>();
  root->parent = context_frame;
  std::string out;
  try {
    Exec(program_.body, root, out);
  } catch (...) {
    root->vars.clear();  // break macro closure cycles
    throw;
  }
  root->vars.clear();
  return out;
}

void Renderer::Step(int64_t n) {
  steps_ += n;
  if (steps_ > options_.limits.max_steps) {
    FailLimit(Cat("template exceeded ", options_.limits.max_steps,
                           " evaluation steps (infinite or runaway loop?)"));
  }
}

void Renderer::CheckStringSize(size_t bytes) const {
  if (static_cast<int64_t>(bytes) > options_.limits.max_output_bytes) {
    FailLimit(Cat("string of ", bytes, " bytes exceeds the limit of ",
                           options_.limits.max_output_bytes));
  }
}

void Renderer::CheckListSize(size_t items) const {
  if (static_cast<int64_t>(items) > options_.limits.max_list_items) {
    FailLimit(Cat("list of ", items, " items exceeds the limit of ",
                           options_.limits.max_list_items));
  }
}

std::time_t Renderer::Now() const {
  return options_.now ? options_.now() : std::time(nullptr);
}

void Renderer::Append(std::string& out, std::string_view text) {
  output_bytes_ += static_cast<int64_t>(text.size());
  if (output_bytes_ > options_.limits.max_output_bytes) {
    FailLimit(Cat("template output exceeds ", options_.limits.max_output_bytes, " bytes"));
  }
  out.append(text);
}

std::string Renderer::Where(const Expr& e) const {
  std::string_view text = std::string_view(program_.source).substr(
      std::min(e.begin, program_.source.size()), e.end > e.begin ? e.end - e.begin : 0);
  if (text.size() > 80) text = text.substr(0, 80);
  return Cat("line ", e.line, ": `", text, "`: ");
}

Renderer::Flow Renderer::Exec(const Body& body, const FramePtr& frame, std::string& out) {
  for (const auto& s : body) {
    Flow flow = ExecStmt(*s, frame, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::ExecStmt(const Stmt& s, const FramePtr& frame, std::string& out) {
  Step();
  switch (s.kind) {
    case Stmt::Kind::kData:
      Append(out, s.text);
      return Flow::kNormal;
    case Stmt::Kind::kOutput: {
      Value v = Eval(*s.expr, frame);
      if (v.is_string()) {
        Append(out, v.str());
      } else {
        Append(out, PyStr(v));
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.conds.size(); ++i) {
        if (Truthy(Eval(*s.conds[i], frame))) return Exec(s.bodies[i], frame, out);
      }
      return Exec(s.else_body, frame, out);
    case Stmt::Kind::kFor:
      return ExecFor(s, frame, out);
    case Stmt::Kind::kSet:
      Assign(s, Eval(*s.expr, frame), frame);
      return Flow::kNormal;
    case Stmt::Kind::kSetBlock: {
      std::string text;
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      Exec(s.body, inner, text);
      Value v = Value::Str(std::move(text));
      if (s.expr) v = ApplyFilterChain(*s.expr, v, frame);
      Assign(s, std::move(v), frame);
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro:
      frame->Set(s.name, Value::MakeCallable(std::make_shared<MacroFn>(s, frame)));
      return Flow::kNormal;
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
    case Stmt::Kind::kFilterBlock: {
      std::string text;
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      Exec(s.body, inner, text);
      Value v = ApplyFilterChain(*s.expr, Value::Str(std::move(text)), frame);
      Append(out, PyStr(v));
      return Flow::kNormal;
    }
    case Stmt::Kind::kWith: {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      std::vector<Value> values;
      for (const auto& d : s.defaults) values.push_back(Eval(*d, frame));
      for (size_t i = 0; i < s.targets.size(); ++i) inner->Set(s.targets[i], values[i]);
      Exec(s.body, inner, out);
      return Flow::kNormal;
    }
  }
  return Flow::kNormal;
}

void Renderer::BindTargets(const std::vector<std::string>& targets, bool unpack,
                           const Value& value, Frame& frame) {
  if (!unpack) {
    frame.Set(targets[0], value);
    return;
  }
  List items = Iterate(value);
  if (items.size() != targets.size()) {
    Fail(Cat(items.size() < targets.size() ? "not enough" : "too many",
                      " values to unpack (expected ", targets.size(), ", got ", items.size(), ")"));
  }
  for (size_t i = 0; i < targets.size(); ++i) frame.Set(targets[i], items[i]);
}

void Renderer::Assign(const Stmt& s, Value value, const FramePtr& frame) {
  if (!s.attr.empty()) {
    const Value* target = frame->Find(s.targets[0]);
    if (target == nullptr || target->kind() != Value::Kind::kNamespace) {
      Fail(Cat("line ", s.line, ": cannot assign attribute '", s.attr, "' on non-namespace object '",
                        s.targets[0], "'"));
    }
    target->ns().attrs.Set(Value::Str(s.attr), std::move(value));
    return;
  }
  BindTargets(s.targets, s.unpack, value, *frame);
}

Renderer::Flow Renderer::ExecFor(const Stmt& s, const FramePtr& frame, std::string& out) {
  Value iterable = Eval(*s.expr, frame);
  std::shared_ptr<const List> items;
  if (iterable.is_sequence()) {
    items = iterable.list_ptr();
  } else {
    try {
      items = std::make_shared<const List>(Iterate(iterable));
    } catch (RenderError& e) {
      if (!e.located) {
        e.message = Where(*s.expr) + e.message;
        e.located = true;
      }
      throw;
    }
  }
  if (s.cond) {
    List kept;
    for (const Value& item : *items) {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      BindTargets(s.targets, s.unpack, item, *inner);
      if (Truthy(Eval(*s.cond, inner))) kept.push_back(item);
    }
    items = std::make_shared<const List>(std::move(kept));
  }
  if (items->empty()) {
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    Exec(s.else_body, inner, out);
    return Flow::kNormal;
  }
  for (size_t i = 0; i < items->size(); ++i) {
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    auto loop = std::make_shared<LoopInfo>();
    loop->items = items;
    loop->index0 = static_cast<int64_t>(i);
    inner->vars.emplace_back("loop", Value::MakeLoop(std::move(loop)));
    BindTargets(s.targets, s.unpack, (*items)[i], *inner);
    if (Exec(s.body, inner, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Value Renderer::RunMacro(const Stmt& macro, const FramePtr& closure, CallArgs& args) {
  if (++call_depth_ > options_.limits.max_call_depth) {
    --call_depth_;
    FailLimit(Cat("macro calls nested deeper than ", options_.limits.max_call_depth));
  }
  if (args.positional.size() > macro.params.size()) {
    --call_depth_;
    Fail(Cat("macro '", macro.name, "' takes not more than ", macro.params.size(),
                      " argument(s)"));
  }
  auto frame = std::make_shared<Frame>();
  frame->parent = closure;
  std::string out;
  try {
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const std::string& param = macro.params[i];
      if (i < args.positional.size()) {
        frame->Set(param, args.positional[i]);
        continue;
      }
      bool found = false;
      for (auto& [key, value] : args.keywords) {
        if (key == param) {
          frame->Set(param, value);
          found = true;
        }
      }
      if (found) continue;
      if (macro.defaults[i]) {
        frame->Set(param, Eval(*macro.defaults[i], frame));
      } else {
        frame->Set(param, Value::Undefined(Cat("parameter '", param, "' was not provided")));
      }
    }
    for (auto& [key, value] : args.keywords) {
      bool known = false;
      for (const auto& p : macro.params) known = known || p == key;
      if (!known) Fail(Cat("macro '", macro.name, "' takes no keyword argument '", key, "'"));
    }
    Exec(macro.body, frame, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value::Str(std::move(out));
}

void Renderer::EvalArgs(const Expr& e, const FramePtr& frame, CallArgs& args) {
  args.positional.reserve(e.items.size());
  for (const auto& item : e.items) args.positional.push_back(Eval(*item, frame));
  for (const auto& [key, value] : e.keywords) args.keywords.emplace_back(key, Eval(*value, frame));
}

Value Renderer::ApplyFilterChain(const Expr& e, const Value& body, const FramePtr& frame) {
  Value input = e.a ? ApplyFilterChain(*e.a, body, frame) : body;
  if (e.filter == nullptr) Fail(Cat("no filter named '", e.name, "'"));
  CallArgs args;
  EvalArgs(e, frame, args);
  return e.filter(*this, input, args);
}

Value Renderer::CallValue(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) Fail(callee.undefined_reason());
  if (callee.kind() != Value::Kind::kCallable) Fail("'" + TypeName(callee) + "' object is not callable");
  return callee.fn().Call(*this, args);
}

Value Renderer::Eval(const Expr& e, const FramePtr& frame) {
  Step();
  try {
    return EvalInner(e, frame);
  } catch (RenderError& error) {
    if (!error.located) {
      error.message = Where(e) + error.message;
      error.located = true;
    }
    throw;
  }
}

Value Renderer::EvalInner(const Expr& e, const FramePtr& frame) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName: {
      const Value* v = frame->Find(e.name);
      if (v == nullptr) return Value::Undefined("'" + e.name + "' is undefined");
      return *v;
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      items.reserve(e.items.size());
      for (const auto& item : e.items) items.push_back(Eval(*item, frame));
      return e.kind == Expr::Kind::kList ? Value::MakeList(std::move(items))
                                         : Value::MakeTuple(std::move(items));
    }
    case Expr::Kind::kDict: {
      Dict dict;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value key = Eval(*e.items[i], frame);
        if (key.kind() == Value::Kind::kList || key.kind() == Value::Kind::kDict ||
            key.kind() == Value::Kind::kNamespace) {
          Fail("unhashable type: '" + TypeName(key) + "'");
        }
        dict.Set(std::move(key), Eval(*e.items[i + 1], frame));
      }
      return Value::MakeDict(std::move(dict));
    }
    case Expr::Kind::kGetAttr:
      return GetAttr(Eval(*e.a, frame), e.name);
    case Expr::Kind::kGetItem:
      return GetItem(Eval(*e.a, frame), Eval(*e.b, frame));
    case Expr::Kind::kSlice: {
      Value obj = Eval(*e.a, frame);
      Value start = e.b ? Eval(*e.b, frame) : Value::None();
      Value stop = e.c ? Eval(*e.c, frame) : Value::None();
      Value step = e.d ? Eval(*e.d, frame) : Value::None();
      return Slice(*this, obj, start, stop, step);
    }
    case Expr::Kind::kCall: {
      Value callee = Eval(*e.a, frame);
      CallArgs args;
      EvalArgs(e, frame, args);
      return CallValue(callee, args);
    }
    case Expr::Kind::kFilter: {
      if (e.filter == nullptr) Fail(Cat("no filter named '", e.name, "'"));
      Value input = Eval(*e.a, frame);
      CallArgs args;
      EvalArgs(e, frame, args);
      return e.filter(*this, input, args);
    }
    case Expr::Kind::kTest: {
      if (e.test == nullptr) Fail(Cat("no test named '", e.name, "'"));
      Value input = Eval(*e.a, frame);
      CallArgs args;
      EvalArgs(e, frame, args);
      return Value::Bool(e.test(*this, input, args) != e.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      Value v = Eval(*e.a, frame);
      if (v.is_undefined()) Fail(v.undefined_reason());
      if (!v.is_number()) {
        Fail(Cat("bad operand type for unary ", e.kind == Expr::Kind::kNeg ? "-" : "+",
                          ": '", TypeName(v), "'"));
      }
      if (e.kind == Expr::Kind::kPos) return v.kind() == Value::Kind::kBool ? Value::Int(v.as_int()) : v;
      if (v.kind() == Value::Kind::kFloat) return Value::Float(-v.as_float());
      if (v.as_int() == INT64_MIN) Fail("integer overflow");
      return Value::Int(-v.as_int());
    }
    case Expr::Kind::kNot:
      return Value::Bool(!Truthy(Eval(*e.a, frame)));
    case Expr::Kind::kBinary:
      return BinaryOp(*this, e.name, Eval(*e.a, frame), Eval(*e.b, frame));
    case Expr::Kind::kCompare: {
      Value left = Eval(*e.a, frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = Eval(*e.items[i], frame);
        if (!CompareOp(e.ops[i], left, right)) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case Expr::Kind::kAnd: {
      Value left = Eval(*e.a, frame);
      if (!Truthy(left)) return left;
      return Eval(*e.b, frame);
    }
    case Expr::Kind::kOr: {
      Value left = Eval(*e.a, frame);
      if (Truthy(left)) return left;
      return Eval(*e.b, frame);
    }
    case Expr::Kind::kCond:
      if (Truthy(Eval(*e.a, frame))) return Eval(*e.b, frame);
      if (e.c) return Eval(*e.c, frame);
      return Value::Undefined(Cat("the inline if-expression on line ", e.line,
                                           " evaluated to false and no else section was defined."));
  }
  return Value();
}

Value Renderer::GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      Fail(obj.undefined_reason());
    case Value::Kind::kDict: {
      // The sandbox's getattr: a Python attribute (dict.items) wins over a key of that name.
      Value method = MethodOf(obj, name);
      if (method.kind() == Value::Kind::kCallable || IsUnsafe(method)) return method;
      if (const Value* v = obj.dict().Find(name)) return *v;
      return Value::Undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.ns().attrs.Find(name)) return *v;
      return Value::Undefined("'Namespace' has no attribute '" + name + "'");
    case Value::Kind::kLoop: {
      const LoopInfo& loop = obj.loop();
      const int64_t n = static_cast<int64_t>(loop.items->size());
      const int64_t i = loop.index0;
      if (name == "index") return Value::Int(i + 1);
      if (name == "index0") return Value::Int(i);
      if (name == "revindex") return Value::Int(n - i);
      if (name == "revindex0") return Value::Int(n - i - 1);
      if (name == "first") return Value::Bool(i == 0);
      if (name == "last") return Value::Bool(i == n - 1);
      if (name == "length") return Value::Int(n);
      if (name == "depth") return Value::Int(1);
      if (name == "depth0") return Value::Int(0);
      if (name == "previtem") {
        if (i > 0) return (*loop.items)[i - 1];
        return Value::Undefined("there is no previous item");
      }
      if (name == "nextitem") {
        if (i + 1 < n) return (*loop.items)[i + 1];
        return Value::Undefined("there is no next item");
      }
      return MethodOf(obj, name);
    }
    case Value::Kind::kNone:
      return Value::Undefined("'None' has no attribute '" + name + "'");
    default: {
      Value method = MethodOf(obj, name);
      if (method.kind() == Value::Kind::kCallable || IsUnsafe(method)) return method;
      return Value::Undefined("'" + TypeName(obj) + " object' has no attribute '" + name + "'");
    }
  }
}

Value Renderer::GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      Fail(obj.undefined_reason());
    case Value::Kind::kDict:
      if (const Value* v = obj.dict().Find(key)) return *v;
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kString:
      if (key.is_int()) {
        int64_t n = obj.is_string() ? Utf8Length(obj.str()) : static_cast<int64_t>(obj.list().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n) {
          return Value::Undefined("'" + TypeName(obj) + " object' has no element " +
                                  std::to_string(key.as_int()));
        }
        if (!obj.is_string()) return obj.list()[i];
        auto chars = Utf8Chars(obj.str());
        return Value::Str(std::string(chars[i]));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (obj.kind() == Value::Kind::kNone) {
      return Value::Undefined("'None' has no attribute '" + key.str() + "'");
    }
    if (obj.kind() != Value::Kind::kDict) return GetAttr(obj, key.str());
    Value method = MethodOf(obj, key.str());
    if (method.kind() == Value::Kind::kCallable) return method;
    return Value::Undefined("'dict object' has no attribute '" + key.str() + "'");
  }
  return Value::Undefined("'" + TypeName(obj) + " object' has no element " + PyRepr(key));
}

}  // namespace glm::jinja
