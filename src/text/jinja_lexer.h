// tpcli::text — the Jinja lexer, with the whitespace rules transformers' environment sets:
// trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks (spaces and
// tabs before a block or comment tag at the start of a line are dropped), `{%-`/`-%}` (all whitespace
// before/after), `{%+`/`+%}` (neither), and keep_trailing_newline off (one final newline of the
// source dropped). Newlines of the source become "\n", as jinja2 normalises them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tpcli::text {

enum class TokenType {
  Data,        // literal text between tags
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // text holds the unescaped value
  Integer,
  Float,
  Operator,    // + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . : | , ;
  End,
};

struct Token {
  TokenType type;
  std::string text;
  int line = 1;
};

// Throws TemplateError ("line N: ...") on unterminated tags, strings or comments.
std::vector<Token> tokenize(std::string_view source);

}  // namespace tpcli::text
