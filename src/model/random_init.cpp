#include "model/random_init.h"

#include <cmath>
#include <random>

namespace tpcli::model {

namespace {

// One stream per parameter (seeded from the seed and its index), so adding a parameter to the
// table does not change the others.
void fill_normal(std::span<float> out, float stddev, uint64_t seed, uint64_t index) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + index);
  constexpr double TWO_PI = 6.283185307179586;
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };  // (0, 1)
  for (size_t i = 0; i < out.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double theta = TWO_PI * uniform();
    out[i] = static_cast<float>(stddev * r * std::cos(theta));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(stddev * r * std::sin(theta));
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TensorWeights random_weights(const LlamaConfig& config, uint64_t seed) {
  config.validate();
  TensorWeights weights(config);
  const float stddev = 0.02f;
  const float residual_stddev = stddev / std::sqrt(2.0f * static_cast<float>(config.n_layers));
  uint64_t index = 0;
  for (const auto& p : llama_parameters(config)) {
    tensor::Tensor t(p.shape);
    if (p.shape.size() == 1) {
      t.fill(1.0f);  // norm gains
    } else {
      const bool residual = ends_with(p.name, ".wo") || ends_with(p.name, "w2");
      fill_normal(t.span(), residual ? residual_stddev : stddev, seed, index);
    }
    weights.set(p.name, std::move(t));
    ++index;
  }
  return weights;
}

}  // namespace tpcli::model
