#include "train/sample.h"

#include <stdexcept>
#include <vector>

namespace tpcli::train {

TextSample generate_text(const engine::ModelFns& model, const TextTokenizer& tokenizer, const std::string& prompt,
                         int steps, int seq_len, float temperature, float topp, uint64_t seed, std::FILE* out) {
  std::vector<int> prompt_tokens = tokenizer.encode(prompt);
  if (prompt_tokens.empty()) prompt_tokens.push_back(0);
  if (steps <= 0 || steps > seq_len) steps = seq_len;
  if (static_cast<int>(prompt_tokens.size()) > steps)
    throw std::invalid_argument("prompt of " + std::to_string(prompt_tokens.size()) + " tokens is longer than " +
                                std::to_string(steps) + " steps");
  engine::GenerateOptions options;
  options.steps = steps;
  options.temperature = temperature;
  options.topp = topp;
  options.seed = seed == 0 ? 1 : seed;
  TextSample sample;
  sample.text = prompt;
  if (out) std::fputs(prompt.c_str(), out);
  size_t forced = prompt_tokens.size() - 1;  // the prompt's own tokens come first, not printed again
  const engine::GenerateResult run =
      engine::generate_from_ids(model, prompt_tokens, tokenizer.vocab_size(), options, [&](int, int next) {
        if (forced > 0) {
          --forced;
          return true;
        }
        const int one[1] = {next};
        const std::string piece = tokenizer.decode(one);
        sample.text += piece;
        if (out) {
          std::fwrite(piece.data(), 1, piece.size(), out);
          std::fflush(out);
        }
        return true;
      });
  sample.tokens = run.tokens;
  return sample;
}

}  // namespace tpcli::train
