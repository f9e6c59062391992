// tpcli::text — the BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}).
//
// A word (one pre-tokenized piece) starts as its characters, each its vocabulary token, or with
// byte_fallback its UTF-8 bytes as <0xNN> tokens, or the unk token (consecutive unks fused when
// fuse_unk); then the adjacent pair with the lowest merge rank merges, leftmost first among equal
// ranks, until no pair of the word has a merge. ignore_merges: a word that is itself a vocabulary
// token is that token, merges or not (Llama 3's files say so).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tpcli::text::hf {

// Lets unordered_map<std::string, ...> be searched with a string_view, without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIds = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `where` names the file for errors ("tokenizer.json: model.merges[12]: ...").
  BpeModel(const nlohmann::json& spec, const std::string& where);
  // A vocabulary given as lists (a GGUF file's): `tokens` by id (the last of equal texts keeps the
  // text), `merges` as (left, right) by rank; a merge whose parts or result are no tokens is left
  // out (it could never give a token). No unk token, no byte fallback.
  BpeModel(const std::vector<std::string>& tokens, const std::vector<std::pair<std::string, std::string>>& merges,
           bool ignore_merges);

  // Appends the ids of `word` to `ids`.
  void encode_word(std::string_view word, std::vector<int>& ids) const;
  std::optional<int> id_of(std::string_view token) const;
  const std::string* text_of(int id) const;  // null when no token has this id
  int id_limit() const { return static_cast<int>(id_to_token_.size()); }  // largest id + 1

 private:
  struct Merge {
    int rank;
    int merged_id;
  };
  static uint64_t pair_key(int left, int right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void load_vocab(const nlohmann::json& vocab, const std::string& where);
  void load_merges(const nlohmann::json& merges, const std::string& where);
  void find_byte_tokens();
  std::vector<int> initial_symbols(std::string_view word) const;
  void merge_all(std::vector<int>& symbols) const;

  StringIds vocab_;                                // token -> id
  std::vector<std::string> id_to_token_;           // [largest id + 1]
  std::unordered_map<uint64_t, Merge> merges_;     // (left id, right id) -> rank and merged id
  std::array<int, 256> byte_ids_{};                // id of <0xNN>, -1 when absent
  std::optional<int> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
};

}  // namespace tpcli::text::hf
