// llama2.c's generation loop (run.c's `generate`), as tpcli ran it before every generation became a
// batch engine request (engine/generate.h): the tests' oracle for generate_from_ids. Feeds the
// prompt token by token through model.forward (or in one batch through model.prefill when given),
// forces the prompt's tokens, then samples (argmax when greedy and model.argmax is given), until
// options.steps positions have run or on_next says stop.
#pragma once

#include <algorithm>
#include <chrono>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/generate_text.h"
#include "engine/sampler.h"

namespace tpcli::testing {

inline tpcli::engine::GenerateResult reference_generate_from_ids(const tpcli::engine::ModelFns& model, std::span<const int> prompt, int vocab,
                                                               const tpcli::engine::GenerateOptions& options,
                                                               const tpcli::engine::NextTokenFn& on_next = nullptr) {
  using namespace tpcli::model;
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt holds no token");
  for (int id : prompt)
    if (id < 0 || id >= vocab)
      throw std::invalid_argument("generate: prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
  engine::Sampler sampler(vocab, options.temperature, options.topp, options.seed);
  std::vector<float> logits(static_cast<size_t>(vocab));  // [V] the sampler's working copy

  engine::GenerateResult result;
  auto checked = [&](std::span<const float> full) {
    if (static_cast<int>(full.size()) != vocab)
      throw std::runtime_error("model returned " + std::to_string(full.size()) + " logits, the vocabulary has " +
                               std::to_string(vocab) + " tokens");
    return full;
  };

  using Clock = std::chrono::steady_clock;
  const bool greedy_shortcut = options.temperature == 0.0f && model.argmax;
  std::span<const float> full;  // [V] logits of the last position run (unless greedy_shortcut)
  int greedy = -1;              // its argmax (greedy_shortcut)

  // The prompt (up to `steps` positions) in one batch: positions 0..prefilled-1 have run after it.
  int prefilled = 0;
  const bool can_prefill = greedy_shortcut ? static_cast<bool>(model.prefill_argmax) : static_cast<bool>(model.prefill);
  if (can_prefill && prompt.size() > 1 && options.steps > 1) {
    prefilled = std::min(static_cast<int>(prompt.size()), options.steps);
    const std::span<const int> batch = prompt.first(static_cast<size_t>(prefilled));
    const auto t0 = Clock::now();
    if (greedy_shortcut) greedy = model.prefill_argmax(batch, 0);
    else full = checked(model.prefill(batch, 0));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    result.prefill_tokens = prefilled;
    result.prefill_tokens_per_second = seconds > 0 ? prefilled / seconds : 0;
  }
  Clock::time_point start = Clock::now();  // end of the first forward call (reset below when it is a decode)
  const int first_call = std::max(prefilled, 1);  // positions the first forward call ran

  int token = prompt[0];
  int pos = 0;
  result.tokens.push_back(token);
  while (pos < options.steps) {
    if (pos >= prefilled) {  // inside a prefilled prompt every position has run already
      if (greedy_shortcut) greedy = model.argmax(token, pos);
      else full = checked(model.forward(token, pos));
      if (pos == 0) start = Clock::now();
    }
    int next;
    if (pos < static_cast<int>(prompt.size()) - 1) {
      next = prompt[static_cast<size_t>(pos) + 1];  // still inside the prompt: force it
    } else if (greedy_shortcut) {
      if (greedy < 0)  // Llama::forward_argmax: some device's logits are not finite
        throw std::runtime_error("the model's logits at position " + std::to_string(pos) +
                                 " are not finite: the checkpoint holds non-finite weights or settings");
      next = greedy;
    } else {
      engine::require_finite_logits(full, pos);
      logits.assign(full.begin(), full.end());
      next = sampler.sample(logits);
    }
    ++pos;
    result.tokens.push_back(next);
    if (on_next && !on_next(token, next)) break;
    token = next;
  }
  result.positions = pos;
  if (pos > first_call) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.tokens_per_second = seconds > 0 ? (pos - first_call) / seconds : 0;
  }
  return result;
}

// The loop as a engine::IdsRun, for the text functions (engine::llama2c_text, engine::tokenizer_text).
inline tpcli::engine::IdsRun reference_run(const tpcli::engine::ModelFns& model, int vocab, const tpcli::engine::GenerateOptions& options) {
  return [model, vocab, options](std::span<const int> prompt, const tpcli::engine::NextTokenFn& on_next) {
    return reference_generate_from_ids(model, prompt, vocab, options, on_next);
  };
}

// run.c's whole `generate` over the loop: its stdout in GenerateResult::text.
inline tpcli::engine::GenerateResult reference_generate(const tpcli::engine::ModelFns& model, const tpcli::text::Tokenizer& tokenizer,
                                                       const tpcli::engine::GenerateOptions& options, std::FILE* out) {
  return tpcli::engine::llama2c_text(reference_run(model, tokenizer.vocab_size(), options), tokenizer, options.prompt, out);
}

}  // namespace tpcli::testing
