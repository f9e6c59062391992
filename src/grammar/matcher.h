// tpcli::grammar — one sequence's position in a grammar: which tokens may come next (a mask), and
// the stacks after each accepted token.
//
// fill_mask is the cache's accepted tokens of each stack's top state, plus the uncertain ones whose
// suffix the caller's continuation reads (each distinct suffix checked once, sorted so a shared
// prefix is read once, a dead prefix skipping the suffixes that start with it). Stacks live in an
// arena of shared nodes that accept() compacts to the live ones, so a Matcher stays small.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/stack_engine.h"

namespace tpcli::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // bits[t / 32] bit t % 32 set iff token t keeps the output a prefix of a valid answer;
  // bits.size() == (V + 31) / 32. End-of-sequence tokens are the caller's (allowed when can_end()).
  void fill_mask(std::span<uint32_t> bits) const;
  // False, state unchanged, when the token is not allowed (out of range, empty, or off the grammar).
  bool accept(int token);
  // The same for raw bytes (a token's, part of one, or a forced continuation).
  bool accept_bytes(std::string_view bytes);
  bool can_end() const { return stacks_.end; }  // the output so far is a whole answer
  bool must_end() const { return stacks_.end && stacks_.nodes.empty(); }  // ... and no byte may extend it

  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  // Sets the bits of `cache`'s uncertain tokens that `continuation` (where the state's rule returns to) reads.
  void allow_uncertain(const TokenMaskCache& cache, const StackSet& continuation, StackWalker& walker, std::vector<char>& ok,
                       std::span<uint32_t> bits) const;
  // Which of `suffixes` (sorted) the stacks `from` read entirely.
  void check_suffixes(const StackSet& from, const std::vector<std::string>& suffixes, StackWalker& walker,
                      std::vector<char>& ok) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackArena arena_;
  StackSet stacks_;
};

}  // namespace tpcli::grammar
