// tpcli::engine — sampling parameters (see sampling_params.h).
#include "engine/sampling_params.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace tpcli::engine {

namespace {

using nlohmann::json;

std::string format(double x) {
  std::string s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s;
}

SamplingParamError out_of_range(const std::string& key, double lo, double hi) {
  return SamplingParamError(key, "'" + key + "' must be between " + format(lo) + " and " + format(hi) + ".");
}

float number(const json& request, const char* key, float fallback, float lo, float hi) {
  const auto it = request.find(key);
  if (it == request.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw SamplingParamError(key, std::string("'") + key + "' must be a number.");
  const double x = it->get<double>();
  if (!(x >= lo && x <= hi)) throw out_of_range(key, lo, hi);
  return static_cast<float>(x);
}

int top_k_of(const json& request, int fallback) {
  const auto it = request.find("top_k");
  if (it == request.end() || it->is_null()) return fallback;
  constexpr int64_t most = std::numeric_limits<int32_t>::max();
  const bool fits = it->is_number_unsigned() ? it->get<uint64_t>() <= static_cast<uint64_t>(most)
                                             : it->is_number_integer() && it->get<int64_t>() >= -1;
  if (!fits) throw SamplingParamError("top_k", "'top_k' must be an integer between -1 and " + std::to_string(most) + " (0 or -1: off).");
  return std::max(0, it->get<int>());
}

// OpenAI's shape: {"token id": bias, ...}.
std::vector<std::pair<int, float>> logit_bias_of(const json& request, int vocab, const std::vector<std::pair<int, float>>& fallback) {
  const auto it = request.find("logit_bias");
  if (it == request.end() || it->is_null()) return fallback;
  if (!it->is_object()) throw SamplingParamError("logit_bias", "'logit_bias' must be an object mapping token ids to biases.");
  if (it->size() > MAX_LOGIT_BIASES)
    throw SamplingParamError("logit_bias", "'logit_bias' holds " + std::to_string(it->size()) + " entries; at most " +
                                               std::to_string(MAX_LOGIT_BIASES) + ".");
  std::vector<std::pair<int, float>> biases;
  for (const auto& [key, value] : it->items()) {
    int id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc() || end != key.data() + key.size() || key.empty() || id < 0 || id >= vocab)
      throw SamplingParamError("logit_bias", "'logit_bias' keys must be token ids from 0 to " + std::to_string(vocab - 1) + ".");
    if (!value.is_number() || !(value.get<double>() >= -MAX_LOGIT_BIAS && value.get<double>() <= MAX_LOGIT_BIAS))
      throw SamplingParamError("logit_bias", "'logit_bias' values must be numbers between -100 and 100.");
    biases.emplace_back(id, value.get<float>());
  }
  std::ranges::sort(biases);
  // "7" and "07" name one token: keep one, as a JSON object keeps one value per key.
  const auto same_id = [](const auto& a, const auto& b) { return a.first == b.first; };
  biases.erase(std::unique(biases.begin(), biases.end(), same_id), biases.end());
  return biases;
}

}  // namespace

SamplingParams read_sampling_params(const json& request, int vocab, const SamplingParams& defaults) {
  SamplingParams p;
  p.top_k = top_k_of(request, defaults.top_k);
  p.min_p = number(request, "min_p", defaults.min_p, 0.0f, 1.0f);
  p.presence_penalty = number(request, "presence_penalty", defaults.presence_penalty, -MAX_PENALTY, MAX_PENALTY);
  p.frequency_penalty = number(request, "frequency_penalty", defaults.frequency_penalty, -MAX_PENALTY, MAX_PENALTY);
  p.repetition_penalty =
      number(request, "repetition_penalty", defaults.repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY);
  p.logit_bias = logit_bias_of(request, vocab, defaults.logit_bias);
  return p;
}

void check_sampling_params(const SamplingParams& p, int vocab) {
  const auto within = [](float x, float lo, float hi) { return x >= lo && x <= hi; };  // false for NaN
  if (p.top_k < 0) throw SamplingParamError("top_k", "'top_k' must be >= 0 (0: off).");
  if (!within(p.min_p, 0.0f, 1.0f)) throw out_of_range("min_p", 0, 1);
  if (!within(p.presence_penalty, -MAX_PENALTY, MAX_PENALTY)) throw out_of_range("presence_penalty", -MAX_PENALTY, MAX_PENALTY);
  if (!within(p.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)) throw out_of_range("frequency_penalty", -MAX_PENALTY, MAX_PENALTY);
  if (!within(p.repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY))
    throw out_of_range("repetition_penalty", MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY);
  if (p.logit_bias.size() > MAX_LOGIT_BIASES)
    throw SamplingParamError("logit_bias", "'logit_bias' holds more than " + std::to_string(MAX_LOGIT_BIASES) + " entries.");
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab)
      throw SamplingParamError("logit_bias", "'logit_bias' keys must be token ids from 0 to " + std::to_string(vocab - 1) + ".");
    if (!within(bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)) throw out_of_range("logit_bias", -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS);
  }
}

void apply_bias_and_penalties(const SamplingParams& p, std::span<float> logits, std::span<const int> prompt,
                              std::span<const int> generated, std::vector<int>& scratch) {
  for (const auto& [id, bias] : p.logit_bias) logits[static_cast<size_t>(id)] += bias;
  if (p.repetition_penalty != 1.0f) {  // each token of the prompt or the output once
    scratch.assign(prompt.begin(), prompt.end());
    scratch.insert(scratch.end(), generated.begin(), generated.end());
    std::ranges::sort(scratch);
    const auto last = std::unique(scratch.begin(), scratch.end());
    for (auto t = scratch.begin(); t != last; ++t) {
      float& v = logits[static_cast<size_t>(*t)];
      v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  }
  if (p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  scratch.assign(generated.begin(), generated.end());
  std::ranges::sort(scratch);
  for (size_t i = 0; i < scratch.size();) {  // runs of one token: its count
    size_t j = i;
    while (j < scratch.size() && scratch[j] == scratch[i]) ++j;
    logits[static_cast<size_t>(scratch[i])] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
    i = j;
  }
}

}  // namespace tpcli::engine
