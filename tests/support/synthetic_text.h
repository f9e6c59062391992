// Test support: a deterministic text of words from a small list, learnable yet not trivially
// periodic, for training tests that need a corpus without ../shared.
#pragma once

#include <cstdint>
#include <iterator>
#include <random>
#include <string>

namespace tpcli::testing {

inline std::string synthetic_text(size_t words, uint32_t seed) {
  static const char* vocab[] = {"the", "night", "is", "young", "and", "all", "town", "asleep", "rose", "wall", "star",
                                "kind", "ROMEO:", "JULIET:", "\n"};
  std::mt19937 rng(seed);
  std::string text;
  for (size_t i = 0; i < words; ++i) {
    text += vocab[rng() % std::size(vocab)];
    text += ' ';
  }
  return text;
}

}  // namespace tpcli::testing
