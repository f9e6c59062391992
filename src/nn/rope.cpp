#include "nn/rope.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace tpcli::nn {

float llama3_frequency(float freq, const RopeScaling& s) {
  const float pi = 3.14159265358979323846f;
  const float old_context = static_cast<float>(s.original_max_position);
  const float wavelength = 2.0f * pi / freq;
  if (wavelength < old_context / s.high_freq_factor) return freq;  // high frequencies: unchanged
  if (wavelength > old_context / s.low_freq_factor) return freq / s.factor;  // low: stretched
  const float smooth = (old_context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0f - smooth) * freq / s.factor + smooth * freq;
}

float rope_frequency(int i, int head_size, float theta) {
  return 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(head_size));
}

std::vector<float> llama3_frequency_factors(int head_size, float theta, const RopeScaling& scaling) {
  std::vector<float> factors(static_cast<size_t>(head_size / 2));
  for (int i = 0; i < head_size / 2; ++i) {
    const float freq = rope_frequency(i, head_size, theta);
    factors[static_cast<size_t>(i)] = freq / llama3_frequency(freq, scaling);
  }
  return factors;
}

RopeTable::RopeTable(int seq_len, int head_size, float theta, std::optional<RopeScaling> scaling)
    : RopeTable(seq_len, head_size, theta, scaling, {}) {}

RopeTable::RopeTable(int seq_len, int head_size, float theta, std::optional<RopeScaling> scaling,
                     std::span<const float> frequency_factors)
    : seq_len_(seq_len), head_size_(head_size) {
  if (head_size % 2 != 0) throw std::invalid_argument("rope: head size " + std::to_string(head_size) + " is odd");
  const int half = head_size / 2;
  if (!frequency_factors.empty() && frequency_factors.size() != static_cast<size_t>(half))
    throw std::invalid_argument("rope: " + std::to_string(frequency_factors.size()) + " frequency factors for " + std::to_string(half) +
                                " pairs");
  cos_.resize(static_cast<size_t>(seq_len) * half);
  sin_.resize(cos_.size());
  for (int pos = 0; pos < seq_len; ++pos)
    for (int i = 0; i < half; ++i) {
      float freq = rope_frequency(i, head_size, theta);
      if (scaling) freq = llama3_frequency(freq, *scaling);
      if (!frequency_factors.empty()) freq /= frequency_factors[static_cast<size_t>(i)];
      float val = static_cast<float>(pos) * freq;
      cos_[static_cast<size_t>(pos) * half + i] = cosf(val);
      sin_[static_cast<size_t>(pos) * half + i] = sinf(val);
    }
}

void RopeTable::forward(float* x, int heads, int pos) const {
  const int half = head_size_ / 2;
  const float* c = cos_.data() + static_cast<size_t>(pos) * half;
  const float* s = sin_.data() + static_cast<size_t>(pos) * half;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_size_;
    for (int i = 0; i < half; ++i) {
      float v0 = v[2 * i], v1 = v[2 * i + 1];
      v[2 * i] = v0 * c[i] - v1 * s[i];
      v[2 * i + 1] = v0 * s[i] + v1 * c[i];
    }
  }
}

void RopeTable::backward(float* dx, int heads, int pos) const {
  const int half = head_size_ / 2;
  const float* c = cos_.data() + static_cast<size_t>(pos) * half;
  const float* s = sin_.data() + static_cast<size_t>(pos) * half;
  for (int h = 0; h < heads; ++h) {
    float* g = dx + static_cast<int64_t>(h) * head_size_;
    for (int i = 0; i < half; ++i) {  // transpose of the rotation
      float g0 = g[2 * i], g1 = g[2 * i + 1];
      g[2 * i] = g0 * c[i] + g1 * s[i];
      g[2 * i + 1] = -g0 * s[i] + g1 * c[i];
    }
  }
}

}  // namespace tpcli::nn
