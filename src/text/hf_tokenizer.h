// tpcli::text — Hugging Face's tokenizer.json (the `tokenizers` library's format), BPE models.
//
// encode: the text is split at added tokens first (longest match leftmost, with their lstrip /
// rstrip / single_word flags; special-token text such as "<|eot_id|>" becomes that token); every
// other span goes through the normalizer, the pre-tokenizer and the BPE model (text/hf_pipeline.h,
// text/bpe_model.h). Text that is not valid UTF-8 is read with U+FFFD for each bad sequence.
// decode: every token's string, added tokens included, goes through the decoder chain; then
// transformers' clean-up of spaces before punctuation when tokenizer_config.json asks for it.
// Added tokens with "normalized": true are matched on the raw text too (none of the supported
// families' files has one).
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include "text/bpe_model.h"
#include "text/hf_pipeline.h"
#include "text/tokenizer_interface.h"

namespace tpcli::text {

// What tokenizer_config.json says (each field empty when absent).
struct TokenizerConfig {
  std::string bos_token, eos_token;
  bool clean_up_tokenization_spaces = false;
  std::optional<std::string> chat_template;  // the Jinja source
};
// Throws std::runtime_error naming the file: unreadable, not JSON, or a key of the wrong type.
TokenizerConfig read_tokenizer_config(const std::string& path);

class HfTokenizer final : public TokenizerInterface {
 public:
  // Throws std::runtime_error naming the file and key: unreadable, not JSON, unsupported model,
  // normalizer, pre-tokenizer or decoder, or a vocabulary that contradicts its merges.
  HfTokenizer(const std::string& tokenizer_json, const TokenizerConfig& config);

  int vocab_size() const override;
  std::vector<int> encode_text(std::string_view text, bool bos) const override;
  std::string decode_ids(std::span<const int> ids, bool clean_up = true) const override;
  std::string token_text(int id) const override;
  std::optional<int> token_id(std::string_view text) const override;
  std::string bos_text() const override { return bos_; }
  std::string eos_text() const override { return eos_; }
  // Whether `id` is one of tokenizer.json's added_tokens (special or not: "<|im_end|>", "<think>").
  bool is_added_token(int id) const { return added_by_id_.contains(id); }
  // Whether `id` is an added token marked special ("<|im_end|>"; not Qwen's "<tool_call>").
  bool is_special_token(int id) const;

 private:
  struct AddedToken {
    std::string content;
    int id = 0;
    bool special = false, lstrip = false, rstrip = false, single_word = false;
  };
  // A span of the input: an added token (id >= 0) or text for the model (id = -1).
  struct Segment {
    std::string_view text;
    int id = -1;
    bool at_start = false;
  };
  void load_added_tokens(const nlohmann::json& added, const std::string& where);
  std::optional<size_t> added_token_at(std::string_view text, size_t at) const;  // index into added_
  std::vector<Segment> split_at_added_tokens(std::string_view text) const;

  std::unique_ptr<hf::BpeModel> model_;
  hf::Normalizer normalizer_;
  hf::PreTokenizer pre_tokenizer_;
  hf::Decoder decoder_;
  std::vector<AddedToken> added_;
  hf::StringIds added_ids_;                         // content -> id
  std::unordered_map<int, size_t> added_by_id_;     // id -> added_ index
  std::vector<std::vector<size_t>> added_by_byte_;  // [256] first byte -> added_ indices, longest first
  std::string bos_, eos_;
  bool clean_up_spaces_ = false;
};

// transformers' clean_up_tokenization: " ." -> ".", " n't" -> "n't", ... in its order.
std::string clean_up_tokenization(std::string text);

}  // namespace tpcli::text
