#include "model/generate_text.h"

#include <algorithm>
#include <optional>
#include <string>
#include <stdexcept>

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

GenerateResult tokenizer_text(const IdsRun& run, const TokenizerInterface& tokenizer, const std::vector<int>& stop_ids,
                              const std::string& prompt_text, std::FILE* out) {
  const std::vector<int> prompt = tokenizer.encode_text(prompt_text, /*bos=*/true);
  if (prompt.empty()) throw std::invalid_argument("empty prompt and the tokenizer has no BOS token to start from");
  const std::optional<int> bos = tokenizer.token_id(tokenizer.bos_text());
  std::string text;
  DecodeStream stream(tokenizer);
  auto emit = [&](const std::string& piece) {
    text += piece;
    if (out && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), out);
      std::fflush(out);
    }
  };
  if (!(bos && !tokenizer.bos_text().empty() && prompt[0] == *bos)) emit(stream.push(prompt[0]));
  size_t taken = 1;  // tokens of the run so far (prompt[0] first)
  GenerateResult result = run(prompt, [&](int, int next) {
    const bool generated = ++taken > prompt.size();
    if (generated && std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) return false;
    emit(stream.push(next));
    return true;
  });
  emit(stream.finish());
  emit("\n");
  result.text = std::move(text);
  return result;
}

GenerateResult generate_with_tokenizer(const ModelFns& model, const TokenizerInterface& tokenizer, int vocab,
                                       const std::vector<int>& stop_ids, const GenerateOptions& options,
                                       std::FILE* out) {
  const IdsRun run = [&](std::span<const int> prompt, const NextTokenFn& on_next) {
    return generate_from_ids(model, prompt, vocab, options, on_next);
  };
  return tokenizer_text(run, tokenizer, stop_ids, options.prompt, out);
}

}  // namespace tpcli::model
