#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <numeric>

namespace tpcli::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  for (size_t t = 0; t < bytes_.size(); ++t)
    if (!bytes_[t].empty()) sorted_.push_back(static_cast<int32_t>(t));
  std::stable_sort(sorted_.begin(), sorted_.end(), [this](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  std::vector<int32_t> path;  // node index per depth - 1
  const std::string* previous = nullptr;
  auto close_deeper_than = [&](size_t depth, int32_t k) {
    while (path.size() > depth) {
      TrieNode& node = trie_[static_cast<size_t>(path.back())];
      node.subtree_end = static_cast<int32_t>(trie_.size());
      node.end = k;
      path.pop_back();
    }
  };
  for (size_t k = 0; k < sorted_.size(); ++k) {
    const std::string& b = bytes(sorted_[k]);
    max_bytes_ = std::max(max_bytes_, static_cast<int>(b.size()));
    size_t lcp = 0;
    if (previous)
      while (lcp < b.size() && lcp < previous->size() && b[lcp] == (*previous)[lcp]) ++lcp;
    const auto ki = static_cast<int32_t>(k);
    close_deeper_than(lcp, ki);
    for (size_t d = lcp; d < b.size(); ++d) {
      path.push_back(static_cast<int32_t>(trie_.size()));
      trie_.push_back({static_cast<uint8_t>(b[d]), static_cast<int32_t>(d + 1), 0, ki, ki, ki});
    }
    trie_[static_cast<size_t>(path.back())].exact_end = ki + 1;
    previous = &b;
  }
  close_deeper_than(0, static_cast<int32_t>(sorted_.size()));
}

}  // namespace tpcli::grammar
