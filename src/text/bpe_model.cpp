#include "text/bpe_model.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "files/json_file.h"
#include "text/utf8.h"

namespace tpcli::text::hf {

using files::quoted_value;

using nlohmann::json;

namespace {

std::string optional_string(const json& spec, const char* key) {
  auto it = spec.find(key);
  return it != spec.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

BpeModel::BpeModel(const json& spec, const std::string& where) {
  if (!spec.is_object() || spec.value("type", std::string("BPE")) != "BPE")
    throw std::runtime_error(where + ".type: only \"BPE\" models are supported, not " +
                             (spec.is_object() ? spec.value("type", std::string("?")) : std::string("a non-object")));
  byte_fallback_ = spec.value("byte_fallback", false);
  fuse_unk_ = spec.value("fuse_unk", false);
  ignore_merges_ = spec.value("ignore_merges", false);
  continuing_subword_prefix_ = optional_string(spec, "continuing_subword_prefix");
  end_of_word_suffix_ = optional_string(spec, "end_of_word_suffix");
  if (!spec.contains("vocab")) throw std::runtime_error(where + ".vocab: missing");
  load_vocab(spec.at("vocab"), where + ".vocab");
  load_merges(spec.contains("merges") ? spec.at("merges") : json::array(), where + ".merges");
  if (const std::string unk = optional_string(spec, "unk_token"); !unk.empty()) {
    unk_id_ = id_of(unk);
    if (!unk_id_) throw std::runtime_error(where + ".unk_token: " + quoted_value(unk) + " is not in the vocabulary");
  }
  find_byte_tokens();
}

BpeModel::BpeModel(const std::vector<std::string>& tokens, const std::vector<std::pair<std::string, std::string>>& merges,
                   bool ignore_merges)
    : id_to_token_(tokens), ignore_merges_(ignore_merges) {
  vocab_.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) vocab_.insert_or_assign(tokens[id], static_cast<int>(id));
  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = id_of(left), r = id_of(right), result = id_of(left + right);
    if (l && r && result) merges_.try_emplace(pair_key(*l, *r), Merge{static_cast<int>(rank), *result});
  }
  find_byte_tokens();
}

void BpeModel::find_byte_tokens() {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[static_cast<size_t>(b)] = id_of(name).value_or(-1);
  }
}

void BpeModel::load_vocab(const json& vocab, const std::string& where) {
  if (!vocab.is_object()) throw std::runtime_error(where + ": expected an object of token: id");
  // Without a single token every piece of text would encode to nothing, silently.
  if (vocab.empty()) throw std::runtime_error(where + ": empty: a tokenizer needs at least one token");
  vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > (1 << 24))
      throw std::runtime_error(where + "[" + quoted_value(it.key()) + "]: expected an id in 0..16777216");
    const int id = it.value().get<int>();
    vocab_.emplace(it.key(), id);
    if (id >= static_cast<int>(id_to_token_.size())) id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[static_cast<size_t>(id)] = it.key();
  }
}

void BpeModel::load_merges(const json& merges, const std::string& where) {
  if (!merges.is_array()) throw std::runtime_error(where + ": expected an array");
  merges_.reserve(merges.size() * 2);
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {  // "left right"
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw std::runtime_error(where + "[" + std::to_string(rank) + "]: " + quoted_value(s) + " is not two tokens");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      throw std::runtime_error(where + "[" + std::to_string(rank) + "]: expected \"a b\" or [\"a\", \"b\"]");
    }
    // With a continuing-subword prefix ("##"), the right side's prefix is dropped in the merged token.
    const size_t prefix = !continuing_subword_prefix_.empty() && right.starts_with(continuing_subword_prefix_)
                              ? continuing_subword_prefix_.size() : 0;
    merged = left + right.substr(prefix);
    const auto l = id_of(left), r = id_of(right), result = id_of(merged);
    if (!l || !r || !result)
      throw std::runtime_error(where + "[" + std::to_string(rank) + "]: " + quoted_value(l ? (r ? merged : right) : left) +
                               " is not in the vocabulary");
    merges_.try_emplace(pair_key(*l, *r), Merge{static_cast<int>(rank), *result});  // first (lowest) rank wins
  }
}

std::optional<int> BpeModel::id_of(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::text_of(int id) const {
  if (id < 0 || id >= id_limit()) return nullptr;
  const std::string& text = id_to_token_[static_cast<size_t>(id)];
  return text.empty() ? nullptr : &text;
}

std::vector<int> BpeModel::initial_symbols(std::string_view word) const {
  std::vector<int> symbols;
  symbols.reserve(word.size());
  bool last_was_unk = false;
  std::string symbol;
  for (size_t at = 0; at < word.size();) {
    const size_t length = static_cast<size_t>(utf8::decode(word, at).length);
    symbol.clear();
    if (at > 0) symbol += continuing_subword_prefix_;
    symbol.append(word.substr(at, length));
    if (at + length == word.size()) symbol += end_of_word_suffix_;
    const std::string_view bytes = word.substr(at, length);
    at += length;
    if (auto id = id_of(symbol)) {
      symbols.push_back(*id);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char b : bytes) all = all && byte_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (char b : bytes) symbols.push_back(byte_ids_[static_cast<unsigned char>(b)]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_ && !(fuse_unk_ && last_was_unk)) symbols.push_back(*unk_id_);  // no unk token: dropped
    last_was_unk = unk_id_.has_value();
  }
  return symbols;
}

// Lowest rank first, leftmost first among equal ranks: a doubly linked list over the symbols and a
// min-heap of candidate pairs; a merged symbol keeps its left node, so node order is word order.
// Candidates whose sides changed since they were pushed are skipped when popped.
void BpeModel::merge_all(std::vector<int>& symbols) const {
  const int n = static_cast<int>(symbols.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);  // [n] links; -1 = none
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int rank, left, left_id, right_id, merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merges_.find(pair_key(symbols[left], symbols[next[left]]));
    if (it != merges_.end())
      heap.push({it->second.rank, left, symbols[left], symbols[next[left]], it->second.merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  std::vector<char> alive(n, 1);  // [n]
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (!alive[c.left] || right < 0 || symbols[c.left] != c.left_id || symbols[right] != c.right_id) continue;
    symbols[c.left] = c.merged_id;
    alive[right] = 0;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  std::vector<int> merged;
  for (int i = 0; i >= 0; i = next[i]) merged.push_back(symbols[i]);
  symbols = std::move(merged);
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = id_of(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<int> symbols = initial_symbols(word);
  merge_all(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

}  // namespace tpcli::text::hf
