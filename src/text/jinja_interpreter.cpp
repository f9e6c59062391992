#include "text/jinja_interpreter.h"

#include <algorithm>
#include <memory>

#include "text/jinja_builtins.h"
#include "text/jinja_ops.h"

namespace tpcli::text {

namespace {

// A TemplateError that already names its template line.
class LocatedError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

struct Scope {
  ScopePtr parent;
  std::unordered_map<std::string, Value> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

ScopePtr child_of(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  Interpreter(const std::unordered_map<std::string, Value>& globals, const RenderLimits& limits, ObjectArena& arena)
      : globals_(globals), limits_(limits), arena_(arena) {}

  std::string render(const Template& tmpl, const ScopePtr& root) {
    std::string out;
    exec_body(tmpl.body, root, out);
    return out;
  }

 private:
  const std::unordered_map<std::string, Value>& globals_;
  const RenderLimits& limits_;
  ObjectArena& arena_;
  int depth_ = 0;
  uint64_t steps_ = 0;

  struct DepthGuard {
    Interpreter& in;
    explicit DepthGuard(Interpreter& interpreter) : in(interpreter) {
      if (++in.depth_ > in.limits_.max_depth) {
        --in.depth_;
        throw TemplateError("maximum recursion depth exceeded (template limit " + std::to_string(in.limits_.max_depth) + ")");
      }
    }
    ~DepthGuard() { --in.depth_; }
  };

  void tick() {
    if (++steps_ > limits_.max_steps)
      throw TemplateError("template ran more than " + std::to_string(limits_.max_steps) + " steps (template limit)");
  }

  void emit(std::string& out, std::string_view text) const {
    if (out.size() + text.size() > limits_.max_output_bytes)
      throw TemplateError("template output past " + std::to_string(limits_.max_output_bytes) + " bytes (template limit)");
    out += text;
  }

  // ---- statements ----

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    DepthGuard guard(*this);
    for (const auto& stmt : body) {
      const Flow flow = exec_located(*stmt, scope, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  Flow exec_located(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    try {
      return exec(stmt, scope, out);
    } catch (const RaisedError&) {
      throw;
    } catch (const LocatedError&) {
      throw;
    } catch (const TemplateError& e) {
      throw LocatedError("template line " + std::to_string(stmt.line) + ": " + e.what());
    }
  }

  Flow exec(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    tick();
    switch (stmt.kind) {
      case StmtKind::Text: emit(out, stmt.text); return Flow::Normal;
      case StmtKind::Print: emit(out, to_str(eval(*stmt.expr, scope))); return Flow::Normal;
      case StmtKind::If: return exec_if(stmt, scope, out);
      case StmtKind::For: return exec_for(stmt, scope, out);
      case StmtKind::Set: assign(*stmt.target, eval(*stmt.expr, scope), scope); return Flow::Normal;
      case StmtKind::SetBlock: {
        std::string captured;
        exec_body(stmt.body, scope, captured);
        Value v(std::move(captured));
        if (stmt.expr) v = eval_filters(*stmt.expr, v, scope);
        assign(*stmt.target, v, scope);
        return Flow::Normal;
      }
      case StmtKind::Macro: scope->vars[stmt.text] = make_macro(stmt, scope); return Flow::Normal;
      case StmtKind::CallBlock: emit(out, to_str(eval_call(*stmt.expr, scope, make_caller(stmt, scope)))); return Flow::Normal;
      case StmtKind::FilterBlock: {
        std::string captured;
        exec_body(stmt.body, scope, captured);
        emit(out, to_str(eval_filters(*stmt.expr, Value(std::move(captured)), scope)));
        return Flow::Normal;
      }
      case StmtKind::Scope: return exec_body(stmt.body, child_of(scope), out);  // with/block run inline: break passes
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  Flow exec_if(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    for (size_t i = 0; i < stmt.conditions.size(); ++i)
      if (truthy(eval(*stmt.conditions[i], scope))) return exec_body(stmt.bodies[i], scope, out);
    return exec_body(stmt.else_body, scope, out);
  }

  Flow exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    render_loop(stmt, scope, eval(*stmt.expr, scope), 0, out);
    return Flow::Normal;
  }

  // The items a loop visits: its `if` filter applied first, so loop.length counts only those.
  std::vector<Value> loop_items(const Stmt& stmt, const ScopePtr& scope, const Value& iterable) {
    if (iterable.is_none()) throw TemplateError("'NoneType' object is not iterable");
    std::vector<Value> items = iterate(iterable);
    if (!stmt.condition) return items;
    std::vector<Value> kept;
    const ScopePtr test_scope = child_of(scope);
    for (auto& item : items) {
      tick();
      assign(*stmt.target, item, test_scope);
      if (truthy(eval(*stmt.condition, test_scope))) kept.push_back(std::move(item));
    }
    return kept;
  }

  void render_loop(const Stmt& stmt, const ScopePtr& scope, const Value& iterable, int depth, std::string& out) {
    DepthGuard guard(*this);
    const std::vector<Value> items = loop_items(stmt, scope, iterable);
    if (items.empty()) {
      exec_body(stmt.else_body, child_of(scope), out);
      return;
    }
    const ObjectPtr loop = arena_.make("LoopContext", false);
    add_loop_functions(loop, stmt, scope, depth);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      tick();
      // A scope per iteration: what the body sets does not survive into the next one (jinja2).
      const ScopePtr iteration = child_of(scope);
      iteration->vars["loop"] = Value(loop);
      set_loop_position(*loop, items, i, depth);
      assign(*stmt.target, items[static_cast<size_t>(i)], iteration);
      if (exec_body(stmt.body, iteration, out) == Flow::Break) break;
    }
  }

  static void set_loop_position(ObjectData& loop, const std::vector<Value>& items, int64_t i, int depth) {
    const int64_t n = static_cast<int64_t>(items.size());
    DictData& a = loop.attributes;
    a.set(Value("index0"), Value(i));
    a.set(Value("index"), Value(i + 1));
    a.set(Value("revindex0"), Value(n - i - 1));
    a.set(Value("revindex"), Value(n - i));
    a.set(Value("first"), Value(i == 0));
    a.set(Value("last"), Value(i == n - 1));
    a.set(Value("length"), Value(n));
    a.set(Value("depth0"), Value(static_cast<int64_t>(depth)));
    a.set(Value("depth"), Value(static_cast<int64_t>(depth + 1)));
    a.set(Value("previtem"), i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    a.set(Value("nextitem"), i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
  }

  // loop.cycle(...), loop.changed(...), and loop(...) for recursive loops.
  void add_loop_functions(const ObjectPtr& loop_object, const Stmt& stmt, const ScopePtr& scope, int depth) {
    ObjectData& loop = *loop_object;
    std::weak_ptr<ObjectData> weak = loop_object;  // the functions live inside the object they read
    loop.attributes.set(Value("cycle"), make_function("cycle", [weak](CallArgs& args) {
      if (args.positional.empty()) throw TemplateError("no items for cycling given");
      const auto self = weak.lock();
      if (!self) throw TemplateError("loop.cycle called after its loop ended");
      const int64_t i = self->attributes.find("index0")->as_int();
      return args.positional[static_cast<size_t>(i % static_cast<int64_t>(args.positional.size()))];
    }));
    auto last_seen = std::make_shared<std::optional<Value>>();
    loop.attributes.set(Value("changed"), make_function("changed", [last_seen](CallArgs& args) {
      Value now = Value::tuple(args.positional);
      if (*last_seen && equal(**last_seen, now)) return Value(false);
      *last_seen = now;
      return Value(true);
    }));
    if (!stmt.recursive) return;
    loop.attributes.set(Value("__call__"), make_function("loop", [this, &stmt, scope, depth](CallArgs& args) {
      std::string captured;
      render_loop(stmt, scope, args.positional.empty() ? Value() : args.positional[0], depth + 1, captured);
      return Value(std::move(captured));
    }));
  }

  void assign(const Expr& target, const Value& v, const ScopePtr& scope) {
    if (target.kind == ExprKind::Name) {
      scope->vars[target.name] = v;
      return;
    }
    if (target.kind == ExprKind::Attribute) {
      const Value object = eval(*target.args[0], scope);
      if (!object.is_object() || !object.as_object()->assignable)
        throw TemplateError("cannot assign attribute on non-namespace object");
      object.as_object()->attributes.set(Value(target.name), v);
      return;
    }
    const std::vector<Value> items = iterate(v);
    const size_t expected = target.args.size();
    if (items.size() > expected)
      throw TemplateError("too many values to unpack (expected " + std::to_string(expected) + ")");
    if (items.size() < expected)
      throw TemplateError("not enough values to unpack (expected " + std::to_string(expected) + ", got " +
                          std::to_string(items.size()) + ")");
    for (size_t i = 0; i < expected; ++i) assign(*target.args[i], items[i], scope);
  }

  // ---- macros ----

  Value make_macro(const Stmt& stmt, const ScopePtr& scope) {
    std::weak_ptr<Scope> weak = scope;  // the macro lives in this scope: no reference cycle
    return make_function(stmt.text, [this, &stmt, weak](CallArgs& args) {
      const ScopePtr definition = weak.lock();
      if (!definition) throw TemplateError("macro '" + stmt.text + "' called after its scope ended");
      return call_body(stmt, definition, args);
    });
  }

  Value make_caller(const Stmt& stmt, const ScopePtr& scope) {
    return make_function("caller", [this, &stmt, scope](CallArgs& args) { return call_body(stmt, scope, args); });
  }

  // A macro's or caller's body with its parameters bound in a scope of its own.
  Value call_body(const Stmt& stmt, const ScopePtr& definition, CallArgs& args) {
    DepthGuard guard(*this);
    tick();
    const ScopePtr s = child_of(definition);
    std::vector<Value> varargs;
    for (size_t i = stmt.params.size(); i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
    for (size_t i = 0; i < stmt.params.size(); ++i) {
      const MacroParam& p = stmt.params[i];
      if (i < args.positional.size()) s->vars[p.name] = args.positional[i];
      else if (const Value* kw = args.keyword(p.name)) s->vars[p.name] = *kw;
      else if (p.default_value) s->vars[p.name] = eval(*p.default_value, s);
      else s->vars[p.name] = Value::undefined("parameter '" + p.name + "' was not provided");
    }
    Value kwargs = Value::dict();
    for (const auto& keyword : args.keywords) {
      const std::string& name = keyword.first;
      const bool is_param = std::any_of(stmt.params.begin(), stmt.params.end(), [&](const MacroParam& p) { return p.name == name; });
      if (name == "caller") s->vars["caller"] = keyword.second;
      else if (!is_param) kwargs.as_dict()->set(Value(name), keyword.second);
    }
    s->vars["varargs"] = Value::tuple(std::move(varargs));
    s->vars["kwargs"] = kwargs;
    std::string out;
    exec_body(stmt.body, s, out);
    return Value(std::move(out));
  }

  // ---- expressions ----

  Value eval(const Expr& e, const ScopePtr& scope) {
    DepthGuard guard(*this);
    switch (e.kind) {
      case ExprKind::Literal: return e.literal;
      case ExprKind::Name: return lookup(e.name, scope);
      case ExprKind::ListLit: return Value::list(eval_all(e.args, scope));
      case ExprKind::TupleLit: return Value::tuple(eval_all(e.args, scope));
      case ExprKind::DictLit: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) d.as_dict()->set(eval(*e.args[i], scope), eval(*e.args[i + 1], scope));
        return d;
      }
      case ExprKind::Attribute: return get_attribute(eval(*e.args[0], scope), e.name);
      case ExprKind::Item: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case ExprKind::Slice: {
        const Value object = eval(*e.args[0], scope);
        return get_slice(object, optional(e.args[1], scope), optional(e.args[2], scope), optional(e.args[3], scope));
      }
      case ExprKind::Call: return eval_call(e, scope, Value());
      case ExprKind::Filter: return eval_filters(e, Value(), scope);
      case ExprKind::Test: {
        const Value subject = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope);
        return Value(apply_test(e.name, subject, args) != e.negated);
      }
      case ExprKind::Unary: return eval_unary(e, scope);
      case ExprKind::Binary: return eval_binary(e, scope);
      case ExprKind::Compare: return Value(eval_compare(e, scope));
      case ExprKind::Conditional:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
    }
    return Value();
  }

  Value optional(const ExprPtr& e, const ScopePtr& scope) { return e ? eval(*e, scope) : Value(None{}); }

  std::vector<Value> eval_all(const std::vector<ExprPtr>& exprs, const ScopePtr& scope, size_t from = 0) {
    std::vector<Value> out;
    for (size_t i = from; i < exprs.size(); ++i) out.push_back(eval(*exprs[i], scope));
    return out;
  }

  Value lookup(const std::string& name, const ScopePtr& scope) const {
    if (const Value* v = scope->find(name)) return *v;
    const auto it = globals_.find(name);
    if (it != globals_.end()) return it->second;
    return Value::undefined("'" + name + "' is undefined");
  }

  // A call's or filter's arguments (after args[0]), with *args and **kwargs spread.
  CallArgs eval_args(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    args.positional = eval_all(e.args, scope, 1);
    for (const auto& [k, v] : e.keywords) args.keywords.emplace_back(k, eval(*v, scope));
    if (e.star_args)
      for (auto& v : iterate(eval(*e.star_args, scope))) args.positional.push_back(std::move(v));
    if (e.star_kwargs) {
      const Value d = eval(*e.star_kwargs, scope);
      if (!d.is_dict()) throw TemplateError("argument after ** must be a mapping, not " + d.type_name());
      for (const auto& [k, v] : d.as_dict()->items) args.keywords.emplace_back(to_str(k), v);
    }
    return args;
  }

  Value eval_call(const Expr& e, const ScopePtr& scope, const Value& caller) {
    const Value callee = eval(*e.args[0], scope);
    CallArgs args = eval_args(e, scope);
    if (!caller.is_undefined()) args.keywords.emplace_back("caller", caller);
    tick();
    return call_value(callee, args);
  }

  // A filter chain; a null innermost subject is `subject` (the body of a filter or set block).
  Value eval_filters(const Expr& e, const Value& subject, const ScopePtr& scope) {
    if (e.kind != ExprKind::Filter) return eval(e, scope);
    const Value input = e.args[0] ? eval_filters(*e.args[0], subject, scope) : subject;
    CallArgs args = eval_args(e, scope);
    return apply_filter(e.name, input, args);
  }

  Value eval_unary(const Expr& e, const ScopePtr& scope) {
    const Value v = eval(*e.args[0], scope);
    if (e.name == "not") return Value(!truthy(v));
    if (e.name == "-") return negate(v);
    if (v.is_undefined()) throw_undefined(v);
    if (!v.is_number()) throw TemplateError("bad operand type for unary +: '" + v.type_name() + "'");
    return v.is_bool() ? Value(v.to_int()) : v;
  }

  Value eval_binary(const Expr& e, const ScopePtr& scope) {
    Value left = eval(*e.args[0], scope);
    if (e.name == "and") return truthy(left) ? eval(*e.args[1], scope) : left;
    if (e.name == "or") return truthy(left) ? left : eval(*e.args[1], scope);
    return binary_op(e.name, left, eval(*e.args[1], scope));
  }

  bool eval_compare(const Expr& e, const ScopePtr& scope) {
    Value left = eval(*e.args[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1], scope);
      const std::string& op = e.ops[i];
      const bool holds = op == "in" ? contains(right, left) : op == "not in" ? !contains(right, left) : compare(op, left, right);
      if (!holds) return false;
      left = std::move(right);
    }
    return true;
  }
};

// jinja2 refuses an unknown filter or test when it compiles the template, except inside an `if`
// (its condition and bodies) or an inline if, where only calling it fails ("soft" frames). A loop,
// macro or block body inside an `if` is a frame of its own, checked again.
void check_expr(const Expr* e, bool soft);

void check_exprs(const std::vector<ExprPtr>& exprs, bool soft) {
  for (const auto& e : exprs) check_expr(e.get(), soft);
}

void check_expr(const Expr* e, bool soft) {
  if (!e) return;
  if (!soft && e->kind == ExprKind::Filter && !filter_exists(e->name))
    throw TemplateError("template line " + std::to_string(e->line) + ": no filter named '" + e->name + "'");
  if (!soft && e->kind == ExprKind::Test && !test_exists(e->name))
    throw TemplateError("template line " + std::to_string(e->line) + ": no test named '" + e->name + "'");
  const bool inner_soft = soft || e->kind == ExprKind::Conditional;
  check_exprs(e->args, inner_soft);
  for (const auto& [_, v] : e->keywords) check_expr(v.get(), inner_soft);
  check_expr(e->star_args.get(), inner_soft);
  check_expr(e->star_kwargs.get(), inner_soft);
}

void check_body(const Body& body, bool soft) {
  for (const auto& s : body) {
    const bool own_frame = s->kind == StmtKind::For || s->kind == StmtKind::Macro || s->kind == StmtKind::CallBlock ||
                           s->kind == StmtKind::FilterBlock || s->kind == StmtKind::SetBlock || s->kind == StmtKind::Scope;
    const bool expr_soft = soft && s->kind != StmtKind::FilterBlock && s->kind != StmtKind::SetBlock;
    check_expr(s->expr.get(), expr_soft);
    check_expr(s->condition.get(), false);
    check_exprs(s->conditions, true);
    for (const auto& b : s->bodies) check_body(b, true);
    check_body(s->body, !own_frame && (soft || s->kind == StmtKind::If));
    check_body(s->else_body, !own_frame && (soft || s->kind == StmtKind::If));
    for (const auto& p : s->params) check_expr(p.default_value.get(), false);
  }
}

}  // namespace

void check_names(const Template& tmpl) { check_body(tmpl.body, false); }

std::string render_template(const Template& tmpl, const std::unordered_map<std::string, Value>& variables,
                            const std::unordered_map<std::string, Value>& globals, const RenderLimits& limits,
                            ObjectArena& arena) {
  auto root = std::make_shared<Scope>();
  root->vars = variables;
  Interpreter interpreter(globals, limits, arena);
  try {
    return interpreter.render(tmpl, root);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& e) {  // a library failure (allocation, conversion): still one line
    throw TemplateError(std::string("template failed: ") + e.what());
  }
}

}  // namespace tpcli::text
