#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "grammar/gbnf_parser.h"
#include "grammar/stack_engine.h"

namespace tpcli::grammar {

namespace {

struct StackSetHash {
  size_t operator()(const StackSet& s) const {
    uint64_t h = s.end ? 0x9E3779B97F4A7C15ull : 0;
    for (int32_t id : s.nodes) h = (h ^ static_cast<uint32_t>(id)) * 0x100000001B3ull;
    return static_cast<size_t>(h);
  }
};

// Interned stack sets over one arena whose bottoms are "the rule below, unknown", with each
// (set, byte) step computed once: the pushdown automaton determinised lazily, as far as the walks go.
class StackSetTable {
 public:
  static constexpr int32_t DEAD = -1;

  explicit StackSetTable(const GrammarAutomaton& automaton) : walker_(automaton, arena_) {}

  int32_t start(int32_t state) {
    const int32_t seed = arena_.intern(state, NO_PARENT);
    StackSet set;
    walker_.expand({&seed, 1}, set);
    return intern(std::move(set));
  }
  int32_t step(int32_t set, uint8_t byte) {
    int32_t& next = next_[static_cast<size_t>(set) * 256 + byte];
    if (next == UNKNOWN) {
      StackSet out;
      walker_.advance(sets_[static_cast<size_t>(set)], byte, out);
      const int32_t id = out.empty() ? DEAD : intern(std::move(out));
      next_[static_cast<size_t>(set) * 256 + byte] = id;
      return id;
    }
    return next;
  }
  bool can_end(int32_t set) const { return sets_[static_cast<size_t>(set)].end; }

 private:
  static constexpr int32_t UNKNOWN = -2;
  int32_t intern(StackSet set) {
    const auto [it, inserted] = ids_.emplace(std::move(set), static_cast<int32_t>(sets_.size()));
    if (inserted) {
      sets_.push_back(it->first);
      next_.resize(next_.size() + 256, UNKNOWN);
    }
    return it->second;
  }

  StackArena arena_;
  StackWalker walker_;
  std::unordered_map<StackSet, int32_t, StackSetHash> ids_;
  std::vector<StackSet> sets_;
  std::vector<int32_t> next_;  // [sets * 256]
};

// A prefix whose stack set is DEAD may still live in the caller when the rule could end before one
// of its bytes (an escape, at that byte's offset): its tokens are then uncertain, not rejected.
TokenMaskCache build_cache(int32_t state, const TokenVocabulary& vocab, StackSetTable& table) {
  TokenMaskCache cache;
  const auto& trie = vocab.trie();
  const auto& sorted = vocab.sorted_tokens();
  const size_t depth_slots = static_cast<size_t>(vocab.max_token_bytes()) + 2;
  std::vector<int32_t> set_at(depth_slots, StackSetTable::DEAD);  // stack set after `depth` bytes
  std::vector<int32_t> escapes_at(depth_slots, 0);                // escapes along the path so far
  std::vector<int32_t> escape_offset(depth_slots, 0);             // their byte offsets (a stack along the path)
  set_at[0] = table.start(state);
  std::vector<int32_t> accepted;
  std::map<std::string, int32_t, std::less<>> suffix_ids;
  std::vector<std::vector<std::string_view>> uncertain_suffix_text;
  for (size_t i = 0; i < trie.size();) {
    const auto& node = trie[i];
    const auto d = static_cast<size_t>(node.depth);
    const int32_t parent = set_at[d - 1];
    escapes_at[d] = escapes_at[d - 1];
    if (table.can_end(parent)) escape_offset[static_cast<size_t>(escapes_at[d]++)] = static_cast<int32_t>(d - 1);
    const int32_t next = table.step(parent, node.byte);
    if (next == StackSetTable::DEAD) {
      if (escapes_at[d] > 0)
        for (int32_t k = node.first; k < node.end; ++k) {
          const int32_t token = sorted[static_cast<size_t>(k)];
          const std::string_view bytes = vocab.bytes(token);
          cache.uncertain_tokens.push_back(token);
          auto& texts = uncertain_suffix_text.emplace_back();
          for (int32_t e = 0; e < escapes_at[d]; ++e) texts.push_back(bytes.substr(static_cast<size_t>(escape_offset[static_cast<size_t>(e)])));
        }
      i = static_cast<size_t>(node.subtree_end);
      continue;
    }
    set_at[d] = next;
    for (int32_t k = node.first; k < node.exact_end; ++k) accepted.push_back(sorted[static_cast<size_t>(k)]);
    ++i;
  }
  const size_t words = (static_cast<size_t>(vocab.size()) + 31) / 32;
  if (accepted.size() >= words) {
    cache.accepted_bits.assign(words, 0);
    for (int32_t t : accepted) cache.accepted_bits[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
  } else {
    std::sort(accepted.begin(), accepted.end());
    cache.accepted_ids = std::move(accepted);
  }
  for (const auto& texts : uncertain_suffix_text)
    for (std::string_view s : texts) suffix_ids.emplace(std::string(s), 0);
  int32_t next_id = 0;
  for (auto& [text, id] : suffix_ids) {
    id = next_id++;
    cache.suffixes.push_back(text);
  }
  cache.uncertain_offsets.push_back(0);
  for (const auto& texts : uncertain_suffix_text) {
    for (std::string_view s : texts) cache.uncertain_suffixes.push_back(suffix_ids.find(s)->second);
    cache.uncertain_offsets.push_back(static_cast<int32_t>(cache.uncertain_suffixes.size()));
  }
  return cache;
}

// States the root can reach: those that read bytes get a cache.
std::vector<char> reachable_states(const GrammarAutomaton& a) {
  std::vector<char> seen(a.states.size(), 0), rule_seen(a.rule_start.size(), 0);
  std::vector<int32_t> work{a.rule_start[static_cast<size_t>(a.root_rule)]};
  rule_seen[static_cast<size_t>(a.root_rule)] = 1;
  seen[static_cast<size_t>(work[0])] = 1;
  auto visit = [&](int32_t s) {
    if (!seen[static_cast<size_t>(s)]) {
      seen[static_cast<size_t>(s)] = 1;
      work.push_back(s);
    }
  };
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    for (const auto& e : a.states[static_cast<size_t>(s)].bytes) visit(e.to);
    for (const auto& c : a.states[static_cast<size_t>(s)].calls) {
      visit(c.to);
      visit(a.rule_start[static_cast<size_t>(c.rule)]);
    }
  }
  return seen;
}

}  // namespace

CompiledGrammar::CompiledGrammar(GrammarAutomaton automaton, std::shared_ptr<const TokenVocabulary> vocabulary)
    : automaton_(std::move(automaton)), vocabulary_(std::move(vocabulary)) {
  const std::vector<char> reachable = reachable_states(automaton_);
  cache_index_.assign(automaton_.states.size(), -1);
  StackSetTable table(automaton_);
  for (size_t s = 0; s < automaton_.states.size(); ++s) {
    if (!reachable[s] || automaton_.states[s].bytes.empty()) continue;
    cache_index_[s] = static_cast<int32_t>(caches_.size());
    caches_.push_back(build_cache(static_cast<int32_t>(s), *vocabulary_, table));
  }
}

std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view gbnf, std::shared_ptr<const TokenVocabulary> vocabulary) {
  return std::make_shared<const CompiledGrammar>(build_automaton(parse_gbnf(gbnf)), std::move(vocabulary));
}

}  // namespace tpcli::grammar
