// tpcli::text — llama2.c's BPE tokenizer (`tokenizer.bin`), with run.c's exact semantics.
//
// File: int32 max_token_length, then vocab_size records {f32 score, int32 len, len bytes}.
// The file does not store vocab_size; the model supplies it, and the loader insists that the
// file holds exactly that many records (so the wrong tokenizer for a model is an error, where
// llama2.c would silently read a prefix).
//
// encode: optional BOS (1); the dummy prefix token " " when the text is non-empty; each UTF-8
// code point as its token, or its bytes as <0xNN> tokens (id = byte + 3; <unk> = 0 when the
// vocabulary is too small to hold that id, where run.c would read past its table) when absent; then
// repeatedly merge the adjacent pair whose concatenation is a token with the highest score
// (leftmost on ties) until no pair merges; optional EOS (2).
// decode(prev, token): the piece, minus its leading space right after BOS, with <0xNN> pieces
// turned into their raw byte. printable_piece: what run.c's safe_printf prints (nothing for a
// single unprintable byte).
// As a TokenizerInterface: "<s>" and "</s>" in the text are BOS and EOS, and each span between
// them is encoded as above; decode_ids() joins decode() from BOS on (raw bytes, no filtering),
// with BOS and EOS written "<s>" and "</s>".
#pragma once

#include <string>
#include <string_view>
#include <optional>
#include <unordered_map>
#include <vector>

#include "text/tokenizer_interface.h"

namespace tpcli::text {

constexpr int UNK_TOKEN = 0;
constexpr int BOS_TOKEN = 1;
constexpr int EOS_TOKEN = 2;

class Tokenizer final : public TokenizerInterface {
 public:
  // Throws std::runtime_error naming the file: unreadable, truncated record, bad lengths, or a
  // record count different from vocab_size (nullopt: as many records as the file holds).
  Tokenizer(const std::string& path, std::optional<int> vocab_size);
  // From memory (tests; tokenizers built by training). pieces.size() == scores.size().
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int max_token_length);
  // The lookup index holds views into pieces_: movable, not copyable.
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  Tokenizer(Tokenizer&&) = default;
  Tokenizer& operator=(Tokenizer&&) = default;

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int max_token_length() const { return max_token_length_; }
  const std::string& piece(int id) const { return pieces_.at(static_cast<size_t>(id)); }
  float score(int id) const { return scores_.at(static_cast<size_t>(id)); }

  std::vector<int> encode(std::string_view text, bool bos, bool eos) const;
  std::string_view decode(int prev_token, int token) const;
  static std::string_view printable_piece(std::string_view piece);

  // TokenizerInterface.
  std::vector<int> encode_text(std::string_view text, bool bos) const override;
  std::string decode_ids(std::span<const int> ids, bool clean_up = true) const override;  // no clean-up to do
  std::string token_text(int id) const override;
  std::optional<int> token_id(std::string_view text) const override;
  std::string bos_text() const override { return "<s>"; }
  std::string eos_text() const override { return "</s>"; }

  // Writes the llama2.c format (atomic: temp file + rename).
  void save(const std::string& path) const;

 private:
  void build_index(const std::string& origin);
  int lookup(std::string_view s) const;  // -1 if absent

  std::vector<std::string> pieces_;  // [V]
  std::vector<float> scores_;        // [V]
  int max_token_length_ = 0;
  std::string origin_;  // the file it came from ("tokenizer" when built in memory), for errors
  std::unordered_map<std::string_view, int> index_;  // piece -> id (views into pieces_)
};

}  // namespace tpcli::text
