// tpcli::grammar — the pushdown automaton's moves over bytes: stacks of automaton states stored as
// shared nodes (a stack is its top node; nodes are interned, so equal stacks are one id and a set
// of stacks is a sorted vector of ids), the closure (push the called rules, pop the finished ones)
// and one byte's step. Used both at compile time, from a state with an unknown stack below it
// (parent NO_PARENT: the bottom), and by the Matcher with the real stacks.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"

namespace tpcli::grammar {

constexpr int32_t NO_PARENT = -1;

struct StackNode {
  int32_t state = -1;   // an automaton state
  int32_t parent = NO_PARENT;  // the caller's frame (at its return state), NO_PARENT at the bottom
};

class StackArena {
 public:
  int32_t intern(int32_t state, int32_t parent);
  const StackNode& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  size_t size() const { return nodes_.size(); }

 private:
  std::vector<StackNode> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
};

// Stacks whose top state reads bytes (sorted ids), and whether a stack ended at the bottom (for the
// Matcher: the answer is complete; at compile time: the rule below may have ended).
struct StackSet {
  std::vector<int32_t> nodes;
  bool end = false;
  bool empty() const { return nodes.empty() && !end; }
  bool operator==(const StackSet&) const = default;
};

class StackWalker {
 public:
  StackWalker(const GrammarAutomaton& automaton, StackArena& arena) : a_(automaton), arena_(arena) {}
  // `seeds`: frames that just arrived at their state; pushes calls and pops finished rules.
  void expand(std::span<const int32_t> seeds, StackSet& out);
  // One byte from every stack of `from` (its `end` reads nothing).
  void advance(const StackSet& from, uint8_t byte, StackSet& out);

 private:
  const GrammarAutomaton& a_;
  StackArena& arena_;
  std::vector<uint32_t> stamp_;
  uint32_t epoch_ = 0;
  std::vector<int32_t> work_, seeds_;
};

// Copies the stacks of `set` from `from` into a fresh arena (dropping every other node): the Matcher's
// garbage collection after each token.
void compact_stacks(const StackArena& from, StackSet& set, StackArena& to);

}  // namespace tpcli::grammar
