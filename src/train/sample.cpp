#include "train/sample.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "model/sampler.h"

namespace tpcli::train {

TextSample generate_text(const model::ForwardFn& forward, const TextTokenizer& tokenizer, const std::string& prompt,
                         int steps, int seq_len, float temperature, float topp, uint64_t seed, std::FILE* out) {
  std::vector<int> prompt_tokens = tokenizer.encode(prompt);
  if (prompt_tokens.empty()) prompt_tokens.push_back(0);
  if (steps <= 0 || steps > seq_len) steps = seq_len;
  if (static_cast<int>(prompt_tokens.size()) > steps)
    throw std::invalid_argument("prompt of " + std::to_string(prompt_tokens.size()) + " tokens is longer than " +
                                std::to_string(steps) + " steps");
  model::Sampler sampler(tokenizer.vocab_size(), temperature, topp, seed == 0 ? 1 : seed);
  TextSample sample;
  sample.text = prompt;
  if (out) std::fputs(prompt.c_str(), out);
  std::vector<float> logits;  // [V]
  int token = prompt_tokens[0];
  for (int pos = 0; pos < steps; ++pos) {
    sample.tokens.push_back(token);
    std::span<const float> out_logits = forward(token, pos);
    int next;
    if (pos + 1 < static_cast<int>(prompt_tokens.size())) {
      next = prompt_tokens[static_cast<size_t>(pos + 1)];  // still inside the prompt: forced
    } else {
      model::require_finite_logits(out_logits, pos);
      logits.assign(out_logits.begin(), out_logits.end());
      next = sampler.sample(logits);
      const int one[1] = {next};
      std::string piece = tokenizer.decode(one);
      sample.text += piece;
      if (out) {
        std::fwrite(piece.data(), 1, piece.size(), out);
        std::fflush(out);
      }
    }
    token = next;
  }
  sample.tokens.push_back(token);
  return sample;
}

}  // namespace tpcli::train
