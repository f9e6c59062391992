// An independent, slow recognizer for tests: whether a byte string is a prefix of some string of a
// parsed GBNF grammar (or the whole of one), by backtracking over the grammar's syntax tree with
// memoised (rule, position) results. It shares only the parser with the code under test; code points
// are decoded here, not expanded into byte automata.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "grammar/gbnf_parser.h"

namespace tpcli::grammar::testing {

class PrefixRecognizer {
 public:
  PrefixRecognizer(const GbnfGrammar& g, std::string input) : g_(g), in_(std::move(input)) {}

  bool is_prefix() { return !root_ends().empty(); }
  bool is_complete() { return root_ends().count(in_.size()) > 0; }

 private:
  static constexpr size_t EXHAUSTED = SIZE_MAX;  // the input ran out inside a derivation: a valid prefix

  std::set<size_t> root_ends() {
    std::set<size_t> ends = rule_ends(g_.root, 0);
    std::set<size_t> good;
    for (size_t e : ends)
      if (e == EXHAUSTED || e == in_.size()) good.insert(e);
    return good;
  }

  std::set<size_t> rule_ends(int rule, size_t p) {
    const auto key = std::make_pair(rule, p);
    if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
    std::set<size_t> out = alternatives_ends(g_.rules[static_cast<size_t>(rule)].alternatives, p);
    memo_[key] = out;
    return out;
  }

  std::set<size_t> alternatives_ends(const GbnfAlternatives& alts, size_t p) {
    std::set<size_t> out;
    for (const auto& seq : alts) {
      std::set<size_t> at{p};
      for (const auto& node : seq) at = node_ends(node, at);
      out.insert(at.begin(), at.end());
    }
    return out;
  }

  std::set<size_t> node_ends(const GbnfNode& node, const std::set<size_t>& from) {
    std::set<size_t> out, frontier = from;
    for (int i = 0; i < node.min_repeat; ++i) frontier = once_all(node, frontier);
    out = frontier;
    for (int i = node.min_repeat; node.max_repeat < 0 || i < node.max_repeat; ++i) {
      std::set<size_t> next = once_all(node, frontier), fresh;
      for (size_t e : next)
        if (out.insert(e).second) fresh.insert(e);
      if (fresh.empty()) break;
      frontier = fresh;
    }
    return out;
  }

  std::set<size_t> once_all(const GbnfNode& node, const std::set<size_t>& from) {
    std::set<size_t> out;
    for (size_t p : from) {
      if (p == EXHAUSTED) {
        out.insert(EXHAUSTED);
        continue;
      }
      const std::set<size_t> e = once(node, p);
      out.insert(e.begin(), e.end());
    }
    return out;
  }

  std::set<size_t> once(const GbnfNode& node, size_t p) {
    switch (node.kind) {
      case GbnfNode::Kind::literal: {
        for (size_t i = 0; i < node.bytes.size(); ++i) {
          if (p + i == in_.size()) return {EXHAUSTED};
          if (in_[p + i] != node.bytes[i]) return {};
        }
        return {p + node.bytes.size()};
      }
      case GbnfNode::Kind::char_class: return class_ends(node, p);
      case GbnfNode::Kind::rule_ref: return rule_ends(node.rule, p);
      case GbnfNode::Kind::group: return alternatives_ends(node.alternatives, p);
    }
    return {};
  }

  // One code point in the class at p; the input may stop inside a valid encoding of one.
  std::set<size_t> class_ends(const GbnfNode& node, size_t p) {
    if (p == in_.size()) return {EXHAUSTED};
    const auto lead = static_cast<unsigned char>(in_[p]);
    const int n = lead < 0x80 ? 1 : lead >= 0xC2 && lead < 0xE0 ? 2 : lead >= 0xE0 && lead < 0xF0 ? 3 : lead >= 0xF0 && lead < 0xF5 ? 4 : 0;
    if (n == 0) return {};
    const size_t have = std::min<size_t>(static_cast<size_t>(n), in_.size() - p);
    for (size_t i = 1; i < have; ++i)
      if ((static_cast<unsigned char>(in_[p + i]) & 0xC0) != 0x80) return {};
    // Every code point whose encoding starts with the bytes present.
    const uint32_t lead_bits = n == 1 ? lead : lead & (0x7F >> n);
    uint32_t lo = lead_bits, hi = lead_bits;
    for (size_t i = 1; i < static_cast<size_t>(n); ++i) {
      if (i < have) {
        const uint32_t b = static_cast<unsigned char>(in_[p + i]) & 0x3F;
        lo = (lo << 6) | b, hi = (hi << 6) | b;
      } else {
        lo = lo << 6, hi = (hi << 6) | 0x3F;
      }
    }
    const uint32_t min_of_length[] = {0, 0, 0x80, 0x800, 0x10000};
    lo = std::max(lo, min_of_length[n]);
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    bool any = false;
    for (const auto& r : node.ranges)
      for (uint32_t a = std::max(lo, r.first); a <= std::min(hi, r.last) && !any; ++a)
        if (a < 0xD800 || a > 0xDFFF) any = true;
    if (!any) return {};
    return {have == static_cast<size_t>(n) ? p + have : EXHAUSTED};
  }

  const GbnfGrammar& g_;
  std::string in_;
  std::map<std::pair<int, size_t>, std::set<size_t>> memo_;
};

}  // namespace tpcli::grammar::testing
