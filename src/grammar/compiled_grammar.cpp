#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <bit>
#include <bitset>
#include <ctime>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
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

  explicit StackSetTable(const GrammarAutomaton& automaton) : automaton_(automaton), walker_(automaton, arena_) {}

  int32_t start(int32_t state) {
    const int32_t seed = arena_.intern(state, NO_PARENT);
    StackSet set;
    walker_.expand({&seed, 1}, set);
    return intern(std::move(set));
  }
  int32_t step(int32_t set, uint8_t byte) {
    const size_t row = static_cast<size_t>(set) * 256;
    if (next_[row + byte] == UNKNOWN) fill_row(set);
    return next_[row + byte];
  }
  bool can_end(int32_t set) const { return ends_[static_cast<size_t>(set)]; }

 private:
  static constexpr int32_t UNKNOWN = -2;
  // Every byte's step from `set` at once: the bytes between two edge boundaries of its states step
  // alike, so one walker move per piece (a string character's states have a handful of pieces).
  void fill_row(int32_t set) {
    cuts_.assign({0, 256});
    for (const int32_t id : sets_[static_cast<size_t>(set)].nodes)
      for (const ByteEdge& e : automaton_.states[static_cast<size_t>(arena_.node(id).state)].bytes)
        cuts_.insert(cuts_.end(), {e.first, e.last + 1});
    std::sort(cuts_.begin(), cuts_.end());
    cuts_.erase(std::unique(cuts_.begin(), cuts_.end()), cuts_.end());
    for (size_t c = 0; c + 1 < cuts_.size(); ++c) {
      StackSet out;
      walker_.advance(sets_[static_cast<size_t>(set)], static_cast<uint8_t>(cuts_[c]), out);
      const int32_t id = out.empty() ? DEAD : intern(std::move(out));  // may grow next_
      std::fill(next_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(set) * 256 + static_cast<size_t>(cuts_[c])),
                next_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(set) * 256 + static_cast<size_t>(cuts_[c + 1])), id);
    }
  }
  int32_t intern(StackSet set) {
    const auto [it, inserted] = ids_.emplace(std::move(set), static_cast<int32_t>(sets_.size()));
    if (inserted) {
      sets_.push_back(it->first);
      ends_.push_back(it->first.end);
      next_.resize(next_.size() + 256, UNKNOWN);
    }
    return it->second;
  }

  const GrammarAutomaton& automaton_;
  StackArena arena_;
  StackWalker walker_;
  std::vector<int> cuts_;
  std::unordered_map<StackSet, int32_t, StackSetHash> ids_;
  std::vector<StackSet> sets_;
  std::vector<uint8_t> ends_;  // [sets] sets_[i].end, compact: the walks read it at every node
  std::vector<int32_t> next_;  // [sets * 256]
};

