#include "text/jinja_parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "text/jinja_lexer.h"

namespace tpcli::text {

namespace {

// Deeper nesting than this is no real template; the limit keeps the recursive descent off the
// end of the stack on hostile input.
constexpr int MAX_NESTING = 128;

// An integer literal as Python reads it; past int64 it becomes a float (Python's ints are unbounded).
Value integer_literal(const std::string& text) {
  int64_t v = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (error == std::errc() && end == text.data() + text.size()) return Value(v);
  return Value(std::strtod(text.c_str(), nullptr));
}

ExprPtr make_expr(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

StmtPtr make_stmt(StmtKind kind, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Template run() {
    Template t;
    t.body = parse_body({});
    if (current().type != TokenType::End) fail("unexpected '" + current().text + "'");
    return t;
  }

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > MAX_NESTING) p.fail("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  Token advance() { return pos_ + 1 < tokens_.size() ? tokens_[pos_++] : tokens_[pos_]; }

  [[noreturn]] void fail(const std::string& what) const {
    throw TemplateError("template line " + std::to_string(current().line) + ": " + what);
  }

  bool is_op(std::string_view op) const { return current().type == TokenType::Operator && current().text == op; }
  bool is_name(std::string_view name) const { return current().type == TokenType::Name && current().text == name; }
  bool skip_op(std::string_view op) { return is_op(op) ? (advance(), true) : false; }
  bool skip_name(std::string_view name) { return is_name(name) ? (advance(), true) : false; }

  std::string describe(const Token& t) const {
    switch (t.type) {
      case TokenType::End: return "end of template";
      case TokenType::BlockEnd: return "'%}'";
      case TokenType::VarEnd: return "'}}'";
      case TokenType::Data: return "text";
      default: return "'" + t.text + "'";
    }
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe(current()));
  }
  std::string expect_name() {
    if (current().type != TokenType::Name) fail("expected a name, got " + describe(current()));
    return advance().text;
  }
  void expect_block_end() {
    if (current().type != TokenType::BlockEnd) fail("expected end of statement '%}', got " + describe(current()));
    advance();
  }

  // ---- statements ----

  // Statements up to a block tag whose name is one of `ends` (left current, after its '{%').
  Body parse_body(std::initializer_list<std::string_view> ends) {
    DepthGuard guard(*this);
    Body body;
    for (;;) {
      const Token& t = current();
      if (t.type == TokenType::End) {
        if (ends.size() != 0) fail("unexpected end of template, expected '" + std::string(*ends.begin()) + "'");
        return body;
      }
      if (t.type == TokenType::Data) {
        auto s = make_stmt(StmtKind::Text, t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == TokenType::VarBegin) {
        advance();
        auto s = make_stmt(StmtKind::Print, t.line);
        s->expr = parse_tuple(true, {});
        if (current().type != TokenType::VarEnd) fail("expected '}}', got " + describe(current()));
        advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::BlockBegin) {
        const Token& name = peek();
        for (auto end : ends)
          if (name.type == TokenType::Name && name.text == end) {
            advance();
            return body;
          }
        advance();
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  // Consumes `{% name %}` closing a block (the '{%' and name already matched by parse_body).
  void end_block(std::string_view name) {
    if (!skip_name(name)) fail("expected '" + std::string(name) + "'");
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const int line = current().line;
    const std::string tag = expect_name();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "call") return parse_call_block(line);
    if (tag == "filter") return parse_filter_block(line);
    if (tag == "with") return parse_with(line);
    if (tag == "generation") return parse_scope(line, "endgeneration");
    if (tag == "block") return parse_block(line);
    if (tag == "break" || tag == "continue") {
      expect_block_end();
      return make_stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, line);
    }
    fail("encountered unknown or unsupported tag '" + tag + "'");
  }

  StmtPtr parse_if(int line) {
    auto s = make_stmt(StmtKind::If, line);
    s->conditions.push_back(parse_tuple(false, {}));
    expect_block_end();
    for (;;) {
      s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      if (skip_name("elif")) {
        s->conditions.push_back(parse_tuple(false, {}));
        expect_block_end();
        continue;
      }
      if (skip_name("else")) {
        expect_block_end();
        s->else_body = parse_body({"endif"});
      }
      end_block("endif");
      return s;
    }
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(StmtKind::For, line);
    s->target = parse_assign_target({"in"});
    if (!skip_name("in")) fail("expected 'in' in a for loop");
    s->expr = parse_tuple(false, {"recursive", "if"});
    if (skip_name("if")) s->condition = parse_expression(true);
    s->recursive = skip_name("recursive");
    expect_block_end();
    s->body = parse_body({"endfor", "else"});
    if (skip_name("else")) {
      expect_block_end();
      s->else_body = parse_body({"endfor"});
    }
    end_block("endfor");
    return s;
  }

  StmtPtr parse_set(int line) {
    ExprPtr target;
    if (current().type == TokenType::Name && peek().type == TokenType::Operator && peek().text == ".") {
      target = make_expr(ExprKind::Attribute, line);
      auto ns = make_expr(ExprKind::Name, line);
      ns->name = expect_name();
      advance();
      target->name = expect_name();
      target->args.push_back(std::move(ns));
    } else {
      target = parse_assign_target({});
    }
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {});
      expect_block_end();
      return s;
    }
    auto s = make_stmt(StmtKind::SetBlock, line);
    s->target = std::move(target);
    if (is_op("|")) s->expr = parse_filter_chain(nullptr);
    expect_block_end();
    s->body = parse_body({"endset"});
    end_block("endset");
    return s;
  }

  std::vector<MacroParam> parse_signature() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!skip_op(")")) {
      if (!params.empty()) expect_op(",");
      if (skip_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      params.push_back(std::move(p));
    }
    return params;
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(StmtKind::Macro, line);
    s->text = expect_name();
    s->params = parse_signature();
    expect_block_end();
    s->body = parse_body({"endmacro"});
    end_block("endmacro");
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make_stmt(StmtKind::CallBlock, line);
    if (is_op("(")) s->params = parse_signature();
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail("expected a call in {% call %}");
    expect_block_end();
    s->body = parse_body({"endcall"});
    end_block("endcall");
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = make_stmt(StmtKind::FilterBlock, line);
    s->expr = parse_filter_chain(nullptr, true);
    expect_block_end();
    s->body = parse_body({"endfilter"});
    end_block("endfilter");
    return s;
  }

