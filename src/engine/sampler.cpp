#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace tpcli::engine {

uint32_t random_u32(uint64_t& state) {
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
}

float random_f32(uint64_t& state) { return static_cast<float>(random_u32(state) >> 8) / 16777216.0f; }

int sample_argmax(std::span<const float> probabilities) {
  int max_i = 0;
  float max_p = probabilities[0];
  for (size_t i = 1; i < probabilities.size(); ++i)
    if (probabilities[i] > max_p) {
      max_i = static_cast<int>(i);
      max_p = probabilities[i];
    }
  return max_i;
}

int sample_mult(std::span<const float> probabilities, float coin) {
  float cdf = 0.0f;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    cdf += probabilities[i];
    if (coin < cdf) return static_cast<int>(i);
  }
  // Rounding: the last token, as run.c, unless a mask ruled it out (probability 0).
  size_t last = probabilities.size() - 1;
  while (last > 0 && probabilities[last] == 0.0f) --last;
  return static_cast<int>(last);
}

int sample_topp(std::span<const float> probabilities, float topp, float coin, std::vector<ProbIndex>& scratch) {
  const int n = static_cast<int>(probabilities.size());
  // Probabilities below (1 - topp) / (n - 1) cannot be in the nucleus: drop them before sorting.
  const float cutoff = (1.0f - topp) / static_cast<float>(n - 1);
  scratch.clear();
  for (int i = 0; i < n; ++i)
    if (probabilities[static_cast<size_t>(i)] >= cutoff) scratch.push_back({probabilities[static_cast<size_t>(i)], i});
  std::stable_sort(scratch.begin(), scratch.end(), [](const ProbIndex& a, const ProbIndex& b) { return a.prob > b.prob; });

  const int n0 = static_cast<int>(scratch.size());
  if (n0 == 0)  // only when no probability compares >= cutoff: NaNs (finite ones sum to 1)
    throw std::invalid_argument("sampler: top-p found no probability >= " + std::to_string(cutoff) +
                                " (non-finite probabilities?)");
  float cumulative = 0.0f;
  int last = n0 - 1;  // rounding: keep everything
  for (int i = 0; i < n0; ++i) {
    cumulative += scratch[static_cast<size_t>(i)].prob;
    if (cumulative > topp) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (int i = 0; i <= last; ++i) {
    cdf += scratch[static_cast<size_t>(i)].prob;
    if (r < cdf) return scratch[static_cast<size_t>(i)].index;
  }
  return scratch[static_cast<size_t>(last)].index;  // rounding
}

void keep_top_k_min_p(std::span<const float> probabilities, int top_k, float min_p, std::vector<ProbIndex>& out) {
  float most = 0.0f;
  for (float p : probabilities) most = std::max(most, p);
  const float least = min_p * most;  // the likeliest always stays
  out.clear();
  for (size_t i = 0; i < probabilities.size(); ++i)
    if (probabilities[i] >= least && probabilities[i] > 0.0f) out.push_back({probabilities[i], static_cast<int>(i)});
  const auto likelier = [](const ProbIndex& a, const ProbIndex& b) { return a.prob > b.prob || (a.prob == b.prob && a.index < b.index); };
  const size_t keep = top_k > 0 ? std::min(out.size(), static_cast<size_t>(top_k)) : out.size();
  std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(keep), out.end(), likelier);
  out.resize(keep);
  float sum = 0.0f;
  for (const ProbIndex& c : out) sum += c.prob;
  for (ProbIndex& c : out) c.prob /= sum;
}