// A prefix whose stack set is DEAD may still live in the caller when the rule could end before one
// of its bytes (an escape, at that byte's offset): its tokens are then uncertain, not rejected.
// `tree`: the tokens the cache classifies (a band of the vocabulary's).
TokenMaskCache build_cache(int32_t state, const TokenVocabulary& vocab, const TokenVocabulary::PrefixTree& tree,
                           StackSetTable& table, const ByteSet& follow) {
  TokenMaskCache cache;
  const auto& trie = tree.nodes;
  const auto& sorted = tree.sorted_tokens;
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

// This thread's CPU time: the budget buys the same caches on a busy machine as on an idle one.
double thread_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

// States that read most bytes first (their caches walk most of the prefix tree: a first use would
// stall a decode step), then the others; each group in `by_distance` order.
std::vector<int32_t> precompute_order(const GrammarAutomaton& a, const std::vector<int32_t>& by_distance) {
  constexpr int WIDE = 128;  // bytes the state reads itself
  std::vector<int32_t> wide, narrow;
  for (const int32_t s : by_distance) {
    int readable = 0;
    for (const ByteEdge& e : a.states[static_cast<size_t>(s)].bytes) readable += e.last - e.first + 1;
    (readable >= WIDE ? wide : narrow).push_back(s);
  }
  wide.insert(wide.end(), narrow.begin(), narrow.end());
  return wide;
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

// Interns signatures (short int vectors) as dense ids: one flat buffer and an open-addressing index,
// no allocation per signature.
class SignatureIds {
 public:
  explicit SignatureIds(size_t expected) : slots_(std::bit_ceil(2 * expected + 2), EMPTY) {}
  int32_t id(const std::vector<int32_t>& sig) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (const int32_t x : sig) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001B3ull;
    for (size_t i = (h ^ (h >> 29)) & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const int32_t id = slots_[i];
      if (id == EMPTY) {
        slots_[i] = static_cast<int32_t>(offsets_.size()) - 1;
        data_.insert(data_.end(), sig.begin(), sig.end());
        offsets_.push_back(data_.size());
        return slots_[i];
      }
      const auto at = static_cast<size_t>(id);
      if (offsets_[at + 1] - offsets_[at] == sig.size() &&
          std::equal(sig.begin(), sig.end(), data_.begin() + static_cast<std::ptrdiff_t>(offsets_[at])))
        return id;
    }
  }
  size_t size() const { return offsets_.size() - 1; }

 private:
  static constexpr int32_t EMPTY = -1;
  std::vector<int32_t> slots_;
  std::vector<int32_t> data_;
  std::vector<size_t> offsets_{0};
};

// For each of `depths` (ascending), classes of states whose futures agree on every input of up to
// that many bytes (which inputs stay alive, and after which the rule may end): Moore's refinement,
// one round per byte. A call may read nothing before it returns, so its return state is compared at
// the same depth, not one less.
std::vector<std::vector<int32_t>> equal_future_classes(const GrammarAutomaton& a, const std::vector<int>& depths) {
  const size_t n = a.states.size();
  std::vector<int32_t> classes(n), signature;
  auto renumber = [&](auto&& sign) {  // classes by signature; returns their count
    SignatureIds ids(n);
    std::vector<int32_t> next(n);
    for (size_t s = 0; s < n; ++s) {
      signature.clear();
      sign(a.states[s], classes[s], signature);
      next[s] = ids.id(signature);
    }
    classes = std::move(next);
    return ids.size();
  };
  size_t count = renumber([](const AutomatonState& state, int32_t, std::vector<int32_t>& sig) {
    sig.insert(sig.end(), {state.rule, state.accepting ? 1 : 0});
  });
  // A pass renumbers every state, so a round repeats its passes only while a call's return state
  // changes class (the partition of the return states splits).
  std::vector<int32_t> returns;
  for (const AutomatonState& state : a.states)
    for (const CallEdge& c : state.calls) returns.push_back(c.to);
  std::vector<uint32_t> stamp(n, 0);
  uint32_t epoch = 0;
  auto classes_among_returns = [&](const std::vector<int32_t>& of) {
    ++epoch;
    size_t distinct = 0;
    for (const int32_t r : returns) {
      uint32_t& seen = stamp[static_cast<size_t>(of[static_cast<size_t>(r)])];
      distinct += seen != epoch;
      seen = epoch;
    }
    return distinct;
  };
  // One round: `shallower` holds the classes one byte less deep (null in the round for depth 0).
  auto refine = [&](const std::vector<int32_t>* shallower) {
    for (bool returns_split = true; returns_split;) {
      const std::vector<int32_t> current = classes;
      count = renumber([&](const AutomatonState& state, int32_t own, std::vector<int32_t>& sig) {
        sig.push_back(own);
        if (shallower)
          for (const ByteEdge& e : state.bytes) {
            const int32_t to = (*shallower)[static_cast<size_t>(e.to)];
            if (sig.size() >= 4 && sig.back() == to && sig[sig.size() - 2] + 1 == e.first)
              sig[sig.size() - 2] = e.last;  // adjacent ranges into one class: one range
            else
              sig.insert(sig.end(), {e.first, e.last, to});
          }
        sig.push_back(-1);
        for (const CallEdge& c : state.calls) sig.insert(sig.end(), {c.rule, current[static_cast<size_t>(c.to)]});
      });
      returns_split = classes_among_returns(classes) != classes_among_returns(current);
    }
  };
  refine(nullptr);
  std::vector<std::vector<int32_t>> at_depths;
  bool stable = false;
  for (int depth = 1; at_depths.size() < depths.size(); ++depth) {
    if (!stable) {
      const std::vector<int32_t> shallower = classes;
      const size_t before = count;
      refine(&shallower);
      stable = count == before;  // no round splits a class once one has not
    }
    if (depth == depths[at_depths.size()]) at_depths.push_back(classes);
  }
  return at_depths;
}

}  // namespace

