// Renderer: executes a Program for one Render call (one Renderer per call, so a Template renders
// concurrently). Scoping follows jinja2: the template body is one frame; each for-loop
// iteration, macro call and with-block gets a child frame, so `set` inside them does not leak
// out (namespaces are the escape hatch); if-blocks share their enclosing frame.
// Failures throw RenderError (value.h), caught by Template::Render.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "controller/gateway/jinja/ast.h"
#include "controller/gateway/jinja/template.h"
#include "controller/gateway/jinja/value.h"

namespace glm::jinja {

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* Find(std::string_view name) const;
  void Set(const std::string& name, Value value);
};
using FramePtr = std::shared_ptr<Frame>;

class Renderer {
 public:
  Renderer(const Program& program, const RenderOptions& options);

  // Throws RenderError.
  std::string Render(const nlohmann::ordered_json& context);

  // For builtins (builtins.cc).
  Value Eval(const Expr& e, const FramePtr& frame);
  Value CallValue(const Value& callee, CallArgs& args);
  Value GetAttr(const Value& obj, const std::string& name);
  Value GetItem(const Value& obj, const Value& key);
  void Step(int64_t n = 1);
  void CheckStringSize(size_t bytes) const;
  void CheckListSize(size_t items) const;
  std::time_t Now() const;
  Value RunMacro(const Stmt& macro, const FramePtr& closure, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow Exec(const Body& body, const FramePtr& frame, std::string& out);
  Flow ExecStmt(const Stmt& s, const FramePtr& frame, std::string& out);
  Flow ExecFor(const Stmt& s, const FramePtr& frame, std::string& out);
  void Assign(const Stmt& s, Value value, const FramePtr& frame);
  void BindTargets(const std::vector<std::string>& targets, bool unpack, const Value& value,
                   Frame& frame);
  Value EvalInner(const Expr& e, const FramePtr& frame);
  Value ApplyFilterChain(const Expr& e, const Value& body, const FramePtr& frame);
  void EvalArgs(const Expr& e, const FramePtr& frame, CallArgs& args);
  void Append(std::string& out, std::string_view text);
  std::string Where(const Expr& e) const;

  const Program& program_;
  const RenderOptions& options_;
  int64_t steps_ = 0;
  int64_t output_bytes_ = 0;
  int call_depth_ = 0;
};

// Python operators on Values (builtins.cc). Throw RenderError on a TypeError.
Value BinaryOp(Renderer& r, std::string_view op, const Value& a, const Value& b);
bool CompareOp(std::string_view op, const Value& a, const Value& b);
List Iterate(const Value& v);
Value Slice(Renderer& r, const Value& obj, const Value& start, const Value& stop, const Value& step);
Value MakeGlobals();  // a dict: range, dict, namespace, raise_exception, strftime_now
// obj.name as a Python attribute: a bound method, an "unsafe" Undefined for the mutators the
// immutable sandbox blocks (calling it fails), or a plain Undefined.
Value MethodOf(const Value& obj, const std::string& name);
bool IsUnsafe(const Value& v);

}  // namespace glm::jinja