int sample_candidates(std::span<const ProbIndex> candidates, float topp, float coin) {
  if (candidates.empty()) throw std::invalid_argument("sampler: no token to sample from");
  const bool nucleus = topp > 0 && topp < 1;
  size_t last = candidates.size() - 1;
  float cumulative = 0.0f;
  for (size_t i = 0; i < candidates.size(); ++i) {
    cumulative += candidates[i].prob;
    if (nucleus && cumulative > topp) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (size_t i = 0; i <= last; ++i) {
    cdf += candidates[i].prob;
    if (r < cdf) return candidates[i].index;
  }
  return candidates[last].index;  // rounding
}

void softmax(std::span<float> x) {
  float max_val = x[0];
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (auto& v : x) {
    v = std::exp(v - max_val);
    sum += v;
  }
  for (auto& v : x) v /= sum;
}

std::optional<std::string> non_finite_logits(std::span<const float> logits, int pos) {
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      return "the model's logits at position " + std::to_string(pos) + " are not finite (token " + std::to_string(i) + ": " +
             std::to_string(logits[i]) + "): the checkpoint holds non-finite weights or settings";
  return std::nullopt;
}

void require_finite_logits(std::span<const float> logits, int pos) {
  if (const auto message = non_finite_logits(logits, pos)) throw std::runtime_error(*message);
}

Sampler::Sampler(int vocab_size, float temperature, float topp, uint64_t seed)
    : vocab_size_(vocab_size), temperature_(temperature), topp_(topp), state_(seed) {
  if (vocab_size < 1) throw std::invalid_argument("sampler: vocab_size = " + std::to_string(vocab_size));
  if (!std::isfinite(temperature) || temperature < 0)
    throw std::invalid_argument("sampler: temperature = " + std::to_string(temperature) + " must be a finite number >= 0");
  if (!std::isfinite(topp)) throw std::invalid_argument("sampler: top-p = " + std::to_string(topp) + " is not a number");
}

namespace {

// -inf is a token a constraint ruled out (engine/token_constraint.h); NaN, +inf, or no token left are errors.
void check_sampled_logits(std::span<const float> logits) {
  bool any = false;
  for (float v : logits) {
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) throw std::invalid_argument("sampler: a logit is " + std::to_string(v));
    any = any || v != -std::numeric_limits<float>::infinity();
  }
  if (!any) throw std::invalid_argument("sampler: every logit is -inf");
}

}  // namespace

Sampler::Sampler(int vocab_size, float temperature, float topp, uint64_t seed, SamplingParams params)
    : Sampler(vocab_size, temperature, topp, seed) {
  check_sampling_params(params, vocab_size);
  params_ = std::move(params);
}

int Sampler::sample(std::span<float> logits, std::span<const int> prompt, std::span<const int> generated) {
  if (!params_.changes_logits() && !params_.filters()) return sample(logits);  // run.c's, untouched
  if (static_cast<int>(logits.size()) != vocab_size_)
    throw std::invalid_argument("sampler: got " + std::to_string(logits.size()) + " logits, vocab_size is " +
                                std::to_string(vocab_size_));
  for (int t : prompt)
    if (t < 0 || t >= vocab_size_) throw std::invalid_argument("sampler: token " + std::to_string(t) + " outside the vocabulary");
  for (int t : generated)
    if (t < 0 || t >= vocab_size_) throw std::invalid_argument("sampler: token " + std::to_string(t) + " outside the vocabulary");
  apply_bias_and_penalties(params_, logits, prompt, generated, token_scratch_);
  if (!params_.filters()) return sample(logits);
  check_sampled_logits(logits);
  if (temperature_ == 0.0f) return sample_argmax(logits);  // top_k and min_p keep the likeliest
  for (auto& v : logits) v /= temperature_;
  softmax(logits);
  const float coin = random_f32(state_);
  scratch_.reserve(static_cast<size_t>(vocab_size_));
  keep_top_k_min_p(logits, params_.top_k, params_.min_p, scratch_);
  return sample_candidates(scratch_, topp_, coin);
}

int Sampler::sample(std::span<float> logits) {
  if (static_cast<int>(logits.size()) != vocab_size_)
    throw std::invalid_argument("sampler: got " + std::to_string(logits.size()) + " logits, vocab_size is " +
                                std::to_string(vocab_size_));
  check_sampled_logits(logits);
  if (temperature_ == 0.0f) return sample_argmax(logits);
  for (auto& v : logits) v /= temperature_;
  softmax(logits);
  const float coin = random_f32(state_);
  if (topp_ <= 0 || topp_ >= 1) return sample_mult(logits, coin);
  // Reserved at the first top-p token, not at construction: a batch engine makes a sampler per
  // queued request, and a queue of them would each hold V entries before running.
  scratch_.reserve(static_cast<size_t>(vocab_size_));
  return sample_topp(logits, topp_, coin, scratch_);
}

}  // namespace tpcli::engine
