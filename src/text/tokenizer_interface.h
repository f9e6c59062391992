// tpcli::text — what generation, chat and the `tokenizer` command need from a tokenizer, whatever
// its file: llama2.c's tokenizer.bin (text/tokenizer.h) or Hugging Face's tokenizer.json
// (text/hf_tokenizer.h). load_tokenizer() (text/load_tokenizer.h) picks the implementation.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpcli::text {

class TokenizerInterface {
 public:
  virtual ~TokenizerInterface() = default;

  // Ids run 0..vocab_size()-1, added and special tokens included.
  virtual int vocab_size() const = 0;
  // Special-token text inside `text` (e.g. "<|eot_id|>") becomes that token; `bos` prepends the
  // beginning-of-sequence token when the tokenizer has one.
  virtual std::vector<int> encode_text(std::string_view text, bool bos) const = 0;
  // The text of `ids`, special tokens kept, as the file's decoder builds it. `clean_up`: also
  // transformers' removal of spaces before punctuation when the tokenizer's config asks for it
  // (streams skip it: it can take back a space already printed).
  virtual std::string decode_ids(std::span<const int> ids, bool clean_up = true) const = 0;
  // The token's string as stored in the vocabulary ("▁the", "Ġthe", "<|eot_id|>"); "" when unknown.
  virtual std::string token_text(int id) const = 0;
  // The id of the token spelled exactly `text` (special tokens by name: "<s>", "<|im_end|>").
  virtual std::optional<int> token_id(std::string_view text) const = 0;
  // The beginning/end-of-sequence tokens' text ("" when the tokenizer has none).
  virtual std::string bos_text() const = 0;
  virtual std::string eos_text() const = 0;
};

// Text as tokens arrive (streaming): text/text_stream.h.

}  // namespace tpcli::text
