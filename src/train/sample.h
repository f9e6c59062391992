// tpcli::train — text generation for models trained on a chars or bytes vocabulary.
//
// llama2.c's generate (engine/generate.h) assumes a BPE tokenizer with BOS = 1 and a dummy leading
// space; a chars model has neither (token 1 is a character). This feeds the prompt's tokens as they
// are (no BOS; an empty prompt starts from token 0, nanoGPT's "\n" in a chars vocabulary of text)
// through generate_from_ids (one batch engine request), then samples; it never stops early.
//
// Dimension legend: V vocab_size.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/generate.h"
#include "train/data.h"

namespace tpcli::train {

struct TextSample {
  std::string text;         // prompt + generated text (what was printed, final newline excluded)
  std::vector<int> tokens;  // every token fed, plus the last one picked
};

// steps: positions, prompt included (capped at seq_len). temperature 0 = greedy; seed 0 = 1. `out`
// (may be null) receives the text as it is produced. model.llama: the model to run (generate_from_ids).
TextSample generate_text(const engine::ModelFns& model, const TextTokenizer& tokenizer, const std::string& prompt,
                         int steps, int seq_len, float temperature, float topp, uint64_t seed, std::FILE* out);

}  // namespace tpcli::train
