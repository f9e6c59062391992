#include "model/generate_text.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace tpcli::model {

int run_token_loop(const ForwardFn& forward, const ArgmaxFn& argmax, Sampler& sampler, const TokenLoop& loop,
                   const OnToken& on_token) {
  std::vector<float> logits(static_cast<size_t>(loop.vocab));  // [V] the sampler's working copy
  const bool greedy_shortcut = loop.greedy && argmax;
  const int prompt_end = loop.start_pos + static_cast<int>(loop.prompt.size());  // first position after the prompt
  int token = loop.prompt[0];
  int pos = loop.start_pos;
  while (pos < loop.end_pos) {
    int next;
    std::span<const float> full;
    int greedy = -1;
    if (greedy_shortcut) {
      greedy = argmax(token, pos);
    } else {
      full = forward(token, pos);
      if (static_cast<int>(full.size()) != loop.vocab)
        throw std::runtime_error("model returned " + std::to_string(full.size()) + " logits, tokenizer has " +
                                 std::to_string(loop.vocab) + " tokens");
    }
    if (pos < prompt_end - 1) {
      next = loop.prompt[static_cast<size_t>(pos - loop.start_pos) + 1];  // still inside the prompt: force it
    } else if (greedy_shortcut) {
      next = greedy;
    } else {
      logits.assign(full.begin(), full.end());
      next = sampler.sample(logits);
    }
    ++pos;
    if (!on_token(token, next)) break;
    token = next;
  }
  return pos;
}


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
