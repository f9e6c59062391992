#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <bitset>
#include <chrono>
#include <map>
#include <unordered_map>

#include "grammar/gbnf_parser.h"
#include "grammar/stack_engine.h"

namespace tpcli::grammar {

namespace {

using ByteSet = std::bitset<256>;

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
  bool can_end(int32_t set) const { return ends_[static_cast<size_t>(set)]; }

 private:
  static constexpr int32_t UNKNOWN = -2;
  int32_t intern(StackSet set) {
    const auto [it, inserted] = ids_.emplace(std::move(set), static_cast<int32_t>(sets_.size()));
    if (inserted) {
      sets_.push_back(it->first);
      ends_.push_back(it->first.end);
      next_.resize(next_.size() + 256, UNKNOWN);
    }
    return it->second;
  }

  StackArena arena_;
  StackWalker walker_;
  std::unordered_map<StackSet, int32_t, StackSetHash> ids_;
  std::vector<StackSet> sets_;
  std::vector<uint8_t> ends_;  // [sets] sets_[i].end, compact: the walks read it at every node
  std::vector<int32_t> next_;  // [sets * 256]
};

// A prefix whose stack set is DEAD may still live in the caller when the rule could end before one
// of its bytes (an escape, at that byte's offset): its tokens are then uncertain, not rejected.
TokenMaskCache build_cache(int32_t state, const TokenVocabulary& vocab, StackSetTable& table, const ByteSet& follow) {
  TokenMaskCache cache;
  const auto& trie = vocab.trie();
  const auto& sorted = vocab.sorted_tokens();
  const size_t depth_slots = static_cast<size_t>(vocab.max_token_bytes()) + 2;
  std::vector<int32_t> set_at(depth_slots, StackSetTable::DEAD);  // stack set after `depth` bytes
  std::vector<int32_t> escapes_at(depth_slots, 0);                // escapes along the path so far
  std::vector<int32_t> escape_offset(depth_slots, 0);             // their byte offsets (a stack along the path)
  set_at[0] = table.start(state);
  std::vector<int32_t> accepted;
  // Each uncertain token's suffixes as (token, offset) pairs: [uncertain_tokens][escapes].
  std::vector<std::pair<int32_t, int32_t>> suffix_refs;  // (token, offset)
  std::vector<int32_t> suffix_ref_offsets{0};
  for (size_t i = 0; i < trie.size();) {
    const auto& node = trie[i];
    const auto d = static_cast<size_t>(node.depth);
    const int32_t parent = set_at[d - 1];
    escapes_at[d] = escapes_at[d - 1];
    if (table.can_end(parent) && follow.test(node.byte)) escape_offset[static_cast<size_t>(escapes_at[d]++)] = static_cast<int32_t>(d - 1);
    const int32_t next = table.step(parent, node.byte);
    if (next == StackSetTable::DEAD) {
      if (escapes_at[d] > 0)
        for (int32_t k = node.first; k < node.end; ++k) {
          const int32_t token = sorted[static_cast<size_t>(k)];
          cache.uncertain_tokens.push_back(token);
          for (int32_t e = 0; e < escapes_at[d]; ++e) suffix_refs.emplace_back(token, escape_offset[static_cast<size_t>(e)]);
          suffix_ref_offsets.push_back(static_cast<int32_t>(suffix_refs.size()));
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
  // Distinct suffixes, sorted; each reference gets its suffix's id.
  auto text_of = [&](const std::pair<int32_t, int32_t>& ref) {
    return std::string_view(vocab.bytes(ref.first)).substr(static_cast<size_t>(ref.second));
  };
  std::vector<int32_t> order(suffix_refs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
    return text_of(suffix_refs[static_cast<size_t>(x)]) < text_of(suffix_refs[static_cast<size_t>(y)]);
  });
  std::vector<int32_t> suffix_of(suffix_refs.size());
  for (const int32_t i : order) {
    const std::string_view text = text_of(suffix_refs[static_cast<size_t>(i)]);
    if (cache.suffixes.empty() || cache.suffixes.back() != text) cache.suffixes.emplace_back(text);
    suffix_of[static_cast<size_t>(i)] = static_cast<int32_t>(cache.suffixes.size()) - 1;
  }
  cache.uncertain_offsets = std::move(suffix_ref_offsets);
  cache.uncertain_suffixes = std::move(suffix_of);
  return cache;
}

// For each rule, the bytes that can come right after it ends somewhere in the grammar (an escape on
// any other byte is dead). The root, when nothing calls it, is followed by nothing.
std::vector<ByteSet> follow_bytes(const GrammarAutomaton& a) {
  StackArena arena;
  StackWalker walker(a, arena);
  struct Site {
    int32_t caller_rule;
    ByteSet first;  // bytes readable where the caller continues
    bool caller_may_end;
  };
  std::vector<std::vector<Site>> sites(a.rule_start.size());
  StackSet set;
  for (const auto& state : a.states)
    for (const CallEdge& call : state.calls) {
      const int32_t seed = arena.intern(call.to, NO_PARENT);
      walker.expand({&seed, 1}, set);
      Site site{state.rule, {}, set.end};
      for (const int32_t id : set.nodes)
        for (const ByteEdge& e : a.states[static_cast<size_t>(arena.node(id).state)].bytes)
          for (int b = e.first; b <= e.last; ++b) site.first.set(static_cast<size_t>(b));
      sites[static_cast<size_t>(call.rule)].push_back(site);
    }
  std::vector<ByteSet> follow(a.rule_start.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < sites.size(); ++r)
      for (const Site& site : sites[r]) {
        ByteSet next = follow[r] | site.first;
        if (site.caller_may_end) next |= follow[static_cast<size_t>(site.caller_rule)];
        if (next != follow[r]) {
          follow[r] = next;
          changed = true;
        }
      }
  }
  return follow;
}

// The states the root can reach, nearest the start first (breadth first over bytes and calls).
std::vector<int32_t> states_by_distance(const GrammarAutomaton& a) {
  std::vector<char> seen(a.states.size(), 0);
  std::vector<int32_t> order{a.rule_start[static_cast<size_t>(a.root_rule)]};
  seen[static_cast<size_t>(order[0])] = 1;
  auto visit = [&](int32_t s) {
    if (!seen[static_cast<size_t>(s)]) {
      seen[static_cast<size_t>(s)] = 1;
      order.push_back(s);
    }
  };
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& state = a.states[static_cast<size_t>(order[i])];
    for (const auto& c : state.calls) visit(a.rule_start[static_cast<size_t>(c.rule)]);
    for (const auto& e : state.bytes) visit(e.to);
    for (const auto& c : state.calls) visit(c.to);
  }
  return order;
}

}  // namespace