struct CacheBuilder {
  explicit CacheBuilder(const GrammarAutomaton& automaton) : follow(follow_bytes(automaton)), table(automaton) {}
  std::vector<ByteSet> follow;  // [rules]
  StackSetTable table;
};

CompiledGrammar::CompiledGrammar(GrammarAutomaton automaton, std::shared_ptr<const TokenVocabulary> vocabulary,
                                 double precompute_budget_ms, std::vector<int> band_limits)
    : automaton_(std::move(automaton)), vocabulary_(std::move(vocabulary)) {
  const double t0 = thread_cpu_ms();
  const size_t n = automaton_.states.size();
  builder_ = std::make_unique<CacheBuilder>(automaton_);
  for (size_t b = 0; b < band_limits.size(); ++b)
    if (band_limits[b] < 1 || (b > 0 && band_limits[b] <= band_limits[b - 1]))
      throw std::invalid_argument("grammar: band limits must be positive and ascending");
  std::vector<std::vector<int32_t>> classes = equal_future_classes(automaton_, band_limits);
  classes.emplace_back(n);  // the states' own band
  std::iota(classes.back().begin(), classes.back().end(), 0);
  for (size_t b = 0; b < classes.size(); ++b) {
    auto band = std::make_unique<Band>();
    band->shortest = b == 0 ? 1 : band_limits[b - 1] + 1;
    band->longest = b < band_limits.size() ? band_limits[b] : std::numeric_limits<int>::max();
    band->tree = &vocabulary_->tree_of_lengths(band->shortest, band->longest);
    band->cache_of = std::move(classes[b]);
    band->slots.resize(n);
    band->ready = std::make_unique<std::atomic<const TokenMaskCache*>[]>(n);
    for (size_t i = 0; i < n; ++i) band->ready[i].store(nullptr);
    bands_.push_back(std::move(band));
  }
  std::vector<int32_t> order = states_by_distance(automaton_);
  std::erase_if(order, [&](int32_t s) { return automaton_.states[static_cast<size_t>(s)].bytes.empty(); });
  order = precompute_order(automaton_, order);
  cacheable_ = order.size();
  for (const auto& band : bands_) {
    std::vector<char> seen(n, 0);
    for (const int32_t s : order) {
      char& c = seen[static_cast<size_t>(band->cache_of[static_cast<size_t>(s)])];
      mask_caches_ += !c;
      c = 1;
    }
  }
  auto within_budget = [&] {
    return thread_cpu_ms() - t0 < precompute_budget_ms;
  };
  for (const int32_t s : order)  // the shared bands: their first copies' caches are walks of most of their tokens
    for (size_t b = 0; b + 1 < bands_.size(); ++b) {
      if (!within_budget()) return;
      (void)built(*bands_[b], s);
    }
  for (const int32_t s : order) {  // the own band: walks of the long tokens' branches only
    if (!within_budget()) return;
    (void)built(*bands_.back(), s);
  }
}

CompiledGrammar::~CompiledGrammar() = default;

size_t CompiledGrammar::built_caches() const {
  size_t total = 0;
  for (const auto& band : bands_) total += band->built.load();
  return total;
}

const TokenMaskCache& CompiledGrammar::built(Band& band, int32_t state) const {
  const auto index = static_cast<size_t>(band.cache_of[static_cast<size_t>(state)]);
  if (const TokenMaskCache* ready = band.ready[index].load(std::memory_order_acquire)) return *ready;
  std::lock_guard<std::mutex> lock(build_mutex_);
  auto& slot = band.slots[index];
  if (!slot) {
    const ByteSet& follow = builder_->follow[static_cast<size_t>(automaton_.states[static_cast<size_t>(state)].rule)];
    slot = std::make_unique<TokenMaskCache>(
        build_cache(state, *vocabulary_, *band.tree, builder_->table, follow));
    band.ready[index].store(slot.get(), std::memory_order_release);
    band.built.fetch_add(1);
  }
  return *slot;
}

void CompiledGrammar::caches(int32_t state, std::vector<const TokenMaskCache*>& parts) const {
  parts.clear();
  for (auto& band : bands_) parts.push_back(&built(*band, state));
}

std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view gbnf, std::shared_ptr<const TokenVocabulary> vocabulary) {
  return std::make_shared<const CompiledGrammar>(build_automaton(parse_gbnf(gbnf)), std::move(vocabulary));
}

}  // namespace tpcli::grammar
