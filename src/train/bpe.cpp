#include "train/bpe.h"

#include "text/tokenizer.h"

namespace tpcli::train {

std::shared_ptr<const text::Tokenizer> load_bpe(const std::string& path, int vocab_size) {
  return std::make_shared<const text::Tokenizer>(path, vocab_size);
}

int bpe_vocab_size(const text::Tokenizer& tokenizer) { return tokenizer.vocab_size(); }

std::vector<int> bpe_encode(const text::Tokenizer& tokenizer, std::string_view text) {
  return tokenizer.encode(text, /*bos=*/false, /*eos=*/false);
}

std::string bpe_decode(const text::Tokenizer& tokenizer, std::span<const int> tokens) {
  std::string text;
  int prev = 0;  // not BOS: keep every leading space
  for (int token : tokens) {
    text += tokenizer.decode(prev, token);
    prev = token;
  }
  return text;
}

}  // namespace tpcli::train
