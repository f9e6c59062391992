// tpcli::grammar — a model's tokens as the bytes each adds to a text (text/token_bytes.h makes the
// list from a tokenizer), sorted into a prefix tree so that a grammar state's token mask is one walk
// in which tokens sharing a prefix share its steps.
//
// Dimension legend: V vocabulary size, N trie nodes (distinct non-empty token prefixes).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tpcli::grammar {

// The longest tokens (bytes) of each band of token lengths whose mask caches states share
// (grammar/compiled_grammar.h); the tokens longer than the last are a band of their own.
constexpr std::array<int, 5> SHARED_BAND_LIMITS = {3, 5, 7, 10, 16};

class TokenVocabulary {
 public:
  // [V] each token's bytes in the middle of a text; "" for tokens a grammar never emits (special tokens).
  // Also makes the trees of the default bands (SHARED_BAND_LIMITS), so no compile pays for them.
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
  struct PrefixTree {
    std::vector<int32_t> sorted_tokens;  // its tokens sorted by bytes
    std::vector<TrieNode> nodes;         // depth-first
  };
  const std::vector<TrieNode>& trie() const { return whole_.nodes; }                  // [N]
  const std::vector<int32_t>& sorted_tokens() const { return whole_.sorted_tokens; }  // [V minus empty ones]
  int max_token_bytes() const { return max_bytes_; }
  // The same for only the tokens of `shortest` to `longest` bytes (a token-mask cache's band, grammar/
  // compiled_grammar.h): its own compact tree, walked end to end instead of skipping through the
  // whole one. Made on first use (thread-safe).
  const PrefixTree& tree_of_lengths(int shortest, int longest) const;

 private:
  PrefixTree tree_of(std::vector<int32_t> sorted_tokens) const;

  std::vector<std::string> bytes_;  // [V]
  PrefixTree whole_;
  int max_bytes_ = 0;
  mutable std::mutex bands_mutex_;
  mutable std::map<std::pair<int, int>, std::unique_ptr<const PrefixTree>> bands_;
};

}  // namespace tpcli::grammar
