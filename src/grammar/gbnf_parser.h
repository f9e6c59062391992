// tpcli::grammar — llama.cpp's GBNF text parsed into rules (the compiler, grammar/automaton.h,
// turns them into byte automata).
//
// Dialect: `name ::= alternatives` rules (names of letters, digits, '-' and '_'; a rule may run over
// several lines: it ends where the next `name ::=` starts), `#` comments to the end of the line,
// "literals" and [character classes] with the escapes \n \r \t \" \' \\ \[ \] \- \/ \xHH \uHHHH
// \UHHHHHHHH, [^...] negated classes and [a-z] ranges (of code points), `.` any one code point,
// ( groups ), `|` alternatives and the repetitions * + ? {m} {m,} {m,n}. The start rule is `root`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tpcli::grammar {

// Limits that keep a hostile grammar's compile bounded (a GrammarError beyond them).
constexpr int MAX_REPETITION = 10000;     // m and n of {m,n}
constexpr size_t MAX_GBNF_BYTES = 1 << 22;  // 4 MiB of grammar text
constexpr int MAX_NESTING = 200;          // nested ( groups )

struct GbnfNode;
using GbnfSequence = std::vector<GbnfNode>;
using GbnfAlternatives = std::vector<GbnfSequence>;

struct CodepointRange {
  uint32_t first = 0, last = 0;  // inclusive
};

struct GbnfNode {
  enum class Kind { literal, char_class, rule_ref, group };
  Kind kind = Kind::literal;
  std::string bytes;                    // literal: its UTF-8 bytes
  std::vector<CodepointRange> ranges;   // char_class: the code points it matches (negation applied), sorted
  int rule = -1;                        // rule_ref: index into GbnfGrammar::rules
  GbnfAlternatives alternatives;        // group
  int min_repeat = 1, max_repeat = 1;   // max_repeat -1: unbounded
  int line = 0, column = 0;             // where the item starts in the text (1-based)
};

struct GbnfRule {
  std::string name;
  GbnfAlternatives alternatives;
  int line = 0, column = 0;  // where it is defined (or first used, when never defined)
  bool defined = false;
};

struct GbnfGrammar {
  std::vector<GbnfRule> rules;
  int root = -1;
};

// Throws GrammarError ("grammar line L, column C: ...") on a syntax error, an undefined rule, a
// rule defined twice, or a missing `root`.
GbnfGrammar parse_gbnf(std::string_view text);

// "grammar line L, column C: what" (the prefix of every GBNF error).
std::string gbnf_location(int line, int column, const std::string& what);

}  // namespace tpcli::grammar