  // {% with a = 1, b = 2 %}: a scope whose first statements are the assignments.
  StmtPtr parse_with(int line) {
    auto s = make_stmt(StmtKind::Scope, line);
    while (current().type != TokenType::BlockEnd) {
      if (!s->body.empty()) expect_op(",");
      auto set = make_stmt(StmtKind::Set, current().line);
      set->target = parse_assign_target({});
      expect_op("=");
      set->expr = parse_expression(true);
      s->body.push_back(std::move(set));
    }
    expect_block_end();
    for (auto& stmt : parse_body({"endwith"})) s->body.push_back(std::move(stmt));
    end_block("endwith");
    return s;
  }

  // {% block name [scoped] [required] %}: in a template that extends nothing, its body in place.
  StmtPtr parse_block(int line) {
    auto s = make_stmt(StmtKind::Scope, line);
    const std::string name = expect_name();
    skip_name("scoped");
    skip_name("required");
    expect_block_end();
    s->body = parse_body({"endblock"});
    if (!skip_name("endblock")) fail("expected 'endblock'");
    if (current().type == TokenType::Name && current().text != name) fail("endblock names '" + current().text + "', not '" + name + "'");
    if (current().type == TokenType::Name) advance();
    expect_block_end();
    return s;
  }

  StmtPtr parse_scope(int line, std::string_view end) {
    auto s = make_stmt(StmtKind::Scope, line);
    expect_block_end();
    s->body = parse_body({end});
    end_block(end);
    return s;
  }

  // A name or a tuple of names (`k, v`, `(a, b)`) up to one of `ends`.
  ExprPtr parse_assign_target(std::initializer_list<std::string_view> ends) {
    const int line = current().line;
    std::vector<ExprPtr> names;
    bool is_tuple = false;
    for (;;) {
      if (!names.empty() && !skip_op(",")) break;
      if (!names.empty()) is_tuple = true;
      if (current().type == TokenType::BlockEnd || is_op("=") || is_op(")")) break;
      bool at_end = false;
      for (auto e : ends) at_end = at_end || is_name(e);
      if (at_end) break;
      if (skip_op("(")) {
        names.push_back(parse_assign_target({}));
        expect_op(")");
        continue;
      }
      auto n = make_expr(ExprKind::Name, current().line);
      n->name = expect_name();
      names.push_back(std::move(n));
    }
    if (names.empty()) fail("expected an assignment target");
    if (!is_tuple) return std::move(names[0]);
    auto t = make_expr(ExprKind::TupleLit, line);
    t->args = std::move(names);
    return t;
  }

  // ---- expressions ----

  bool at_tuple_end(std::initializer_list<std::string_view> ends) const {
    const Token& t = current();
    if (t.type == TokenType::VarEnd || t.type == TokenType::BlockEnd || t.type == TokenType::End) return true;
    if (t.type == TokenType::Operator && t.text == ")") return true;
    for (auto e : ends)
      if (t.type == TokenType::Name && t.text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> ends, bool parenthesised = false) {
    const int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (at_tuple_end(ends)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!parenthesised) fail("expected an expression, got " + describe(current()));
    }
    auto t = make_expr(ExprKind::TupleLit, line);
    t->args = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_conditional() : parse_or();
  }

