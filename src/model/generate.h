// tpcli::model — the generation loop of llama2.c's `run` (generate mode), byte for byte.
//
// encode(prompt, BOS) -> feed tokens one position at a time; while inside the prompt the next token
// is forced, afterwards the sampler picks it; stop after `steps` positions (counting the prompt,
// BOS included) or when BOS comes out; every token after the first is decoded (leading space
// stripped after BOS, <0xNN> as its byte) and printed through safe_printf; a final newline.
//
// Dimension legend: V vocab_size.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/sampler.h"
#include "model/tokenizer.h"

namespace tpcli::model {

// Full-vocabulary logits [V] after feeding `token` at position `pos` (the KV cache advances).
using ForwardFn = std::function<std::span<const float>(int token, int pos)>;

struct GenerateOptions {
  std::string prompt;
  int steps = 256;           // positions, prompt included; 0 or > seq_len means seq_len
  float temperature = 1.0f;  // 0 = greedy
  float topp = 0.9f;         // outside (0, 1): plain multinomial sampling
  uint64_t seed = 0;         // 0 = from the clock (llama2.c: time(NULL))
};

// llama2.c's main() overrides: seed <= 0 -> time, temperature < 0 -> 0, topp outside [0, 1] ->
// 0.9, steps < 0 -> 0, steps 0 or > seq_len -> seq_len.
GenerateOptions normalized(GenerateOptions options, int seq_len);

struct GenerateResult {
  std::string text;         // exactly the bytes printed to stdout (final newline included)
  std::vector<int> tokens;  // every token fed at positions 0.. plus the last one picked (BOS first)
  int positions = 0;        // forward passes run
  double tokens_per_second = 0;  // llama2.c's figure: (positions - 1) over the time after the first
};

// `out` (may be null) receives the text as it is produced, flushed per token like run.c.
// The options must be normalized already.
GenerateResult generate(const ForwardFn& forward, const Tokenizer& tokenizer, const GenerateOptions& options,
                        std::FILE* out);

}  // namespace tpcli::model
