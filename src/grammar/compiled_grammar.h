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

#include <atomic>
#include <cstdint>
#include <mutex>
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

// Caches are built at compile time, states nearest the start first, for PRECOMPUTE_BUDGET_MS; the
// rest on first use (thread-safe; each once, shared by every Matcher). A schema with long bounded
// repetitions (maxLength 40: forty copies of a string character's states) thus compiles fast and
// pays a few milliseconds the first time a sequence reaches each such state.
constexpr double PRECOMPUTE_BUDGET_MS = 30.0;

struct CacheBuilder;  // the memoised stack-set table and follow sets (compiled_grammar.cpp)

class CompiledGrammar {
 public:
  CompiledGrammar(GrammarAutomaton automaton, std::shared_ptr<const TokenVocabulary> vocabulary,
                  double precompute_budget_ms = PRECOMPUTE_BUDGET_MS);
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const GrammarAutomaton& automaton() const { return automaton_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // The cache of a state that reads bytes (built now if it was not yet).
  const TokenMaskCache& cache(int32_t state) const;
  size_t cacheable_states() const { return cacheable_; }
  size_t built_caches() const { return built_.load(); }

 private:
  GrammarAutomaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t cacheable_ = 0;
  mutable std::mutex build_mutex_;
  mutable std::unique_ptr<CacheBuilder> builder_;
  mutable std::vector<std::unique_ptr<TokenMaskCache>> caches_;      // [states], filled under build_mutex_
  std::unique_ptr<std::atomic<const TokenMaskCache*>[]> ready_;       // [states], published caches
  mutable std::atomic<size_t> built_{0};
};

// Parses and compiles; throws GrammarError (grammar/grammar_error.h).
std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view gbnf, std::shared_ptr<const TokenVocabulary> vocabulary);

}  // namespace tpcli::grammar
