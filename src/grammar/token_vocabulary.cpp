#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <limits>

namespace tpcli::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  std::vector<int32_t> sorted;
  for (size_t t = 0; t < bytes_.size(); ++t)
    if (!bytes_[t].empty()) sorted.push_back(static_cast<int32_t>(t));
  std::stable_sort(sorted.begin(), sorted.end(), [this](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  whole_ = tree_of(std::move(sorted));
  for (const int32_t t : whole_.sorted_tokens) max_bytes_ = std::max(max_bytes_, static_cast<int>(bytes(t).size()));
  int shortest = 1;
  for (const int longest : SHARED_BAND_LIMITS) {
    (void)tree_of_lengths(shortest, longest);
    shortest = longest + 1;
  }
  (void)tree_of_lengths(shortest, std::numeric_limits<int>::max());
}

const TokenVocabulary::PrefixTree& TokenVocabulary::tree_of_lengths(int shortest, int longest) const {
  std::lock_guard<std::mutex> lock(bands_mutex_);
  auto& tree = bands_[{shortest, longest}];
  if (!tree) {
    std::vector<int32_t> sorted;
    for (const int32_t t : whole_.sorted_tokens) {
      const auto n = static_cast<int>(bytes(t).size());
      if (n >= shortest && n <= longest) sorted.push_back(t);
    }
    tree = std::make_unique<const PrefixTree>(tree_of(std::move(sorted)));
  }
  return *tree;
}

TokenVocabulary::PrefixTree TokenVocabulary::tree_of(std::vector<int32_t> sorted_tokens) const {
  PrefixTree tree;
  tree.sorted_tokens = std::move(sorted_tokens);
  std::vector<TrieNode>& trie = tree.nodes;
  std::vector<int32_t> path;  // node index per depth - 1
  const std::string* previous = nullptr;
  auto close_deeper_than = [&](size_t depth, int32_t k) {
    while (path.size() > depth) {
      TrieNode& node = trie[static_cast<size_t>(path.back())];
      node.subtree_end = static_cast<int32_t>(trie.size());
      node.end = k;
      path.pop_back();
    }
  };
  for (size_t k = 0; k < tree.sorted_tokens.size(); ++k) {
    const std::string& b = bytes(tree.sorted_tokens[k]);
    size_t lcp = 0;
    if (previous)
      while (lcp < b.size() && lcp < previous->size() && b[lcp] == (*previous)[lcp]) ++lcp;
    const auto ki = static_cast<int32_t>(k);
    close_deeper_than(lcp, ki);
    for (size_t d = lcp; d < b.size(); ++d) {
      path.push_back(static_cast<int32_t>(trie.size()));
      trie.push_back({static_cast<uint8_t>(b[d]), static_cast<int32_t>(d + 1), 0, ki, ki, ki});
    }
    trie[static_cast<size_t>(path.back())].exact_end = ki + 1;
    previous = &b;
  }
  close_deeper_than(0, static_cast<int32_t>(tree.sorted_tokens.size()));
  return tree;
}

}  // namespace tpcli::grammar
