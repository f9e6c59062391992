#include "model/generate.h"

#include <chrono>
#include <ctime>
#include <stdexcept>

namespace tpcli::model {

GenerateOptions normalized(GenerateOptions o, int seq_len) {
  if (o.seed == 0) o.seed = static_cast<unsigned int>(std::time(nullptr));
  if (o.temperature < 0.0f) o.temperature = 0.0f;
  if (o.topp < 0.0f || 1.0f < o.topp) o.topp = 0.9f;
  if (o.steps < 0) o.steps = 0;
  if (o.steps == 0 || o.steps > seq_len) o.steps = seq_len;
  return o;
}

GenerateResult generate(const ForwardFn& forward, const Tokenizer& tokenizer, const GenerateOptions& options,
                        std::FILE* out) {
  const std::vector<int> prompt = tokenizer.encode(options.prompt, /*bos=*/true, /*eos=*/false);
  const int vocab = tokenizer.vocab_size();
  Sampler sampler(vocab, options.temperature, options.topp, options.seed);
  std::vector<float> logits(static_cast<size_t>(vocab));  // [V] the sampler's working copy

  GenerateResult result;
  auto emit = [&](std::string_view piece) {
    result.text.append(piece);
    if (out) {
      std::fwrite(piece.data(), 1, piece.size(), out);
      std::fflush(out);
    }
  };

  using Clock = std::chrono::steady_clock;
  Clock::time_point start{};
  bool timing = false;
  int token = prompt[0];
  int pos = 0;
  result.tokens.push_back(token);
  while (pos < options.steps) {
    const std::span<const float> full = forward(token, pos);
    if (static_cast<int>(full.size()) != vocab)
      throw std::runtime_error("model returned " + std::to_string(full.size()) + " logits, tokenizer has " +
                               std::to_string(vocab) + " tokens");
    int next;
    if (pos < static_cast<int>(prompt.size()) - 1) {
      next = prompt[static_cast<size_t>(pos) + 1];  // still inside the prompt: force it
    } else {
      logits.assign(full.begin(), full.end());
      next = sampler.sample(logits);
    }
    ++pos;
    result.tokens.push_back(next);
    if (next == BOS_TOKEN) break;  // BOS delimits sequences
    emit(Tokenizer::printable_piece(tokenizer.decode(token, next)));
    token = next;
    if (!timing) {
      start = Clock::now();
      timing = true;
    }
  }
  emit("\n");
  result.positions = pos;
  if (pos > 1) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.tokens_per_second = seconds > 0 ? (pos - 1) / seconds : 0;
  }
  return result;
}

}  // namespace tpcli::model
