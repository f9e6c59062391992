// tpcli::text — the parsed form of a Jinja template: expressions and statements as plain trees the
// interpreter walks (jinja2's node types, fewer of them: one generic expression node with a kind).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace tpcli::text {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  Literal,    // literal
  Name,       // name
  ListLit,    // args
  TupleLit,   // args
  DictLit,    // args: key, value, key, value, ...
  Attribute,  // args[0].name
  Item,       // args[0][args[1]]
  Slice,      // args[0][args[1]:args[2]:args[3]] (null = omitted)
  Call,       // args[0](args[1:], keywords)
  Filter,     // args[0] | name(args[1:], keywords); args[0] null inside {% filter %}
  Test,       // args[0] is [not] name(args[1:])
  Unary,      // name ("-", "+", "not") args[0]
  Binary,     // args[0] name args[1]: + - * / // % ** ~ and or in "not in"
  Compare,    // args[0] ops[0] args[1] ops[1] args[2] ...
  Conditional,  // args[1] if args[0] else args[2] (args[2] null: undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value literal;
  bool negated = false;  // Test: `is not`
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;  // Compare
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  ExprPtr star_args, star_kwargs;  // Call: *args, **kwargs
};

enum class StmtKind {
  Text,         // text
  Print,        // expr
  If,           // conditions[i] -> bodies[i]; else_body
  For,          // target in expr [if condition] body else_body; recursive
  Set,          // target = expr
  SetBlock,     // {% set target | filters %} body {% endset %}; expr = filter chain or null
  Macro,        // name(params = defaults) body
  CallBlock,    // {% call(params) expr %} body
  FilterBlock,  // {% filter expr %} body
  Scope,        // {% generation %} body and the like: rendered as is
  Break,
  Continue,
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // Text; Macro name
  ExprPtr expr;      // Print, For iterable, Set value, CallBlock call, FilterBlock / SetBlock filters
  ExprPtr target;    // For, Set, SetBlock
  ExprPtr condition;  // For's `if`
  bool recursive = false;
  std::vector<ExprPtr> conditions;  // If
  std::vector<Body> bodies;         // If
  Body body, else_body;
  std::vector<MacroParam> params;   // Macro, CallBlock
};

struct Template {
  Body body;
};

}  // namespace tpcli::text
