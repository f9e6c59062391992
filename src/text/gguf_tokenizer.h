// tpcli::text — the tokenizer a GGUF file carries in its metadata (tokenizer.ggml.*), giving the
// token ids llama.cpp gives (its llama-vocab.cpp, build b4748).
//
// Two models, by tokenizer.ggml.model:
//   "llama"  SentencePiece: the text, with " " prepended to each span after a special token (and to
//            the first; tokenizer.ggml.add_space_prefix, default true) and every " " written "▁",
//            starts as its UTF-8 characters; the adjacent pair whose concatenation is a token with
//            the highest score merges (leftmost on ties) until none does; a piece that is no token
//            splits back into the pieces it was merged from, and a character that is no token
//            becomes its bytes' <0xHH> tokens.
//   "gpt2"   byte-level BPE: tokenizer.ggml.pre names the pre-tokenizer regexes (llama.cpp's table,
//            applied one after the other, matches and the text between them kept as pieces); each
//            piece, in GPT-2's byte alphabet, goes through tokenizer.ggml.merges (text/bpe_model.h).
// Before either, the text is split at special tokens, longest first: user-defined tokens (type 4)
// always, control and unknown ones (types 3, 2) only when `parse_special` asks for them.
// Token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte. As llama.cpp does,
// tokens spelled like an end of turn ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", ...) are control
// tokens and end generation whatever their type, and a model named "phi3" drops the spaces after
// its special tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe_model.h"
#include "text/hf_pipeline.h"
#include "text/tokenizer_interface.h"

namespace tpcli::text {

// What a GGUF file's tokenizer keys hold (formats/gguf_vocabulary.h reads them).
struct GgufVocabulary {
  std::string origin;                 // the file, for messages
  std::string model;                  // tokenizer.ggml.model
  std::optional<std::string> pre;     // tokenizer.ggml.pre
  std::string general_name;           // general.name
  std::vector<std::string> tokens;    // [V] tokenizer.ggml.tokens
  std::vector<float> scores;          // [V] tokenizer.ggml.scores, or empty (all 0)
  std::vector<int> token_types;       // [V] tokenizer.ggml.token_type, or empty (all normal)
  std::optional<std::vector<std::string>> merges;  // tokenizer.ggml.merges ("left right")
  std::optional<int64_t> bos_id, eos_id, eot_id, eom_id, unk_id, pad_id;  // tokenizer.ggml.*_token_id
  std::optional<bool> add_bos, add_eos, add_space_prefix;  // tokenizer.ggml.add_bos_token, ...
  std::optional<std::string> chat_template;                // tokenizer.chat_template
};

class GgufTokenizer final : public TokenizerInterface {
 public:
  // Throws std::runtime_error, one line naming the file and key: an unknown model or pre-tokenizer,
  // arrays of different lengths, a merge that is not two tokens.
  explicit GgufTokenizer(const GgufVocabulary& vocabulary);
  ~GgufTokenizer() override;

  // llama_tokenize: `add_special` adds BOS / EOS where the file asks for them.
  std::vector<int> encode(std::string_view text, bool add_special, bool parse_special) const;
  // llama_detokenize: `remove_special` drops a leading BOS and a trailing EOS the tokenizer adds,
  // `unparse_special` writes control tokens' text, `clean_spaces` the model's space clean-up.
  std::string decode(std::span<const int> ids, bool remove_special, bool unparse_special, bool clean_spaces) const;
  // llama_token_to_piece: the token's text (control and unknown tokens "" unless `special`).
  std::string piece(int id, bool special) const;

  // Ids that end generation (llama.cpp's end-of-generation set: eos, eot, eom and the tokens spelled
  // like an end of turn).
  const std::vector<int>& end_of_generation_ids() const { return end_of_generation_; }
  std::optional<int> bos_id() const { return bos_; }
  std::optional<int> eos_id() const { return eos_; }
  bool is_control(int id) const;

  // TokenizerInterface: special-token text in `text` becomes that token (parse_special); `bos` adds
  // the file's BOS / EOS (add_special); decode_ids keeps every token's text.
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  std::vector<int> encode_text(std::string_view text, bool bos) const override { return encode(text, bos, true); }
  std::string decode_ids(std::span<const int> ids, bool clean_up = true) const override;
  std::string token_text(int id) const override;
  std::optional<int> token_id(std::string_view text) const override;
  std::string bos_text() const override { return bos_ ? token_text(*bos_) : std::string(); }
  std::string eos_text() const override { return eos_ ? token_text(*eos_) : std::string(); }

 private:
  enum class Kind { sentencepiece, byte_level_bpe };
  struct Fragment {  // a span of the input, or a special token (id >= 0)
    size_t begin = 0, end = 0;
    int id = -1;
  };
  void set_attributes(const GgufVocabulary& v);
  void set_special_ids(const GgufVocabulary& v);
  void set_pre_tokenizer(const GgufVocabulary& v);
  std::vector<Fragment> split_at_special_tokens(std::string_view text, bool parse_special) const;
  void encode_sentencepiece(std::string_view text, std::vector<int>& out) const;
  void encode_bpe(std::string_view text, std::vector<int>& out) const;
  int byte_token(unsigned char byte) const;

  std::string origin_;
  Kind kind_ = Kind::sentencepiece;
  std::vector<std::string> tokens_;  // [V]
  std::vector<float> scores_;        // [V]
  std::vector<uint32_t> attributes_;  // [V] llama.cpp's token attribute bits
  hf::StringIds ids_;                // text -> id
  std::vector<int> special_tokens_;  // control, user-defined and unknown ids, longest text first
  std::optional<int> bos_, eos_, eot_, eom_, unk_;
  std::vector<int> end_of_generation_;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false, clean_spaces_ = false;
  std::unique_ptr<hf::BpeModel> bpe_;  // byte-level BPE only
  hf::PreTokenizer pre_tokenizer_;     // byte-level BPE only: the regexes, then GPT-2's byte alphabet
};

}  // namespace tpcli::text
