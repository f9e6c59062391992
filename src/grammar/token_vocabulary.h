// tpcli::grammar — a model's tokens as the bytes each adds to a text (text/token_bytes.h makes the
// list from a tokenizer), sorted into a prefix tree so that a grammar state's token mask is one walk
// in which tokens sharing a prefix share its steps.
//
// Dimension legend: V vocabulary size, N trie nodes (distinct non-empty token prefixes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpcli::grammar {

class TokenVocabulary {
 public:
  // [V] each token's bytes in the middle of a text; "" for tokens a grammar never emits (special tokens).
  explicit TokenVocabulary(std::vector<std::string> token_bytes);
  int size() const { return static_cast<int>(bytes_.size()); }
  const std::string& bytes(int token) const { return bytes_[static_cast<size_t>(token)]; }

  // The prefix tree in depth-first order: node i's subtree is nodes [i, subtree_end). The tokens
  // sorted by bytes (empty ones left out) are sorted_tokens(); those that start with node i's prefix
  // are [first, end) of it, and those equal to it [first, exact_end).
  struct TrieNode {
    uint8_t byte = 0;
    int32_t depth = 0;  // bytes of the prefix (1 for the children of the root)
    int32_t subtree_end = 0;
    int32_t first = 0, exact_end = 0, end = 0;
  };
  const std::vector<TrieNode>& trie() const { return trie_; }          // [N]
  const std::vector<int32_t>& sorted_tokens() const { return sorted_; }  // [V minus empty ones]
  int max_token_bytes() const { return max_bytes_; }

 private:
  std::vector<std::string> bytes_;  // [V]
  std::vector<int32_t> sorted_;
  std::vector<TrieNode> trie_;
  int max_bytes_ = 0;
};

}  // namespace tpcli::grammar