struct CacheBuilder {
  explicit CacheBuilder(const GrammarAutomaton& automaton) : follow(follow_bytes(automaton)), table(automaton) {}
  std::vector<ByteSet> follow;  // [rules]
  StackSetTable table;
};

CompiledGrammar::CompiledGrammar(GrammarAutomaton automaton, std::shared_ptr<const TokenVocabulary> vocabulary,
                                 double precompute_budget_ms)
    : automaton_(std::move(automaton)), vocabulary_(std::move(vocabulary)) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = automaton_.states.size();
  builder_ = std::make_unique<CacheBuilder>(automaton_);
  caches_.resize(n);
  ready_ = std::make_unique<std::atomic<const TokenMaskCache*>[]>(n);
  for (size_t s = 0; s < n; ++s) ready_[s].store(nullptr);
  for (const int32_t s : states_by_distance(automaton_)) {
    if (automaton_.states[static_cast<size_t>(s)].bytes.empty()) continue;
    ++cacheable_;
    if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < precompute_budget_ms)
      (void)cache(s);
  }
}

CompiledGrammar::~CompiledGrammar() = default;

const TokenMaskCache& CompiledGrammar::cache(int32_t state) const {
  if (const TokenMaskCache* ready = ready_[static_cast<size_t>(state)].load(std::memory_order_acquire)) return *ready;
  std::lock_guard<std::mutex> lock(build_mutex_);
  auto& slot = caches_[static_cast<size_t>(state)];
  if (!slot) {
    const ByteSet& follow = builder_->follow[static_cast<size_t>(automaton_.states[static_cast<size_t>(state)].rule)];
    slot = std::make_unique<TokenMaskCache>(build_cache(state, *vocabulary_, builder_->table, follow));
    ready_[static_cast<size_t>(state)].store(slot.get(), std::memory_order_release);
    built_.fetch_add(1);
  }
  return *slot;
}

std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view gbnf, std::shared_ptr<const TokenVocabulary> vocabulary) {
  return std::make_shared<const CompiledGrammar>(build_automaton(parse_gbnf(gbnf)), std::move(vocabulary));
}

}  // namespace tpcli::grammar
