// tpcli::grammar — a grammar compiled against one vocabulary: its automaton (grammar/automaton.h)
// and, for every automaton state that reads bytes, the token-mask cache (XGrammar's "adaptive token
// mask cache"):
//
//   accepted   tokens whose bytes the state's own rule consumes whatever the stacks below it are
//              (the rule may also end exactly at the token's end);
//   uncertain  tokens that survive only if the rule ends inside them and the stack below reads the
//              rest; each is kept with those rests ("suffixes", deduplicated per state), so the
//              Matcher checks each distinct suffix once against the real caller's continuation;
//   rejected   everything else (never stored).
//
// Computed by one walk of the vocabulary's prefix tree per state, with the pushdown moves memoised
// on interned stack sets (tokens sharing a prefix share its steps; dead prefixes prune their subtree).
//
// Dimension legend: V vocabulary size, W = (V + 31) / 32 mask words.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/token_vocabulary.h"

namespace tpcli::grammar {

struct TokenMaskCache {
  std::vector<uint32_t> accepted_bits;  // [W] when dense, else empty
  std::vector<int32_t> accepted_ids;    // the accepted tokens when sparse (fewer than W)
  std::vector<std::string> suffixes;    // sorted, distinct
  std::vector<int32_t> uncertain_tokens;
  std::vector<int32_t> uncertain_offsets;  // [uncertain + 1] CSR into uncertain_suffixes
  std::vector<int32_t> uncertain_suffixes; // suffix ids
};

class CompiledGrammar {
 public:
  CompiledGrammar(GrammarAutomaton automaton, std::shared_ptr<const TokenVocabulary> vocabulary);

  const GrammarAutomaton& automaton() const { return automaton_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // The cache of a state that reads bytes; nullptr for states the root cannot reach.
  const TokenMaskCache* cache(int32_t state) const {
    const int32_t i = cache_index_[static_cast<size_t>(state)];
    return i < 0 ? nullptr : &caches_[static_cast<size_t>(i)];
  }
  size_t cached_states() const { return caches_.size(); }

 private:
  GrammarAutomaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> cache_index_;  // [states] -> caches_, -1 when none
  std::vector<TokenMaskCache> caches_;
};

// Parses and compiles; throws GrammarError (grammar/grammar_error.h).
std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view gbnf, std::shared_ptr<const TokenVocabulary> vocabulary);

}  // namespace tpcli::grammar
