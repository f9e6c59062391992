// tpcli::text — runs a parsed Jinja template: jinja2's scoping (a for loop and a macro call open a
// scope, if does not; namespace() objects carry values out of loops), the loop object, macros with
// defaults, varargs/kwargs and caller(), call/filter/set blocks, break/continue.
//
// An untrusted template is bounded: recursion depth (macros, recursive loops, nesting), the number
// of steps (statements run, loop iterations, calls) and the size of any output all have limits,
// each failing with a clear TemplateError.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "text/jinja_ast.h"

namespace tpcli::text {

struct RenderLimits {
  int max_depth = 400;                          // nested macro calls, loops and blocks
  uint64_t max_steps = 20'000'000;              // statements, loop iterations, calls
  size_t max_output_bytes = size_t{64} << 20;   // the rendered text and any captured block
};

// Renders `tmpl` with `variables` (the template's own names) over `globals` (builtins, which the
// variables shadow); loop objects are made in `arena`. Throws TemplateError ("template line N: ...";
// raise_exception's message as is).
std::string render_template(const Template& tmpl, const std::unordered_map<std::string, Value>& variables,
                            const std::unordered_map<std::string, Value>& globals, const RenderLimits& limits,
                            ObjectArena& arena);

// Fails at compile time, as jinja2 does, for an unknown filter or test outside any `if` (inside one,
// jinja2 and the interpreter fail only when it is called).
void check_names(const Template& tmpl);

}  // namespace tpcli::text
