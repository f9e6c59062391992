// tpcli::engine — grammars (grammar/: GBNF, JSON schema) as the token constraints of requests
// (engine/token_constraint.h), for one tokenizer.
//
// The tokenizer's vocabulary is read once (text/token_bytes.h); each grammar is compiled against it
// once while anything holds it: a request's constraint (its factory and matchers share the compiled
// grammar) or the last few no request holds any more. So the grammar a server's HTTP side compiled to
// check a request is not compiled again by the devices that run it, however many distinct grammars
// are in flight; two threads asking for one grammar at once compile it once. Each sequence gets its
// own matcher.
#pragma once

#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "engine/token_constraint.h"

namespace tpcli::grammar {
class CompiledGrammar;
class TokenVocabulary;
}  // namespace tpcli::grammar

namespace tpcli::text {
class TokenizerInterface;
}

namespace tpcli::engine {

class GrammarConstraints {
 public:
  static constexpr size_t RECENT_GRAMMARS = 16;  // kept after the last request holding them ends

  explicit GrammarConstraints(const text::TokenizerInterface& tokenizer);
  ~GrammarConstraints();
  // The constraint of a GBNF grammar; grammar::GrammarError (a std::invalid_argument naming the
  // line and column) when it does not compile. Safe to call from several threads.
  TokenConstraintFactory compile(const std::string& gbnf);
  // Grammars compiled so far (a grammar asked for again while held or recent is not compiled again).
  size_t compiled_count() const;

 private:
  using Compiled = std::shared_ptr<const grammar::CompiledGrammar>;
  Compiled held(const std::string& gbnf) const;  // under mutex_
  void keep_recent(const Compiled& compiled);    // under mutex_

  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
  mutable std::mutex mutex_;
  std::condition_variable compile_done_;
  std::unordered_map<std::string, std::weak_ptr<const grammar::CompiledGrammar>> known_;  // alive while anything holds them
  std::set<std::string> compiling_;  // by some thread now: others wait for it
  std::list<Compiled> recent_;       // held here, most recent first
  size_t compiled_count_ = 0;
};

}  // namespace tpcli::engine
