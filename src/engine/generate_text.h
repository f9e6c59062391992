// tpcli::engine — generation with any tokenizer (text/tokenizer_interface.h), for tokenizer.json
// models: encode(prompt) with BOS when the tokenizer has one, generate_from_ids (one engine
// request), stop at an end-of-sequence token (not printed) or after `steps` positions; the text of
// every token after a leading BOS streams to `out` as UTF-8 completes, then a newline. llama2.c
// tokenizers keep generate() (run.c's exact output).
#pragma once

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "text/tokenizer_interface.h"

namespace tpcli::engine {

// The text of `run` (engine/generate.h IdsRun) from `prompt`; `stop_ids`: end-of-sequence tokens.
GenerateResult tokenizer_text(const IdsRun& run, const text::TokenizerInterface& tokenizer, const std::vector<int>& stop_ids,
                              const std::string& prompt, std::FILE* out);
// tokenizer_text over generate_from_ids. `vocab`: the number of logits the model returns.
GenerateResult generate_with_tokenizer(const ModelFns& model, const text::TokenizerInterface& tokenizer, int vocab,
                                       const std::vector<int>& stop_ids, const GenerateOptions& options,
                                       std::FILE* out);

}  // namespace tpcli::engine
