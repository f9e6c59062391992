#include "grammar/automaton.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "grammar/grammar_error.h"

namespace tpcli::grammar {

namespace {

constexpr int INLINE_LIMIT = 1000;  // size units (about NFA states) of a rule inlined into its callers
constexpr long SIZE_CAP = 1L << 40;

// ---- NFA of one rule (Thompson construction) ----
struct NfaState {
  std::vector<int> eps;
  std::vector<ByteEdge> bytes;
  std::vector<CallEdge> calls;  // rule = GBNF rule index here
};

struct RuleFacts {
  bool recursive = false;
  bool finite = true;
  long size = 0;
  bool inlinable() const { return !recursive && finite && size <= INLINE_LIMIT; }
};

// Code-point range -> UTF-8 byte-range sequences (each of 1..4 byte ranges), surrogates excluded.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (const uint32_t bound : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= bound && hi > bound) {
      utf8_sequences(lo, bound, out);
      utf8_sequences(bound + 1, hi, out);
      return;
    }
  }
  const int n = hi <= 0x7F ? 1 : hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  auto encode = [n](uint32_t cp) {
    std::vector<uint8_t> b(static_cast<size_t>(n));
    if (n == 1) {
      b[0] = static_cast<uint8_t>(cp);
    } else {
      for (int i = n - 1; i > 0; --i, cp >>= 6) b[static_cast<size_t>(i)] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      const uint8_t lead = n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0;
      b[0] = static_cast<uint8_t>(lead | cp);
    }
    return b;
  };
  const auto a = encode(lo), z = encode(hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[static_cast<size_t>(i)], z[static_cast<size_t>(i)]);
  out.push_back(std::move(seq));
}

long saturating_mul(long a, long b) { return (a != 0 && b > SIZE_CAP / a) ? SIZE_CAP : std::min(SIZE_CAP, a * b); }

class Builder {
 public:
  explicit Builder(const GbnfGrammar& grammar) : g_(grammar) {}

  GrammarAutomaton build() {
    compute_rule_facts();
    // Rules get automata when called (not inlined); the root first.
    automaton_rule_of_.assign(g_.rules.size(), -1);
    request_rule(g_.root);
    for (size_t next = 0; next < pending_.size(); ++next) build_rule(pending_[next]);
    a_.root_rule = 0;
    for (auto& state : a_.states)
      for (auto& call : state.calls) call.rule = automaton_rule_of_[static_cast<size_t>(call.rule)];
    prune();
    refuse_left_recursion();
    return std::move(a_);
  }

 private:
  [[noreturn]] void fail_rule(int gbnf_rule, const std::string& what) const {
    const GbnfRule& r = g_.rules[static_cast<size_t>(gbnf_rule)];
    throw GrammarError(gbnf_location(r.line, r.column, what));
  }

  // ---- which rules are recursive, finite and small (Tarjan's SCCs give callees first) ----
  static void collect_refs(const GbnfAlternatives& alts, std::vector<int>& refs) {
    for (const auto& seq : alts)
      for (const auto& node : seq) {
        if (node.kind == GbnfNode::Kind::rule_ref) refs.push_back(node.rule);
        if (node.kind == GbnfNode::Kind::group) collect_refs(node.alternatives, refs);
      }
  }

  void compute_rule_facts() {
    const size_t n = g_.rules.size();
    std::vector<std::vector<int>> refs(n);
    for (size_t r = 0; r < n; ++r) collect_refs(g_.rules[r].alternatives, refs[r]);
    facts_.assign(n, {});
    std::vector<int> index(n, -1), low(n, 0), scc_stack;
    std::vector<bool> on_stack(n, false);
    int counter = 0;
    struct Frame {
      int rule;
      size_t edge;
    };
    for (size_t start = 0; start < n; ++start) {
      if (index[start] >= 0) continue;
      std::vector<Frame> frames{{static_cast<int>(start), 0}};
      index[start] = low[start] = counter++;
      scc_stack.push_back(static_cast<int>(start));
      on_stack[start] = true;
      while (!frames.empty()) {
        Frame& f = frames.back();
        const auto r = static_cast<size_t>(f.rule);
        if (f.edge < refs[r].size()) {
          const auto to = static_cast<size_t>(refs[r][f.edge++]);
          if (index[to] < 0) {
            index[to] = low[to] = counter++;
            scc_stack.push_back(static_cast<int>(to));
            on_stack[to] = true;
            frames.push_back({static_cast<int>(to), 0});
          } else if (on_stack[to]) {
            low[r] = std::min(low[r], index[to]);
          }
          continue;
        }
        if (low[r] == index[r]) {  // r closes an SCC: its callees' facts are known
          std::vector<int> members;
          int m;
          do {
            m = scc_stack.back();
            scc_stack.pop_back();
            on_stack[static_cast<size_t>(m)] = false;
            members.push_back(m);
          } while (m != static_cast<int>(r));
          const bool self_loop = std::count(refs[r].begin(), refs[r].end(), static_cast<int>(r)) > 0;
          for (int member : members) facts_[static_cast<size_t>(member)].recursive = members.size() > 1 || self_loop;
          for (int member : members) {
            RuleFacts& facts = facts_[static_cast<size_t>(member)];
            if (facts.recursive) continue;
            bool finite = true;
            facts.size = alternatives_size(g_.rules[static_cast<size_t>(member)].alternatives, finite);
            facts.finite = finite;
          }
        }
        const int done = f.rule;
        frames.pop_back();
        if (!frames.empty()) {
          const auto parent = static_cast<size_t>(frames.back().rule);
          low[parent] = std::min(low[parent], low[static_cast<size_t>(done)]);
        }
      }
    }
  }

