// Test support for tests/grammar: vocabularies, the brute-force mask (every token fed byte by byte to a
// fresh copy of the matcher: the stack moves alone, no token cache), and random walks.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/matcher.h"

namespace tpcli::grammar::testing {

// Every single byte, plus multi-byte pieces: ASCII words, JSON punctuation runs, whitespace runs,
// whole and split UTF-8 characters; "" for a few special tokens.
inline std::vector<std::string> synthetic_vocabulary() {
  std::vector<std::string> v;
  v.push_back("");  // a special token
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece :
       {"\"", "\":", "\": ", "\",", "\", \"", "\"}", "\"]", "{\"", "[\"", "{\n", "\n}", "},", "}]", "]}", "[]", "{}", "  ",
        "    ", "\n  ", "\n\t", " \"", "true", "false", "null", "tr", "ue", "nu", "ll", "fal", "se", "12", "345", "0.", ".5",
        "-1", "e+", "E-", "name", "age", "id", "tags", "ab", "abc", "xyz", "hello", " world", "\\n", "\\\"", "\\u00", "e9",
        "\xc3\xa9", "\xc3", "\xa9", "\xe2\x82\xac", "\xe2\x82", "\xac\"", "\xf0\x9f\x98\x80", "\xf0\x9f", "\x98\x80",
        "2024", "-01", "-15", "T12", ":30", ":00Z", "@", ".com", "user", "a1", "0", "00", "007", "99", "100", "-0", "1e5"})
    v.push_back(piece);
  v.push_back("");  // another special token
  return v;
}

inline std::shared_ptr<const TokenVocabulary> make_vocabulary(std::vector<std::string> bytes) {
  return std::make_shared<const TokenVocabulary>(std::move(bytes));
}

inline bool bit(const std::vector<uint32_t>& bits, int t) { return (bits[static_cast<size_t>(t) / 32] >> (t % 32)) & 1u; }

// Whether `m` accepts token t's bytes, fed one byte at a time to a copy.
inline bool accepts_bytewise(const Matcher& m, const std::string& bytes) {
  if (bytes.empty()) return false;
  Matcher copy = m;
  for (const char c : bytes)
    if (!copy.accept_bytes(std::string(1, c))) return false;
  return true;
}

inline std::vector<uint32_t> mask_of(const Matcher& m) {
  std::vector<uint32_t> bits((static_cast<size_t>(m.grammar().vocabulary().size()) + 31) / 32);
  m.fill_mask(bits);
  return bits;
}

// A random walk (on_step(matcher, text so far) before each step): each step picks an allowed token (uniform), or ends when allowed with probability
// `end_bias`; stops after max_steps. Returns the text and whether it ended.
struct Walk {
  std::string text;
  bool finished = false;
  int steps = 0;
};

// `weight(bytes)`: a token's relative chance among the allowed ones.
template <typename OnStep, typename Weight>
Walk random_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng, int max_steps, double end_bias,
                 OnStep on_step, Weight weight) {
  Matcher m(g);
  Walk walk;
  std::vector<int> allowed;
  std::vector<double> weights;
  for (int step = 0; step < max_steps; ++step) {
    on_step(m, walk.text);
    if (m.can_end() && std::uniform_real_distribution<double>(0, 1)(rng) < end_bias) {
      walk.finished = true;
      return walk;
    }
    const auto bits = mask_of(m);
    allowed.clear();
    weights.clear();
    for (int t = 0; t < g->vocabulary().size(); ++t)
      if (bit(bits, t)) {
        allowed.push_back(t);
        weights.push_back(weight(g->vocabulary().bytes(t)));
      }
    if (allowed.empty()) {
      walk.finished = m.can_end();
      return walk;
    }
    const int t = allowed[std::discrete_distribution<size_t>(weights.begin(), weights.end())(rng)];
    if (!m.accept(t)) throw std::logic_error("a masked-in token was refused");
    walk.text += g->vocabulary().bytes(t);
    ++walk.steps;
  }
  walk.finished = m.can_end();
  return walk;
}

template <typename OnStep>
Walk random_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng, int max_steps, double end_bias,
                 OnStep on_step) {
  return random_walk(g, rng, max_steps, end_bias, on_step, [](const std::string&) { return 1.0; });
}

// Closing punctuation weighs more, so strings, arrays and objects end and most walks finish.
inline double closing_weight(const std::string& bytes) {
  double w = 1;
  for (const char c : bytes)
    if (c == '"' || c == '}' || c == ']' || c == ',') w += 15;
  return w;
}

}  // namespace tpcli::grammar::testing
