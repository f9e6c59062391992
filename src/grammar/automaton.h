// tpcli::grammar — a GBNF grammar compiled into one byte automaton per rule (a pushdown automaton
// over bytes): what the matcher walks.
//
// Each rule becomes a DFA over bytes whose edges are byte ranges (character classes are expanded
// into their UTF-8 byte sequences, so a code point may be split across tokens) plus "call" edges
// that push another rule. Small rules whose language is finite (literals, `space`, one `char`) are
// inlined into their callers, so a rule like `string ::= "\"" char* "\""` is one automaton
// and the token-mask cache (grammar/compiled_grammar.h) sees long stretches of context-free input.
// States that cannot reach the end of their rule, and rules that derive no finite string, are
// pruned; left recursion is refused (a GrammarError naming the rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grammar/gbnf_parser.h"

namespace tpcli::grammar {

constexpr int MAX_NFA_STATES = 400000;        // while building, all rules together
constexpr int MAX_AUTOMATON_STATES = 200000;  // the DFAs, all rules together

struct ByteEdge {
  uint8_t first = 0, last = 0;  // inclusive
  int32_t to = -1;              // a state of the same rule
};

struct CallEdge {
  int32_t rule = -1;  // pushed; when it ends, the caller continues at `to`
  int32_t to = -1;
};

struct AutomatonState {
  int32_t rule = -1;
  bool accepting = false;  // the rule may end here
  std::vector<ByteEdge> bytes;  // sorted, disjoint
  std::vector<CallEdge> calls;
};

struct GrammarAutomaton {
  std::vector<AutomatonState> states;
  std::vector<int32_t> rule_start;  // [rules] start state of each rule
  std::vector<std::string> rule_names;
  int32_t root_rule = 0;

  // The state after `byte` from `state`, -1 when none.
  int32_t next(int32_t state, uint8_t byte) const {
    for (const ByteEdge& e : states[static_cast<size_t>(state)].bytes) {
      if (byte < e.first) return -1;
      if (byte <= e.last) return e.to;
    }
    return -1;
  }
};

GrammarAutomaton build_automaton(const GbnfGrammar& grammar);

}  // namespace tpcli::grammar