  long alternatives_size(const GbnfAlternatives& alts, bool& finite) const {
    long total = 1;
    for (const auto& seq : alts)
      for (const auto& node : seq) total = std::min(SIZE_CAP, total + node_size(node, finite));
    return total;
  }

  long node_size(const GbnfNode& node, bool& finite) const {
    long one = 1;
    switch (node.kind) {
      case GbnfNode::Kind::literal: one = static_cast<long>(node.bytes.size()) + 1; break;
      case GbnfNode::Kind::char_class: one = static_cast<long>(node.ranges.size()) * 2 + 2; break;
      case GbnfNode::Kind::rule_ref: {
        const RuleFacts& f = facts_[static_cast<size_t>(node.rule)];
        one = f.inlinable() ? f.size + 1 : 1;
        break;
      }
      case GbnfNode::Kind::group: one = alternatives_size(node.alternatives, finite); break;
    }
    if (node.max_repeat < 0) {
      finite = false;
      return saturating_mul(one, std::max(1, node.min_repeat));
    }
    return saturating_mul(one, std::max(1, node.max_repeat));
  }

  // ---- NFA construction ----
  int new_state() {
    if (static_cast<int>(nfa_.size()) + nfa_total_ >= MAX_NFA_STATES)
      throw GrammarError(gbnf_location(1, 1, "grammar too large: above " + std::to_string(MAX_NFA_STATES) +
                                                 " automaton states before determinisation"));
    nfa_.emplace_back();
    return static_cast<int>(nfa_.size()) - 1;
  }
  void eps(int from, int to) { nfa_[static_cast<size_t>(from)].eps.push_back(to); }

  void request_rule(int gbnf_rule) {
    if (automaton_rule_of_[static_cast<size_t>(gbnf_rule)] >= 0) return;
    automaton_rule_of_[static_cast<size_t>(gbnf_rule)] = static_cast<int>(pending_.size());
    pending_.push_back(gbnf_rule);
  }

  int emit_alternatives(const GbnfAlternatives& alts, int from, int depth) {
    const int end = new_state();
    for (const auto& seq : alts) {
      int at = from;
      if (alts.size() > 1) {
        at = new_state();
        eps(from, at);
      }
      for (const auto& node : seq) at = emit_repeated(node, at, depth);
      eps(at, end);
    }
    return end;
  }

  int emit_repeated(const GbnfNode& node, int from, int depth) {
    int at = from;
    for (int i = 0; i < node.min_repeat; ++i) at = emit_once(node, at, depth);
    if (node.max_repeat < 0) {
      const int loop = new_state();
      eps(at, loop);
      const int back = emit_once(node, loop, depth);
      eps(back, loop);
      return loop;
    }
    if (node.max_repeat == node.min_repeat) return at;
    const int end = new_state();
    for (int i = node.min_repeat; i < node.max_repeat; ++i) {
      eps(at, end);
      at = emit_once(node, at, depth);
    }
    eps(at, end);
    return end;
  }

  int emit_once(const GbnfNode& node, int from, int depth) {
    switch (node.kind) {
      case GbnfNode::Kind::literal: {
        int at = from;
        for (const char c : node.bytes) {
          const int next = new_state();
          const auto b = static_cast<uint8_t>(c);
          nfa_[static_cast<size_t>(at)].bytes.push_back({b, b, next});
          at = next;
        }
        return at;
      }
      case GbnfNode::Kind::char_class: {
        const int end = new_state();
        std::vector<std::vector<std::pair<uint8_t, uint8_t>>> sequences;
        for (const auto& r : node.ranges) utf8_sequences(r.first, r.last, sequences);
        for (const auto& seq : sequences) {
          int at = from;
          for (size_t i = 0; i < seq.size(); ++i) {
            const int next = i + 1 == seq.size() ? end : new_state();
            nfa_[static_cast<size_t>(at)].bytes.push_back({seq[i].first, seq[i].second, next});
            at = next;
          }
        }
        return end;
      }
      case GbnfNode::Kind::rule_ref: {
        const RuleFacts& f = facts_[static_cast<size_t>(node.rule)];
        if (f.inlinable() && depth < INLINE_LIMIT)
          return emit_alternatives(g_.rules[static_cast<size_t>(node.rule)].alternatives, from, depth + 1);
        request_rule(node.rule);
        const int next = new_state();
        nfa_[static_cast<size_t>(from)].calls.push_back({node.rule, next});
        return next;
      }
      case GbnfNode::Kind::group: return emit_alternatives(node.alternatives, from, depth);
    }
    return from;
  }

