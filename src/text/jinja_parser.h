// tpcli::text — the Jinja parser: jinja2's grammar (its operator precedence, `is` tests, filters,
// slices, call arguments, tuple targets) and the statements a chat template uses: if/elif/else,
// for (else, `if` filter, recursive), set (= and block), macro, call, filter, with, raw, break,
// continue, and transformers' {% generation %}. extends/include/import are refused: a chat template
// is one file.
#pragma once

#include <string_view>

#include "text/jinja_ast.h"

namespace tpcli::text {

// Throws TemplateError ("template line N: ...") on a syntax error or nesting deeper than jinja2
// templates reasonably go.
Template parse_template(std::string_view source);

}  // namespace tpcli::text
