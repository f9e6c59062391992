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
// Computed by one walk of a prefix tree of the vocabulary's tokens per state and band of token
// lengths (below), with the pushdown moves memoised on interned stack sets, each set's row of 256
// steps filled at once (tokens sharing a prefix share its steps; dead prefixes prune their subtree).
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

// Caches are built at compile time for PRECOMPUTE_BUDGET_MS of the compiling thread's CPU time (the
// whole CompiledGrammar construction counts): the shared bands first, states that read most bytes
// first (their caches walk most of the tree, too slow for a decode step), then nearest the start;
// the rest on first use (thread-safe; each once, shared by every Matcher).
constexpr double PRECOMPUTE_BUDGET_MS = 30.0;

// A state's cache comes in parts, one per band of token lengths. A counted repetition is unrolled
// into one copy per count (a string of maxLength 40 is forty copies of a character's states), and
// their caches differ only in the tokens long enough to reach the bound. So the tokens of a band up
// to N bytes are classified by a cache shared by every state whose future agrees with the state's on
// every input of up to N bytes: the copies at least N bytes from the bound share it, and a copy near
// the bound walks only the branches of the prefix tree that hold that band's tokens. Tokens longer
// than the last band (few in real vocabularies) are classified by a cache of the state's own. The
// bands: SHARED_BAND_LIMITS (grammar/token_vocabulary.h, which keeps a prefix tree per band).

struct CacheBuilder;  // the memoised stack-set table and follow sets (compiled_grammar.cpp)

class CompiledGrammar {
 public:
  CompiledGrammar(GrammarAutomaton automaton, std::shared_ptr<const TokenVocabulary> vocabulary,
                  double precompute_budget_ms = PRECOMPUTE_BUDGET_MS,
                  std::vector<int> band_limits = {SHARED_BAND_LIMITS.begin(), SHARED_BAND_LIMITS.end()});
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const GrammarAutomaton& automaton() const { return automaton_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // The caches of a state that reads bytes, one per band (built now if they were not yet); together
  // they classify every token once.
  void caches(int32_t state, std::vector<const TokenMaskCache*>& parts) const;
  size_t cacheable_states() const { return cacheable_; }
  size_t mask_caches() const { return mask_caches_; }  // distinct parts over the cacheable states
  size_t built_caches() const;

 private:
  struct Band {  // the tokens of shortest..longest bytes; caches filled under build_mutex_, published through `ready`
    int shortest = 1, longest = 0;
    const TokenVocabulary::PrefixTree* tree = nullptr;  // its tokens (the vocabulary's)
    std::vector<int32_t> cache_of;  // [states] equal futures for `longest` bytes: one cache
    std::vector<std::unique_ptr<TokenMaskCache>> slots;
    std::unique_ptr<std::atomic<const TokenMaskCache*>[]> ready;
    std::atomic<size_t> built{0};
  };
  const TokenMaskCache& built(Band& band, int32_t state) const;

  GrammarAutomaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t cacheable_ = 0, mask_caches_ = 0;
  mutable std::mutex build_mutex_;
  mutable std::unique_ptr<CacheBuilder> builder_;
  mutable std::vector<std::unique_ptr<Band>> bands_;  // the shared ones, then the states' own (longer tokens)
};

// Parses and compiles; throws GrammarError (grammar/grammar_error.h).
std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view gbnf, std::shared_ptr<const TokenVocabulary> vocabulary);

}  // namespace tpcli::grammar
