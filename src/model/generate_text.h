// tpcli::model — generation with any tokenizer (model/tokenizer_interface.h), for tokenizer.json
// models: encode(prompt) with BOS when the tokenizer has one, generate_from_ids (one engine
// request), stop at an end-of-sequence token (not printed) or after `steps` positions; the text of
// every token after a leading BOS streams to `out` as UTF-8 completes, then a newline. llama2.c
// tokenizers keep generate() (run.c's exact output).
#pragma once

#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/sampler.h"
#include "model/tokenizer_interface.h"

namespace tpcli::model {

// The decoding loop of chat (generation runs on the batch engine: generate_from_ids). Feeds `prompt` (non-empty) at positions
// start_pos, start_pos + 1, ... (in one batch when the model has a prefill, else forced token by
// token), then the token picked from the logits (argmax when `greedy` and the model has argmax,
// else `sampler`); stops before feeding position `end_pos`, or
// when on_token returns false. on_token(fed, next) sees every token picked after a fed token,
// prompt tokens included. Returns the position after the last token fed. `vocab` is the number of
// logits the model returns (checked).
struct TokenLoop {
  std::span<const int> prompt;
  int start_pos = 0;
  int end_pos = 0;
  bool greedy = false;
  int vocab = 0;
};
using OnToken = std::function<bool(int fed, int next)>;
int run_token_loop(const ModelFns& model, Sampler& sampler, const TokenLoop& loop, const OnToken& on_token);

// The text of `run` (model/generate.h IdsRun) from `prompt`; `stop_ids`: end-of-sequence tokens.
GenerateResult tokenizer_text(const IdsRun& run, const TokenizerInterface& tokenizer, const std::vector<int>& stop_ids,
                              const std::string& prompt, std::FILE* out);
// tokenizer_text over generate_from_ids. `vocab`: the number of logits the model returns.
GenerateResult generate_with_tokenizer(const ModelFns& model, const TokenizerInterface& tokenizer, int vocab,
                                       const std::vector<int>& stop_ids, const GenerateOptions& options,
                                       std::FILE* out);

}  // namespace tpcli::model
