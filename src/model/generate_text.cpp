#include "model/generate_text.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "model/text_stream.h"

namespace tpcli::model {

int run_token_loop(const ModelFns& model, Sampler& sampler, const TokenLoop& loop, const OnToken& on_token) {
  std::vector<float> logits(static_cast<size_t>(loop.vocab));  // [V] the sampler's working copy
  const bool greedy_shortcut = loop.greedy && model.argmax;
  const int prompt_end = loop.start_pos + static_cast<int>(loop.prompt.size());  // first position after the prompt
  auto checked = [&](std::span<const float> full) {
    if (static_cast<int>(full.size()) != loop.vocab)
      throw std::runtime_error("model returned " + std::to_string(full.size()) + " logits, tokenizer has " +
                               std::to_string(loop.vocab) + " tokens");
    return full;
  };
  std::span<const float> full;  // [V] logits of the last position run (unless greedy_shortcut)
  int greedy = -1;              // its argmax (greedy_shortcut)
  // The prompt in one batch when the model can: positions start_pos..prefilled_end-1 have run.
  int prefilled_end = loop.start_pos;
  const int batch = std::min(prompt_end, loop.end_pos) - loop.start_pos;
  if (batch > 1 && (greedy_shortcut ? static_cast<bool>(model.prefill_argmax) : static_cast<bool>(model.prefill))) {
    const std::span<const int> tokens = loop.prompt.first(static_cast<size_t>(batch));
    if (greedy_shortcut) greedy = model.prefill_argmax(tokens, loop.start_pos);
    else full = checked(model.prefill(tokens, loop.start_pos));
    prefilled_end = loop.start_pos + batch;
  }
  int token = loop.prompt[0];
  int pos = loop.start_pos;
  while (pos < loop.end_pos) {
    if (pos >= prefilled_end) {  // inside a prefilled prompt every position has run already
      if (greedy_shortcut) greedy = model.argmax(token, pos);
      else full = checked(model.forward(token, pos));
    }
    int next;
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

GenerateResult generate_with_tokenizer(const ModelFns& model, const TokenizerInterface& tokenizer, int vocab,
                                       const std::vector<int>& stop_ids, const GenerateOptions& options,
                                       std::FILE* out) {
  const std::vector<int> prompt = tokenizer.encode_text(options.prompt, /*bos=*/true);
  if (prompt.empty()) throw std::invalid_argument("empty prompt and the tokenizer has no BOS token to start from");
  const std::optional<int> bos = tokenizer.token_id(tokenizer.bos_text());
  Sampler sampler(vocab, options.temperature, options.topp, options.seed);

  GenerateResult result;
  TextStream stream(tokenizer, {}, {});  // the text as the tokens spell it, each piece once final
  auto emit = [&](const std::string& text) {
    result.text += text;
    if (out && !text.empty()) {
      std::fwrite(text.data(), 1, text.size(), out);
      std::fflush(out);
    }
  };
  if (!(bos && !tokenizer.bos_text().empty() && prompt[0] == *bos)) emit(stream.add(prompt[0]));

  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> start;
  result.tokens.push_back(prompt[0]);
  const TokenLoop loop{prompt, 0, options.steps, options.temperature == 0.0f, vocab};
  const int pos = run_token_loop(model, sampler, loop, [&](int, int next) {
    result.tokens.push_back(next);
    const bool generated = static_cast<int>(result.tokens.size()) > static_cast<int>(prompt.size());
    if (generated && std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) return false;
    emit(stream.add(next));
    if (!start) start = Clock::now();
    return true;
  });
  emit(stream.flush());
  emit("\n");
  result.positions = pos;
  if (pos > 1 && start) {
    const double seconds = std::chrono::duration<double>(Clock::now() - *start).count();
    result.tokens_per_second = seconds > 0 ? (pos - 1) / seconds : 0;
  }
  return result;
}

}  // namespace tpcli::model
