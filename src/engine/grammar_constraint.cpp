// tpcli::engine — grammars as token constraints (see grammar_constraint.h).
#include "engine/grammar_constraint.h"

#include "grammar/compiled_grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_vocabulary.h"
#include "text/token_bytes.h"

namespace tpcli::engine {

namespace {

class GrammarConstraint : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> compiled) : matcher_(std::move(compiled)) {}
  void allowed_tokens(std::span<uint32_t> bits) const override {
    const auto words = static_cast<size_t>(matcher_.grammar().vocabulary().size() + 31) / 32;
    matcher_.fill_mask(bits.first(words));
  }
  void accept(int token) override {
    if (!matcher_.accept(token)) throw std::logic_error("grammar constraint: token " + std::to_string(token) + " was not allowed");
  }
  bool can_end() const override { return matcher_.can_end(); }
  bool must_end() const override { return matcher_.must_end(); }

 private:
  grammar::Matcher matcher_;
};

}  // namespace

GrammarConstraints::GrammarConstraints(const text::TokenizerInterface& tokenizer)
    : vocabulary_(std::make_shared<const grammar::TokenVocabulary>(text::token_bytes(tokenizer))) {}

GrammarConstraints::~GrammarConstraints() = default;

TokenConstraintFactory GrammarConstraints::compile(const std::string& gbnf) {
  std::shared_ptr<const grammar::CompiledGrammar> compiled;
  {
    std::lock_guard lock(mutex_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it)
      if (it->first == gbnf) {
        cache_.splice(cache_.begin(), cache_, it);
        compiled = it->second;
        break;
      }
  }
  if (!compiled) {
    compiled = grammar::compile_gbnf(gbnf, vocabulary_);  // outside the lock: another thread's compile goes on
    std::lock_guard lock(mutex_);
    cache_.emplace_front(gbnf, compiled);
    if (cache_.size() > CACHED_GRAMMARS) cache_.pop_back();
  }
  return [compiled] { return std::make_unique<GrammarConstraint>(compiled); };
}

}  // namespace tpcli::engine
