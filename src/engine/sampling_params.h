// tpcli::engine — the sampling parameters clients send beyond llama2.c's temperature and top-p:
// top_k, min_p, presence/frequency penalties (OpenAI), repetition_penalty (an extension) and
// logit_bias; one parser of them for serve and `infer --batch`, and the steps that apply them.
//
// One fixed order, vLLM's (v1 sampler), per sequence:
//   1. logit_bias        logit[t] += bias[t]
//   2. penalties         repetition (over the prompt and the generated tokens, vLLM's and HF's rule:
//                        a positive logit divided by it, a negative one multiplied), then
//                        frequency and presence (OpenAI's, over the generated tokens only:
//                        logit[t] -= frequency * count[t] + presence * (count[t] > 0))
//   3. temperature       (0: the argmax of the logits so far; the filters below cannot change it)
//   4. top_k, min_p      tokens outside the k likeliest, or below min_p times the likeliest's
//                        probability, are dropped and the rest renormalised (the two commute)
//   5. top_p             run.c's nucleus over what is left
//   6. sample            run.c's coin, one per token
// With every parameter here at its default the sampler is run.c's, bit for bit (engine/sampler.h).
//
// Dimension legend: V vocab_size.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tpcli::engine {

constexpr float MAX_PENALTY = 2.0f;              // presence and frequency: OpenAI's [-2, 2]
constexpr float MIN_REPETITION_PENALTY = 0.01f;  // below or above, a logit overflows a float
constexpr float MAX_REPETITION_PENALTY = 100.0f;
constexpr float MAX_LOGIT_BIAS = 100.0f;         // OpenAI's [-100, 100]
constexpr size_t MAX_LOGIT_BIASES = 300;         // OpenAI's bound on entries

struct SamplingParams {
  int top_k = 0;                    // the k likeliest tokens; 0: all
  float min_p = 0.0f;               // in [0, 1]; 0: off
  float presence_penalty = 0.0f;    // in [-2, 2]
  float frequency_penalty = 0.0f;   // in [-2, 2]
  float repetition_penalty = 1.0f;  // in [0.01, 100]; 1: off
  std::vector<std::pair<int, float>> logit_bias;  // (token id, bias), ids ascending and distinct

  // Steps 1-2 change the logits themselves, so a greedy pick needs all of them (not each device's best).
  bool changes_logits() const {
    return !logit_bias.empty() || presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  bool filters() const { return top_k > 0 || min_p > 0.0f; }
  bool operator==(const SamplingParams&) const = default;
};

// A parameter out of range: `field` is the request's key ("top_k", "logit_bias"), `what()` says
// why in one line without echoing the request.
class SamplingParamError : public std::invalid_argument {
 public:
  SamplingParamError(std::string field, const std::string& message) : std::invalid_argument(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// The keys read by read_sampling_params.
inline constexpr const char* SAMPLING_KEYS[] = {"top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                                                "logit_bias"};

// The sampling keys of a request object (a serve body, an `infer --batch` line), each absent or
// null key taking its value from `defaults`; top_k -1 means off (vLLM's). Token ids in logit_bias
// must be below `vocab`. Throws SamplingParamError naming the first bad key.
SamplingParams read_sampling_params(const nlohmann::json& request, int vocab, const SamplingParams& defaults = {});

// Range checks of parameters built in code (BatchEngine::add, CLI flags): SamplingParamError.
void check_sampling_params(const SamplingParams& p, int vocab);

// Steps 1-2 on `logits` [V] of a sequence whose tokens so far are `prompt` then `generated`.
// `scratch` avoids a per-token allocation.
void apply_bias_and_penalties(const SamplingParams& p, std::span<float> logits, std::span<const int> prompt,
                              std::span<const int> generated, std::vector<int>& scratch);

}  // namespace tpcli::engine
