// tpcli::train — the door from training data to the llama2.c BPE tokenizer (text/tokenizer.h).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpcli::text {
class Tokenizer;
}

namespace tpcli::train {

std::shared_ptr<const text::Tokenizer> load_bpe(const std::string& path, int vocab_size);
int bpe_vocab_size(const text::Tokenizer& tokenizer);
// The corpus as tokens: no BOS, no EOS (a training text is one long stream).
std::vector<int> bpe_encode(const text::Tokenizer& tokenizer, std::string_view text);
std::string bpe_decode(const text::Tokenizer& tokenizer, std::span<const int> tokens);

}  // namespace tpcli::train
