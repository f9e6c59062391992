// tpcli::engine — grammars as token constraints (see grammar_constraint.h).
#include "engine/grammar_constraint.h"

#include <algorithm>

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

GrammarConstraints::Compiled GrammarConstraints::held(const std::string& gbnf) const {
  const auto it = known_.find(gbnf);
  return it == known_.end() ? nullptr : it->second.lock();
}

void GrammarConstraints::keep_recent(const Compiled& compiled) {
  const auto it = std::find(recent_.begin(), recent_.end(), compiled);
  if (it != recent_.end()) recent_.splice(recent_.begin(), recent_, it);
  else recent_.push_front(compiled);
  if (recent_.size() > RECENT_GRAMMARS) recent_.pop_back();
}

TokenConstraintFactory GrammarConstraints::compile(const std::string& gbnf) {
  const auto factory = [](Compiled compiled) -> TokenConstraintFactory {
    return [compiled] { return std::make_unique<GrammarConstraint>(compiled); };
  };
  {
    std::unique_lock lock(mutex_);
    compile_done_.wait(lock, [&] { return !compiling_.contains(gbnf); });
    if (Compiled compiled = held(gbnf)) {
      keep_recent(compiled);
      return factory(std::move(compiled));
    }
    compiling_.insert(gbnf);
  }
  Compiled compiled;
  try {
    compiled = grammar::compile_gbnf(gbnf, vocabulary_);  // outside the lock: other grammars' compiles go on
  } catch (...) {
    std::lock_guard lock(mutex_);
    compiling_.erase(gbnf);
    compile_done_.notify_all();
    throw;
  }
  std::lock_guard lock(mutex_);
  compiling_.erase(gbnf);
  ++compiled_count_;
  std::erase_if(known_, [](const auto& entry) { return entry.second.expired(); });  // what no one holds any more
  known_[gbnf] = compiled;
  keep_recent(compiled);
  compile_done_.notify_all();
  return factory(std::move(compiled));
}

size_t GrammarConstraints::compiled_count() const {
  std::lock_guard lock(mutex_);
  return compiled_count_;
}

}  // namespace tpcli::engine
