#include "model/generate_text.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace tpcli::model {

GenerateResult generate_with_tokenizer(const ForwardFn& forward, const TokenizerInterface& tokenizer, int vocab,
                                       const std::vector<int>& stop_ids, const GenerateOptions& options,
                                       std::FILE* out, const ArgmaxFn& argmax) {
  const std::vector<int> prompt = tokenizer.encode_text(options.prompt, /*bos=*/true);
  if (prompt.empty()) throw std::invalid_argument("empty prompt and the tokenizer has no BOS token to start from");
  const std::optional<int> bos = tokenizer.token_id(tokenizer.bos_text());
  Sampler sampler(vocab, options.temperature, options.topp, options.seed);

  GenerateResult result;
  DecodeStream stream(tokenizer);
  auto emit = [&](const std::string& text) {
    result.text += text;
    if (out && !text.empty()) {
      std::fwrite(text.data(), 1, text.size(), out);
      std::fflush(out);
    }
  };
  if (!(bos && !tokenizer.bos_text().empty() && prompt[0] == *bos)) emit(stream.push(prompt[0]));

  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> start;
  result.tokens.push_back(prompt[0]);
  const TokenLoop loop{prompt, 0, options.steps, options.temperature == 0.0f, vocab};
  const int pos = run_token_loop(forward, argmax, sampler, loop, [&](int, int next) {
    result.tokens.push_back(next);
    const bool generated = static_cast<int>(result.tokens.size()) > static_cast<int>(prompt.size());
    if (generated && std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) return false;
    emit(stream.push(next));
    if (!start) start = Clock::now();
    return true;
  });
  emit(stream.finish());
  emit("\n");
  result.positions = pos;
  if (pos > 1 && start) {
    const double seconds = std::chrono::duration<double>(Clock::now() - *start).count();
    result.tokens_per_second = seconds > 0 ? (pos - 1) / seconds : 0;
  }
  return result;
}

}  // namespace tpcli::model
