#include "train/bpe.h"

#include <stdexcept>

namespace tpcli::train {

// Placeholder until model/tokenizer.h lands.
std::shared_ptr<const model::Tokenizer> load_bpe(const std::string& path) {
  throw std::runtime_error(path + ": llama2.c tokenizers are not available for training yet");
}
int bpe_vocab_size(const model::Tokenizer&) { return 0; }
std::vector<int> bpe_encode(const model::Tokenizer&, std::string_view) { return {}; }
std::string bpe_decode(const model::Tokenizer&, std::span<const int>) { return {}; }

}  // namespace tpcli::train
