// tpcli::model — generation with any tokenizer (model/tokenizer_interface.h), for tokenizer.json
// models: encode(prompt) with BOS when the tokenizer has one, the same decoding loop as llama2.c's
// generate (run_token_loop), stop at an end-of-sequence token (not printed) or after `steps`
// positions; the text of every token after a leading BOS streams to `out` as UTF-8 completes, then
// a newline. llama2.c tokenizers keep generate() (run.c's exact output).
#pragma once

#include <cstdio>
#include <vector>

#include "model/generate.h"
#include "model/tokenizer_interface.h"

namespace tpcli::model {

// `vocab`: the number of logits the model returns; `stop_ids`: end-of-sequence tokens.
GenerateResult generate_with_tokenizer(const ForwardFn& forward, const TokenizerInterface& tokenizer, int vocab,
                                       const std::vector<int>& stop_ids, const GenerateOptions& options,
                                       std::FILE* out, const ArgmaxFn& argmax = nullptr);

}  // namespace tpcli::model
