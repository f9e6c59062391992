// tpcli::engine — llama2.c's sampler: greedy, temperature, multinomial and top-p (nucleus), with
// its xorshift RNG, so `-s SEED` picks the same tokens as llama2.c's `run`.
//
// The randomness is an explicit state passed in (llama2.c's habit), so every function is testable
// and every device of a run, holding the same state and the same logits, picks the same token.
//
// Dimension legend: V vocab_size.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/sampling_params.h"

namespace tpcli::engine {

// xorshift* (llama2.c random_u32 / random_f32). A state of 0 stays 0 forever: seed with >= 1.
uint32_t random_u32(uint64_t& state);
float random_f32(uint64_t& state);  // in [0, 1)

int sample_argmax(std::span<const float> probabilities);                 // first index of the max
int sample_mult(std::span<const float> probabilities, float coin);      // inverse CDF
// Nucleus sampling over probabilities (sum 1) with run.c's cutoff (1 - topp) / (V - 1) and its
// descending sort (stable, like glibc's qsort); `scratch` avoids a per-token allocation.
struct ProbIndex {
  float prob;
  int index;
};
int sample_topp(std::span<const float> probabilities, float topp, float coin, std::vector<ProbIndex>& scratch);
// Step 4 of sampling_params.h on probabilities [V] (sum 1): the tokens within the top_k likeliest
// (0: all) whose probability is at least min_p times the likeliest's, likeliest first (ties by
// id), their probabilities renormalised to sum 1.
void keep_top_k_min_p(std::span<const float> probabilities, int top_k, float min_p, std::vector<ProbIndex>& out);
// Steps 5-6 over such a list: run.c's nucleus (topp in (0, 1), else all of it), then the coin.
int sample_candidates(std::span<const ProbIndex> candidates, float topp, float coin);
// In place: x = softmax(x), run.c's order of operations (max, expf, sum, divide).
void softmax(std::span<float> x);

// Throws std::runtime_error naming the position and the first non-finite logit [V]: a NaN would
// otherwise come out as a token (<unk> runs) and the run would end "successfully".
void require_finite_logits(std::span<const float> logits, int pos);
// The same message, or none when every logit is finite (the batch engine fails one sequence on it).
std::optional<std::string> non_finite_logits(std::span<const float> logits, int pos);

class Sampler {
 public:
  // Throws std::invalid_argument for a non-finite or negative temperature or a non-finite top-p.
  Sampler(int vocab_size, float temperature, float topp, uint64_t seed);
  // With the other parameters (sampling_params.h; SamplingParamError when one is out of range).
  Sampler(int vocab_size, float temperature, float topp, uint64_t seed, SamplingParams params);
  // Picks the next token; `logits` [V] is overwritten (divided by temperature, softmaxed), as run.c does.
  // A logit of -inf is a token ruled out (a constraint's mask: engine/token_constraint.h). Throws
  // std::invalid_argument when a logit is NaN or +inf or all are -inf (callers check first, naming the position).
  int sample(std::span<float> logits);
  // The same, after logit_bias and the penalties over the sequence's tokens so far (its `prompt`,
  // then what it `generated`), and with top_k / min_p; at default parameters, sample(logits).
  int sample(std::span<float> logits, std::span<const int> prompt, std::span<const int> generated);
  const SamplingParams& params() const { return params_; }
  uint64_t state() const { return state_; }

 private:
  int vocab_size_;
  float temperature_;
  float topp_;
  uint64_t state_;
  SamplingParams params_;
  std::vector<int> token_scratch_;  // the penalties' sorted tokens
  std::vector<ProbIndex> scratch_;  // [V] once top-p sampling starts; empty until then
};

}  // namespace tpcli::engine