  // ---- subset construction ----
  void closure(std::vector<int>& set) const {
    std::vector<int> work = set;
    std::vector<char> seen(nfa_.size(), 0);
    for (int s : set) seen[static_cast<size_t>(s)] = 1;
    while (!work.empty()) {
      const int s = work.back();
      work.pop_back();
      for (int t : nfa_[static_cast<size_t>(s)].eps)
        if (!seen[static_cast<size_t>(t)]) {
          seen[static_cast<size_t>(t)] = 1;
          set.push_back(t);
          work.push_back(t);
        }
    }
    std::sort(set.begin(), set.end());
  }

  void build_rule(int gbnf_rule) {
    nfa_.clear();
    const int start = new_state();
    const int final_state = emit_alternatives(g_.rules[static_cast<size_t>(gbnf_rule)].alternatives, start, 0);
    nfa_total_ += static_cast<int>(nfa_.size());
    const auto rule = static_cast<int32_t>(a_.rule_start.size());
    a_.rule_names.push_back(g_.rules[static_cast<size_t>(gbnf_rule)].name);
    std::map<std::vector<int>, int32_t> ids;
    std::deque<std::vector<int>> queue;
    auto dfa_state = [&](std::vector<int> set) {
      closure(set);
      const auto [it, inserted] = ids.emplace(set, static_cast<int32_t>(a_.states.size()));
      if (inserted) {
        if (static_cast<int>(a_.states.size()) >= MAX_AUTOMATON_STATES)
          fail_rule(gbnf_rule, "grammar too large: above " + std::to_string(MAX_AUTOMATON_STATES) + " automaton states");
        AutomatonState s;
        s.rule = rule;
        s.accepting = std::binary_search(set.begin(), set.end(), final_state);
        a_.states.push_back(std::move(s));
        queue.push_back(std::move(set));
      }
      return it->second;
    };
    a_.rule_start.push_back(dfa_state({start}));
    while (!queue.empty()) {
      const std::vector<int> set = std::move(queue.front());
      queue.pop_front();
      const int32_t id = ids.at(set);
      // Byte edges: cut 0..255 at every edge boundary, each piece goes to the union of targets.
      std::vector<int> cuts;
      for (int s : set)
        for (const auto& e : nfa_[static_cast<size_t>(s)].bytes) {
          cuts.push_back(e.first);
          cuts.push_back(e.last + 1);
        }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      std::vector<ByteEdge> edges;
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        const int lo = cuts[c], hi = cuts[c + 1] - 1;
        std::vector<int> targets;
        for (int s : set)
          for (const auto& e : nfa_[static_cast<size_t>(s)].bytes)
            if (e.first <= lo && hi <= e.last) targets.push_back(e.to);
        if (targets.empty()) continue;
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        const int32_t to = dfa_state(std::move(targets));
        if (!edges.empty() && edges.back().to == to && edges.back().last + 1 == lo)
          edges.back().last = static_cast<uint8_t>(hi);
        else
          edges.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
      }
      std::map<int, std::vector<int>> call_targets;
      for (int s : set)
        for (const auto& c : nfa_[static_cast<size_t>(s)].calls) call_targets[c.rule].push_back(c.to);
      std::vector<CallEdge> calls;
      for (auto& [called, targets] : call_targets) {
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        calls.push_back({called, dfa_state(std::move(targets))});
      }
      a_.states[static_cast<size_t>(id)].bytes = std::move(edges);
      a_.states[static_cast<size_t>(id)].calls = std::move(calls);
    }
    nfa_.clear();
  }

  // ---- pruning: keep states from which their rule can end, and rules that derive a finite string ----
  void prune() {
    const size_t n = a_.states.size(), rules = a_.rule_start.size();
    std::vector<std::vector<int32_t>> byte_preds(n), call_preds(n), calls_of_rule(rules);
    for (size_t s = 0; s < n; ++s) {
      for (const auto& e : a_.states[s].bytes) byte_preds[static_cast<size_t>(e.to)].push_back(static_cast<int32_t>(s));
      for (const auto& c : a_.states[s].calls) {
        call_preds[static_cast<size_t>(c.to)].push_back(static_cast<int32_t>(s));
        calls_of_rule[static_cast<size_t>(c.rule)].push_back(static_cast<int32_t>(s));
      }
    }
    std::vector<char> live(n, 0), productive(rules, 0);
    std::vector<int32_t> work;
    auto mark = [&](int32_t s) {
      if (!live[static_cast<size_t>(s)]) {
        live[static_cast<size_t>(s)] = 1;
        work.push_back(s);
      }
    };
    auto call_ok = [&](int32_t s, int32_t target) {  // s has a call to a productive rule landing on live `target`
      for (const auto& c : a_.states[static_cast<size_t>(s)].calls)
        if (c.to == target && productive[static_cast<size_t>(c.rule)]) return true;
      return false;
    };
    for (size_t s = 0; s < n; ++s)
      if (a_.states[s].accepting) mark(static_cast<int32_t>(s));
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      for (int32_t p : byte_preds[static_cast<size_t>(s)]) mark(p);
      for (int32_t p : call_preds[static_cast<size_t>(s)])
        if (call_ok(p, s)) mark(p);
      const int32_t rule = a_.states[static_cast<size_t>(s)].rule;
      if (a_.rule_start[static_cast<size_t>(rule)] == s && !productive[static_cast<size_t>(rule)]) {
        productive[static_cast<size_t>(rule)] = 1;
        for (int32_t caller : calls_of_rule[static_cast<size_t>(rule)])
          for (const auto& c : a_.states[static_cast<size_t>(caller)].calls)
            if (c.rule == rule && live[static_cast<size_t>(c.to)]) mark(caller);
      }
    }
    if (!productive[0]) fail_rule(g_.root, "rule 'root' derives no finite string");
    for (auto& state : a_.states) {
      std::erase_if(state.bytes, [&](const ByteEdge& e) { return !live[static_cast<size_t>(e.to)]; });
      std::erase_if(state.calls, [&](const CallEdge& c) {
        return !live[static_cast<size_t>(c.to)] || !productive[static_cast<size_t>(c.rule)];
      });
    }
  }

  // ---- left recursion: a rule that can call itself before reading a byte ----
  void refuse_left_recursion() {
    const size_t rules = a_.rule_start.size();
    std::vector<char> nullable(rules, 0);
    auto reach_without_bytes = [&](size_t rule, std::vector<int32_t>& reached) {
      std::vector<int32_t> work{a_.rule_start[rule]};
      std::set<int32_t> seen{a_.rule_start[rule]};
      while (!work.empty()) {
        const int32_t s = work.back();
        work.pop_back();
        reached.push_back(s);
        for (const auto& c : a_.states[static_cast<size_t>(s)].calls)
          if (nullable[static_cast<size_t>(c.rule)] && seen.insert(c.to).second) work.push_back(c.to);
      }
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules; ++r) {
        if (nullable[r]) continue;
        std::vector<int32_t> reached;
        reach_without_bytes(r, reached);
        for (int32_t s : reached)
          if (a_.states[static_cast<size_t>(s)].accepting) {
            nullable[r] = 1;
            changed = true;
            break;
          }
      }
    }
    std::vector<std::vector<int32_t>> left_calls(rules);
    for (size_t r = 0; r < rules; ++r) {
      std::vector<int32_t> reached;
      reach_without_bytes(r, reached);
      for (int32_t s : reached)
        for (const auto& c : a_.states[static_cast<size_t>(s)].calls) left_calls[r].push_back(c.rule);
    }
    std::vector<char> color(rules, 0);  // 0 new, 1 on the path, 2 done
    for (size_t start = 0; start < rules; ++start) {
      if (color[start]) continue;
      std::vector<std::pair<size_t, size_t>> frames{{start, 0}};
      color[start] = 1;
      while (!frames.empty()) {
        auto& [r, edge] = frames.back();
        if (edge < left_calls[r].size()) {
          const auto to = static_cast<size_t>(left_calls[r][edge++]);
          if (color[to] == 1) fail_rule(pending_[to], "rule '" + a_.rule_names[to] + "' is left-recursive (it can call itself before reading a character)");
          if (color[to] == 0) {
            color[to] = 1;
            frames.push_back({to, 0});
          }
          continue;
        }
        color[r] = 2;
        frames.pop_back();
      }
    }
  }

  const GbnfGrammar& g_;
  std::vector<RuleFacts> facts_;
  std::vector<int> automaton_rule_of_;  // GBNF rule -> automaton rule (-1: inlined or unused)
  std::vector<int> pending_;            // automaton rule -> GBNF rule
  std::vector<NfaState> nfa_;
  int nfa_total_ = 0;
  GrammarAutomaton a_;
};

}  // namespace

GrammarAutomaton build_automaton(const GbnfGrammar& grammar) { return Builder(grammar).build(); }

}  // namespace tpcli::grammar
