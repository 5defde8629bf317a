#include "controller/gateway/jinja/parser.h"

#include <initializer_list>

#include "absl/strings/str_join.h"
#include "controller/gateway/jinja/lexer.h"

namespace glm::jinja {
namespace {

constexpr int kMaxNesting = 200;  // expression and block nesting; keeps recursion bounded

struct SyntaxError {
  absl::Status status;
};

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kName:
    case TokenType::kOperator: return "'" + t.text + "'";
    case TokenType::kString: return "string " + PyReprString(t.text);
    case TokenType::kInt:
    case TokenType::kFloat: return "number " + t.text;
    case TokenType::kBlockEnd: return "end of statement block '%}'";
    case TokenType::kVarEnd: return "end of print statement '}}'";
    default: return TokenTypeName(t.type);
  }
}

class Parser {
 public:
  explicit Parser(LexResult lexed) : tokens_(std::move(lexed.tokens)) {
    program_->source = std::move(lexed.source);
  }

  std::shared_ptr<const Program> Run() {
    program_->body = Subparse({});
    if (Cur().type != TokenType::kEnd) FailAt(Cur(), "unexpected " + Describe(Cur()));
    return program_;
  }

 private:
  // ---- token stream ---------------------------------------------------------------------------
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t n = 1) const {
    return tokens_[std::min(pos_ + n, tokens_.size() - 1)];
  }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().text == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().text == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  [[noreturn]] void FailAt(const Token& t, const std::string& what) {
    throw SyntaxError{absl::InvalidArgumentError(Cat("line ", t.line, ":", t.col, ": ", what))};
  }
  void ExpectOp(std::string_view op) {
    if (!SkipOp(op)) FailAt(Cur(), Cat("expected '", op, "', got ", Describe(Cur())));
  }
  void ExpectType(TokenType type) {
    if (Cur().type != type) {
      FailAt(Cur(), Cat("expected ", type == TokenType::kBlockEnd
                                                  ? "end of statement block '%}'"
                                                  : type == TokenType::kVarEnd
                                                        ? "end of print statement '}}'"
                                                        : TokenTypeName(type),
                                 ", got ", Describe(Cur())));
    }
    Next();
  }
  std::string ExpectName(std::string_view what) {
    if (Cur().type != TokenType::kName) FailAt(Cur(), Cat("expected ", what, ", got ", Describe(Cur())));
    return Next().text;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxNesting) parser->FailAt(parser->Cur(), "template nested too deeply");
    }
    ~DepthGuard() { --parser->depth_; }
    Parser* parser;
  };

  ExprPtr NewExpr(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->col = at.col;
    e->begin = at.offset;
    e->end = at.end;
    return e;
  }
  void Finish(Expr& e) {
    size_t prev = pos_ > 0 ? pos_ - 1 : 0;
    e.end = std::max(e.end, tokens_[prev].end);
  }

  // ---- statements -----------------------------------------------------------------------------
  // Parses until a `{% name %}` with name in end_tags (left as the current token) or the end.
  Body Subparse(std::initializer_list<std::string_view> end_tags) {
    Body body;
    while (Cur().type != TokenType::kEnd) {
      const Token& t = Cur();
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kData;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == TokenType::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        s->col = t.col;
        s->expr = ParseTuple(/*with_condexpr=*/true, {});
        ExpectType(TokenType::kVarEnd);
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Next();
        for (std::string_view tag : end_tags) {
          if (IsName(tag)) return body;
        }
        body.push_back(ParseStatement(end_tags));
        ExpectType(TokenType::kBlockEnd);
      } else {
        FailAt(t, "unexpected " + Describe(t));
      }
    }
    return body;
  }

  // Body of a block statement: expects `%}` of the opening tag, parses to an end tag.
  Body ParseBlockBody(std::initializer_list<std::string_view> end_tags, const Token& opener,
                      bool drop_end) {
    DepthGuard guard(this);
    ExpectType(TokenType::kBlockEnd);
    Body body = Subparse(end_tags);
    if (Cur().type == TokenType::kEnd) {
      std::vector<std::string> names;
      for (std::string_view tag : end_tags) names.push_back(Cat("'", tag, "'"));
      FailAt(Cur(), Cat("unexpected end of template, expected ", absl::StrJoin(names, " or "),
                                 " to close '", opener.text, "' from line ", opener.line));
    }
    if (drop_end) Next();
    return body;
  }

  std::unique_ptr<Stmt> ParseStatement(std::initializer_list<std::string_view> enclosing) {
    const Token& t = Cur();
    if (t.type != TokenType::kName) FailAt(t, "tag name expected, got " + Describe(t));
    auto s = std::make_unique<Stmt>();
    s->line = t.line;
    s->col = t.col;
    const std::string tag = t.text;
    if (tag == "if") return ParseIf(std::move(s));
    if (tag == "for") return ParseFor(std::move(s));
    if (tag == "set") return ParseSet(std::move(s));
    if (tag == "macro") return ParseMacro(std::move(s));
    if (tag == "filter") return ParseFilterBlock(std::move(s));
    if (tag == "with") return ParseWith(std::move(s));
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) FailAt(t, Cat("'", tag, "' outside of a for loop"));
      Next();
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      return s;
    }
    std::string what = Cat("unknown tag '", tag, "'");
    if (enclosing.size() > 0) {
      std::vector<std::string> names;
      for (std::string_view e : enclosing) names.push_back(Cat("'", e, "'"));
      what += Cat(", expected ", absl::StrJoin(names, " or "));
    } else if (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif") {
      what += Cat(", no open block to close");
    }
    static constexpr std::string_view kUnsupported[] = {"extends", "include", "import", "from",
                                                        "block", "call", "do", "autoescape"};
    for (std::string_view u : kUnsupported) {
      if (tag == u) what = Cat("unsupported tag '", tag, "'");
    }
    FailAt(t, what);
  }

  std::unique_ptr<Stmt> ParseIf(std::unique_ptr<Stmt> s) {
    const Token opener = Next();
    s->kind = Stmt::Kind::kIf;
    ++soft_;
    s->conds.push_back(ParseTuple(/*with_condexpr=*/false, {}));
    s->bodies.push_back(ParseBlockBody({"elif", "else", "endif"}, opener, false));
    while (true) {
      if (SkipName("elif")) {
        s->conds.push_back(ParseTuple(false, {}));
        s->bodies.push_back(ParseBlockBody({"elif", "else", "endif"}, opener, false));
      } else if (SkipName("else")) {
        s->else_body = ParseBlockBody({"endif"}, opener, true);
        break;
      } else {
        Next();  // endif
        break;
      }
    }
    --soft_;
    return s;
  }

  // for/set/with targets: name, or names separated by commas (optionally parenthesized).
  void ParseTargets(Stmt& s, bool allow_namespace) {
    bool paren = SkipOp("(");
    while (true) {
      s.targets.push_back(ExpectName("a variable name"));
      if (allow_namespace && s.targets.size() == 1 && !paren && IsOp(".")) {
        Next();
        s.attr = ExpectName("an attribute name");
        return;
      }
      if (!SkipOp(",")) break;
      s.unpack = true;
      if (paren && IsOp(")")) break;
      if (!paren && (IsName("in") || IsOp("="))) break;
    }
    if (paren) {
      ExpectOp(")");
      s.unpack = true;
    }
  }

  std::unique_ptr<Stmt> ParseFor(std::unique_ptr<Stmt> s) {
    const Token opener = Next();
    s->kind = Stmt::Kind::kFor;
    ParseTargets(*s, false);
    if (!SkipName("in")) FailAt(Cur(), "expected 'in', got " + Describe(Cur()));
    int saved_soft = soft_;
    soft_ = 0;
    s->expr = ParseTuple(/*with_condexpr=*/false, {"recursive"});
    if (SkipName("if")) s->cond = ParseExpression(true);
    if (IsName("recursive")) FailAt(Cur(), "recursive for loops are not supported");
    ++loop_depth_;
    s->body = ParseBlockBody({"endfor", "else"}, opener, false);
    --loop_depth_;
    if (SkipName("else")) {
      s->else_body = ParseBlockBody({"endfor"}, opener, true);
    } else {
      Next();  // endfor
    }
    soft_ = saved_soft;
    return s;
  }

  std::unique_ptr<Stmt> ParseSet(std::unique_ptr<Stmt> s) {
    const Token opener = Next();
    ParseTargets(*s, true);
    if (SkipOp("=")) {
      s->kind = Stmt::Kind::kSet;
      s->expr = ParseTuple(true, {});
      return s;
    }
    if (s->unpack || !s->attr.empty()) FailAt(Cur(), "expected '=' after a tuple or namespace target");
    s->kind = Stmt::Kind::kSetBlock;
    if (IsOp("|")) s->expr = ParseFilter(nullptr);
    s->body = ParseBlockBody({"endset"}, opener, true);
    return s;
  }

  std::unique_ptr<Stmt> ParseMacro(std::unique_ptr<Stmt> s) {
    const Token opener = Next();
    s->kind = Stmt::Kind::kMacro;
    s->name = ExpectName("a macro name");
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s->params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      s->params.push_back(ExpectName("a parameter name"));
      if (SkipOp("=")) {
        s->defaults.push_back(ParseExpression(true));
      } else {
        if (!s->defaults.empty() && s->defaults.back() != nullptr) {
          FailAt(Cur(), "non-default argument follows default argument");
        }
        s->defaults.push_back(nullptr);
      }
    }
    ExpectOp(")");
    int saved_soft = soft_;
    int saved_loop = loop_depth_;
    soft_ = 0;
    loop_depth_ = 0;
    s->body = ParseBlockBody({"endmacro"}, opener, true);
    soft_ = saved_soft;
    loop_depth_ = saved_loop;
    return s;
  }

  std::unique_ptr<Stmt> ParseFilterBlock(std::unique_ptr<Stmt> s) {
    const Token opener = Next();
    s->kind = Stmt::Kind::kFilterBlock;
    s->expr = ParseFilter(nullptr, /*start_inline=*/true);
    s->body = ParseBlockBody({"endfilter"}, opener, true);
    return s;
  }

  std::unique_ptr<Stmt> ParseWith(std::unique_ptr<Stmt> s) {
    const Token opener = Next();
    s->kind = Stmt::Kind::kWith;
    while (Cur().type != TokenType::kBlockEnd) {
      if (!s->targets.empty()) ExpectOp(",");
      s->targets.push_back(ExpectName("a variable name"));
      ExpectOp("=");
      s->defaults.push_back(ParseExpression(true));
    }
    s->body = ParseBlockBody({"endwith"}, opener, true);
    return s;
  }

  // ---- expressions ----------------------------------------------------------------------------
  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd || t.type == TokenType::kEnd) return true;
    if (t.type == TokenType::kOperator && t.text == ")") return true;
    for (std::string_view name : extra_end) {
      if (t.type == TokenType::kName && t.text == name) return true;
    }
    return false;
  }

  ExprPtr ParseTuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                     bool explicit_parentheses = false) {
    const Token start = Cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      items.push_back(ParseExpression(with_condexpr));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) FailAt(Cur(), "expected an expression, got " + Describe(Cur()));
    }
    ExprPtr e = NewExpr(Expr::Kind::kTuple, start);
    e->items = std::move(items);
    Finish(*e);
    return e;
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    if (!with_condexpr) return ParseOr();
    const Token start = Cur();
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      Next();
      ExprPtr e = NewExpr(Expr::Kind::kCond, start);
      e->a = ParseOr();
      e->b = std::move(expr);
      if (SkipName("else")) e->c = ParseExpression(true);
      Finish(*e);
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr ParseOr() {
    const Token start = Cur();
    ExprPtr left = ParseAnd();
    while (SkipName("or")) {
      ExprPtr e = NewExpr(Expr::Kind::kOr, start);
      e->a = std::move(left);
      e->b = ParseAnd();
      Finish(*e);
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseAnd() {
    const Token start = Cur();
    ExprPtr left = ParseNot();
    while (SkipName("and")) {
      ExprPtr e = NewExpr(Expr::Kind::kAnd, start);
      e->a = std::move(left);
      e->b = ParseNot();
      Finish(*e);
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseNot() {
    DepthGuard guard(this);
    if (IsName("not")) {
      const Token start = Next();
      ExprPtr e = NewExpr(Expr::Kind::kNot, start);
      e->a = ParseNot();
      Finish(*e);
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const Token start = Cur();
    ExprPtr expr = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOperator &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().text == "in") {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = NewExpr(Expr::Kind::kCompare, start);
        cmp->a = std::move(expr);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(ParseMath1());
    }
    if (!cmp) return expr;
    Finish(*cmp);
    return cmp;
  }

  ExprPtr Binary(const Token& start, std::string op, ExprPtr left, ExprPtr right) {
    ExprPtr e = NewExpr(Expr::Kind::kBinary, start);
    e->name = std::move(op);
    e->a = std::move(left);
    e->b = std::move(right);
    Finish(*e);
    return e;
  }

  ExprPtr ParseMath1() {
    const Token start = Cur();
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Next().text;
      left = Binary(start, op, std::move(left), ParseConcat());
    }
    return left;
  }

  ExprPtr ParseConcat() {
    const Token start = Cur();
    ExprPtr left = ParseMath2();
    while (SkipOp("~")) left = Binary(start, "~", std::move(left), ParseMath2());
    return left;
  }

  ExprPtr ParseMath2() {
    const Token start = Cur();
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Next().text;
      left = Binary(start, op, std::move(left), ParsePow());
    }
    return left;
  }

  ExprPtr ParsePow() {
    const Token start = Cur();
    ExprPtr left = ParseUnary(true);
    while (SkipOp("**")) left = Binary(start, "**", std::move(left), ParseUnary(true));
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    const Token start = Cur();
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      bool neg = Next().text == "-";
      node = NewExpr(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, start);
      node->a = ParseUnary(false);
      Finish(*node);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    DepthGuard guard(this);
    const Token& t = Cur();
    ExprPtr e;
    switch (t.type) {
      case TokenType::kName: {
        Next();
        e = NewExpr(Expr::Kind::kLiteral, t);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenType::kString: {
        e = NewExpr(Expr::Kind::kLiteral, t);
        std::string text;
        while (Cur().type == TokenType::kString) text += Next().text;
        e->literal = Value::Str(std::move(text));
        Finish(*e);
        return e;
      }
      case TokenType::kInt:
        Next();
        e = NewExpr(Expr::Kind::kLiteral, t);
        e->literal = Value::Int(t.int_value);
        return e;
      case TokenType::kFloat:
        Next();
        e = NewExpr(Expr::Kind::kLiteral, t);
        e->literal = Value::Float(t.float_value);
        return e;
      case TokenType::kOperator:
        if (t.text == "(") {
          Next();
          e = ParseTuple(true, {}, /*explicit_parentheses=*/true);
          ExpectOp(")");
          return e;
        }
        if (t.text == "[") {
          Next();
          e = NewExpr(Expr::Kind::kList, t);
          while (!IsOp("]")) {
            if (!e->items.empty()) ExpectOp(",");
            if (IsOp("]")) break;
            e->items.push_back(ParseExpression(true));
          }
          ExpectOp("]");
          Finish(*e);
          return e;
        }
        if (t.text == "{") {
          Next();
          e = NewExpr(Expr::Kind::kDict, t);
          while (!IsOp("}")) {
            if (!e->items.empty()) ExpectOp(",");
            if (IsOp("}")) break;
            e->items.push_back(ParseExpression(true));
            ExpectOp(":");
            e->items.push_back(ParseExpression(true));
          }
          ExpectOp("}");
          Finish(*e);
          return e;
        }
        break;
      default:
        break;
    }
    FailAt(t, "expected an expression, got " + Describe(t));
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        node = ParseFilter(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    DepthGuard guard(this);
    const Token t = Next();
    ExprPtr e = NewExpr(Expr::Kind::kGetItem, t);
    e->begin = node->begin;
    e->line = node->line;
    e->col = node->col;
    e->a = std::move(node);
    if (t.text == ".") {
      const Token& attr = Cur();
      if (attr.type == TokenType::kName) {
        e->kind = Expr::Kind::kGetAttr;
        e->name = Next().text;
      } else if (attr.type == TokenType::kInt) {
        Next();
        e->b = NewExpr(Expr::Kind::kLiteral, attr);
        e->b->literal = Value::Int(attr.int_value);
      } else {
        FailAt(attr, "expected an attribute name after '.', got " + Describe(attr));
      }
      Finish(*e);
      return e;
    }
    // '[': an index, a slice, or a tuple of them (tuples of slices are unsupported).
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    ExprPtr slice[3];
    int slot = 0;
    if (!IsOp(":")) slice[0] = ParseExpression(true);
    while (IsOp(":") && slot < 2) {
      Next();
      is_slice = true;
      ++slot;
      if (!IsOp(":") && !IsOp("]")) slice[slot] = ParseExpression(true);
    }
    if (is_slice) {
      e->kind = Expr::Kind::kSlice;
      e->b = std::move(slice[0]);
      e->c = std::move(slice[1]);
      e->d = std::move(slice[2]);
    } else if (IsOp(",")) {
      ExprPtr tuple = NewExpr(Expr::Kind::kTuple, Cur());
      tuple->items.push_back(std::move(slice[0]));
      while (SkipOp(",")) {
        if (IsOp("]")) break;
        tuple->items.push_back(ParseExpression(true));
      }
      e->b = std::move(tuple);
    } else {
      e->b = std::move(slice[0]);
    }
    ExpectOp("]");
    Finish(*e);
    return e;
  }

  // Call arguments after '(': positional, then name=value keywords.
  void ParseArgs(Expr& e) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) FailAt(Cur(), "*args and **kwargs in calls are not supported");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOperator && Peek().text == "=") {
        std::string key = Next().text;
        Next();
        e.keywords.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!e.keywords.empty()) FailAt(Cur(), "positional argument follows keyword argument");
        e.items.push_back(ParseExpression(true));
      }
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr node) {
    DepthGuard guard(this);
    ExprPtr e = NewExpr(Expr::Kind::kCall, Cur());
    e->begin = node->begin;
    e->line = node->line;
    e->col = node->col;
    e->a = std::move(node);
    ParseArgs(*e);
    Finish(*e);
    return e;
  }

  std::string DottedName() {
    std::string name = ExpectName("a name");
    while (IsOp(".") && Peek().type == TokenType::kName) {
      Next();
      name += "." + Next().text;
    }
    return name;
  }

  ExprPtr ParseFilter(ExprPtr node, bool start_inline = false) {
    DepthGuard guard(this);
    while (IsOp("|") || start_inline) {
      if (!start_inline) Next();
      start_inline = false;
      const Token t = Cur();
      ExprPtr e = NewExpr(Expr::Kind::kFilter, t);
      if (node) {
        e->begin = node->begin;
        e->line = node->line;
        e->col = node->col;
      }
      e->name = DottedName();
      e->filter = FindFilter(e->name);
      if (e->filter == nullptr && soft_ == 0) FailAt(t, Cat("no filter named '", e->name, "'"));
      e->a = std::move(node);
      if (IsOp("(")) ParseArgs(*e);
      Finish(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr ParseTest(ExprPtr node) {
    DepthGuard guard(this);
    Next();  // is
    ExprPtr e = NewExpr(Expr::Kind::kTest, Cur());
    e->begin = node->begin;
    e->line = node->line;
    e->col = node->col;
    e->negated = SkipName("not");
    const Token t = Cur();
    e->name = DottedName();
    e->test = FindTest(e->name);
    if (e->test == nullptr && soft_ == 0) FailAt(t, Cat("no test named '", e->name, "'"));
    e->a = std::move(node);
    if (IsOp("(")) {
      ParseArgs(*e);
    } else {
      const Token& c = Cur();
      bool arg_start = c.type == TokenType::kName || c.type == TokenType::kString ||
                       c.type == TokenType::kInt || c.type == TokenType::kFloat ||
                       (c.type == TokenType::kOperator && (c.text == "(" || c.text == "[" || c.text == "{"));
      if (arg_start && !(c.type == TokenType::kName && (c.text == "else" || c.text == "or" || c.text == "and"))) {
        if (IsName("is")) FailAt(c, "you cannot chain multiple tests with is");
        e->items.push_back(ParsePostfix(ParsePrimary()));
      }
    }
    Finish(*e);
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int soft_ = 0;        // > 0 inside an if: unknown filters/tests fail at runtime
  int loop_depth_ = 0;  // > 0 inside a for body: break/continue allowed
  std::shared_ptr<Program> program_ = std::make_shared<Program>();
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Program>> ParseProgram(std::string_view source) {
  absl::StatusOr<LexResult> lexed = Lex(source);
  if (!lexed.ok()) return lexed.status();
  try {
    return Parser(*std::move(lexed)).Run();
  } catch (const SyntaxError& e) {
    return e.status;
  }
}

}  // namespace glm::jinja
