#include "grammar/matcher.h"

#include <algorithm>
#include <stdexcept>

namespace tpcli::grammar {

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  const GrammarAutomaton& a = grammar_->automaton();
  const int32_t root = arena_.intern(a.rule_start[static_cast<size_t>(a.root_rule)], NO_PARENT);
  StackWalker walker(a, arena_);
  walker.expand({&root, 1}, stacks_);
}

void Matcher::fill_mask(std::span<uint32_t> bits) const {
  const TokenVocabulary& vocab = grammar_->vocabulary();
  if (bits.size() != (static_cast<size_t>(vocab.size()) + 31) / 32)
    throw std::invalid_argument("grammar: fill_mask needs " + std::to_string((vocab.size() + 31) / 32) + " words, got " +
                                std::to_string(bits.size()));
  std::fill(bits.begin(), bits.end(), 0u);
  std::vector<int32_t> tops;
  for (const int32_t id : stacks_.nodes) tops.push_back(arena_.node(id).state);
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  bool any_uncertain = false;
  std::vector<const TokenMaskCache*> parts;
  for (const int32_t state : tops) {
    grammar_->caches(state, parts);
    for (const TokenMaskCache* cache : parts) {
      if (!cache->accepted_bits.empty())
        for (size_t w = 0; w < bits.size(); ++w) bits[w] |= cache->accepted_bits[w];
      for (const int32_t t : cache->accepted_ids) bits[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
      any_uncertain |= !cache->uncertain_tokens.empty();
    }
  }
  if (!any_uncertain) return;
  StackArena scratch = arena_;
  StackWalker walker(grammar_->automaton(), scratch);
  std::vector<int32_t> callers;
  std::vector<char> ok;
  StackSet continuation;
  for (const int32_t state : tops) {
    grammar_->caches(state, parts);
    if (std::all_of(parts.begin(), parts.end(), [](const TokenMaskCache* c) { return c->uncertain_tokens.empty(); })) continue;
    // Where the rule of `state` returns to, in every stack whose top it is.
    callers.clear();
    for (const int32_t id : stacks_.nodes) {
      const StackNode& node = arena_.node(id);
      if (node.state == state && node.parent != NO_PARENT) callers.push_back(node.parent);
    }
    if (callers.empty()) continue;  // the root's own rule: nothing reads after its end
    walker.expand(callers, continuation);
    for (const TokenMaskCache* cache : parts) allow_uncertain(*cache, continuation, walker, ok, bits);
  }
}

void Matcher::allow_uncertain(const TokenMaskCache& cache, const StackSet& continuation, StackWalker& walker,
                              std::vector<char>& ok, std::span<uint32_t> bits) const {
  if (cache.uncertain_tokens.empty()) return;
  check_suffixes(continuation, cache.suffixes, walker, ok);
  for (size_t u = 0; u < cache.uncertain_tokens.size(); ++u) {
    const int32_t t = cache.uncertain_tokens[u];
    uint32_t& word = bits[static_cast<size_t>(t) / 32];
    if (word & (1u << (t % 32))) continue;
    for (int32_t k = cache.uncertain_offsets[u]; k < cache.uncertain_offsets[u + 1]; ++k)
      if (ok[static_cast<size_t>(cache.uncertain_suffixes[static_cast<size_t>(k)])]) {
        word |= 1u << (t % 32);
        break;
      }
  }
}

void Matcher::check_suffixes(const StackSet& from, const std::vector<std::string>& suffixes, StackWalker& walker,
                             std::vector<char>& ok) const {
  ok.assign(suffixes.size(), 0);
  std::vector<StackSet> at_depth(1, from);  // the stacks after the first d bytes of the current suffix
  size_t dead_prefix = 0;                   // > 0: the previous suffix's first dead_prefix bytes read nothing
  const std::string* previous = nullptr;
  for (size_t i = 0; i < suffixes.size(); ++i) {
    const std::string& s = suffixes[i];
    size_t lcp = 0;
    if (previous)
      while (lcp < s.size() && lcp < previous->size() && s[lcp] == (*previous)[lcp]) ++lcp;
    previous = &s;
    if (dead_prefix > 0 && lcp >= dead_prefix) continue;
    dead_prefix = 0;
    if (at_depth.size() < s.size() + 1) at_depth.resize(s.size() + 1);
    bool alive = true;
    for (size_t d = lcp; d < s.size(); ++d) {
      walker.advance(at_depth[d], static_cast<uint8_t>(s[d]), at_depth[d + 1]);
      if (at_depth[d + 1].empty()) {
        dead_prefix = d + 1;
        alive = false;
        break;
      }
    }
    ok[i] = alive;
  }
}

bool Matcher::accept(int token) {
  if (token < 0 || token >= grammar_->vocabulary().size()) return false;
  const std::string& bytes = grammar_->vocabulary().bytes(token);
  return !bytes.empty() && accept_bytes(bytes);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  StackArena scratch = arena_;
  StackWalker walker(grammar_->automaton(), scratch);
  StackSet current = stacks_, next;
  for (const char c : bytes) {
    walker.advance(current, static_cast<uint8_t>(c), next);
    if (next.empty()) return false;
    std::swap(current, next);
  }
  StackArena compact;
  compact_stacks(scratch, current, compact);
  arena_ = std::move(compact);
  stacks_ = std::move(current);
  return true;
}

}  // namespace tpcli::grammar