  ExprPtr parse_conditional() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = advance().line;
      auto cond = make_expr(ExprKind::Conditional, line);
      cond->args.push_back(parse_or());
      cond->args.push_back(std::move(expr));
      cond->args.push_back(skip_name("else") ? parse_conditional() : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = make_expr(ExprKind::Binary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = advance().line;
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = advance().line;
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make_expr(ExprKind::Unary, advance().line);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = current().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      const Token& t = current();
      if (t.type == TokenType::Operator &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == TokenType::Name && peek().text == "in") {
        op = "not in";
        advance(), advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(ExprKind::Compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token t = advance();
      left = binary(t.text, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = advance().line;
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token t = advance();
      left = binary(t.text, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = advance().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token t = advance();
      node = make_expr(ExprKind::Unary, t.line);
      node->name = t.text;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    return with_filter ? parse_filter_expr(std::move(node)) : std::move(node);
  }

  ExprPtr literal(Value v, int line) {
    auto e = make_expr(ExprKind::Literal, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = current();
    switch (t.type) {
      case TokenType::Name: {
        advance();
        if (t.text == "true" || t.text == "True") return literal(Value(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value(None{}), t.line);
        auto e = make_expr(ExprKind::Name, t.line);
        e->name = t.text;
        return e;
      }
      case TokenType::String: {
        std::string s;
        while (current().type == TokenType::String) s += advance().text;
        return literal(Value(std::move(s)), t.line);
      }
      case TokenType::Integer: advance(); return literal(integer_literal(t.text), t.line);
      case TokenType::Float: advance(); return literal(Value(std::strtod(t.text.c_str(), nullptr)), t.line);
      default: break;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) return parse_list();
    if (is_op("{")) return parse_dict();
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    auto e = make_expr(ExprKind::ListLit, advance().line);
    while (!skip_op("]")) {
      if (!e->args.empty()) expect_op(",");
      if (skip_op("]")) break;
      e->args.push_back(parse_expression(true));
    }
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make_expr(ExprKind::DictLit, advance().line);
    while (!skip_op("}")) {
      if (!e->args.empty()) expect_op(",");
      if (skip_op("}")) break;
      e->args.push_back(parse_expression(true));
      expect_op(":");
      e->args.push_back(parse_expression(true));
    }
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      if (is_op("|")) node = parse_filter_chain(std::move(node));
      else if (is_name("is")) node = parse_test(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token t = advance();
    if (t.text == ".") {
      if (current().type == TokenType::Integer) {
        auto e = make_expr(ExprKind::Item, t.line);
        e->args.push_back(std::move(node));
        e->args.push_back(literal(integer_literal(advance().text), t.line));
        return e;
      }
      auto e = make_expr(ExprKind::Attribute, t.line);
      e->name = expect_name();
      e->args.push_back(std::move(node));
      return e;
    }
    std::vector<ExprPtr> subscripts;
    while (!skip_op("]")) {
      if (!subscripts.empty()) expect_op(",");
      subscripts.push_back(parse_subscribed());
    }
    if (subscripts.empty()) fail("expected a subscript");
    if (subscripts.size() > 1) {
      auto tuple = make_expr(ExprKind::TupleLit, t.line);
      tuple->args = std::move(subscripts);
      subscripts.clear();
      subscripts.push_back(std::move(tuple));
    }
    ExprPtr sub = std::move(subscripts[0]);
    if (sub->kind == ExprKind::Slice) {
      sub->args[0] = std::move(node);
      return sub;
    }
    auto e = make_expr(ExprKind::Item, t.line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(sub));
    return e;
  }

  // One subscript: an expression, or a slice `a:b:c` (args[0] left for the sliced value).
  ExprPtr parse_subscribed() {
    const int line = current().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    advance();
    auto slice = make_expr(ExprKind::Slice, line);
    slice->args.push_back(nullptr);
    slice->args.push_back(std::move(start));
    const auto bound = [&] { return is_op(":") || is_op("]") || is_op(",") ? nullptr : parse_expression(true); };
    slice->args.push_back(bound());
    if (skip_op(":")) slice->args.push_back(bound());
    else slice->args.push_back(nullptr);
    return slice;
  }

  // (a, b, key=c, *rest, **more) into `call`'s args (after args[0]) and keywords.
  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (skip_op("*")) call.star_args = parse_expression(true);
      else if (skip_op("**")) call.star_kwargs = parse_expression(true);
      else if (current().type == TokenType::Name && peek().type == TokenType::Operator && peek().text == "=") {
        std::string key = advance().text;
        advance();
        call.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        call.args.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make_expr(ExprKind::Call, current().line);
    e->args.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      advance();
      name += "." + expect_name();
    }
    return name;
  }

  // `| f(args) | g ...` applied to `node` (null: the body of a {% filter %} or {% set %} block).
  ExprPtr parse_filter_chain(ExprPtr node, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) advance();
      start_inline = false;
      auto e = make_expr(ExprKind::Filter, current().line);
      e->name = dotted_name();
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    auto e = make_expr(ExprKind::Test, advance().line);
    e->negated = skip_name("not");
    e->name = dotted_name();
    e->args.push_back(std::move(node));
    const Token& t = current();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == TokenType::Name || t.type == TokenType::String || t.type == TokenType::Integer ||
                t.type == TokenType::Float || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }
};

}  // namespace

Template parse_template(std::string_view source) { return Parser(tokenize(source)).run(); }

}  // namespace tpcli::text
