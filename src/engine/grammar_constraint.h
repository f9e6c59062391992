// tpcli::engine — grammars (grammar/: GBNF, JSON schema) as the token constraints of requests
// (engine/token_constraint.h), for one tokenizer.
//
// The tokenizer's vocabulary is read once (text/token_bytes.h); each grammar is compiled against it
// once and kept among the last few, so the grammar a server's HTTP side compiled to check a request
// is not compiled again by the devices that run it. Each sequence gets its own matcher.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

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
  static constexpr size_t CACHED_GRAMMARS = 16;

  explicit GrammarConstraints(const text::TokenizerInterface& tokenizer);
  ~GrammarConstraints();
  // The constraint of a GBNF grammar; grammar::GrammarError (a std::invalid_argument naming the
  // line and column) when it does not compile. Safe to call from several threads.
  TokenConstraintFactory compile(const std::string& gbnf);

 private:
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const grammar::CompiledGrammar>>> cache_;  // most recent first
};

}  // namespace tpcli::engine
