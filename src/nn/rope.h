// tpcli::nn — rotary position embedding, llama2.c's convention.
//
// Dimension legend: S positions (seq_len), HS head size, H heads of the rotated rows.
// Within every head, the pair (2i, 2i+1) is rotated by the angle pos * theta^(-2i / HS), computed
// in float exactly as llama2.c's run.c does (powf, then cosf/sinf of pos * freq).
// Llama 3.1's "llama3" rope_scaling (optional) stretches the low frequencies of long-context
// models: see llama3_frequency. A GGUF file stores that scaling as per-pair factors instead
// (llama.cpp's rope_freqs.weight): each pair's frequency is divided by its factor.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace tpcli::nn {

// Hugging Face's rope_scaling {"rope_type": "llama3", ...} (Llama 3.1 / 3.2).
struct RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;  // original_max_position_embeddings
};

// The scaled inverse frequency of a pair whose unscaled one is `freq` (transformers'
// _compute_llama3_parameters): wavelengths 2*pi/freq shorter than original_max_position /
// high_freq_factor keep freq, longer than original_max_position / low_freq_factor get
// freq / factor, and those between are interpolated linearly in original_max_position / wavelength.
float llama3_frequency(float freq, const RopeScaling& scaling);

// The unscaled inverse frequency of pair i (theta^(-2i / HS), in float as llama2.c computes it).
float rope_frequency(int i, int head_size, float theta);

// llama.cpp's rope_freqs for `scaling` [HS/2]: its converter's factor freq / scaled freq per pair,
// which divides the frequency as llama.cpp's RoPE applies it.
std::vector<float> llama3_frequency_factors(int head_size, float theta, const RopeScaling& scaling);

class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(int seq_len, int head_size, float theta, std::optional<RopeScaling> scaling = std::nullopt);
  // Per-pair divisors of the frequencies [HS/2] (a GGUF's rope_freqs.weight); empty: none.
  RopeTable(int seq_len, int head_size, float theta, std::optional<RopeScaling> scaling, std::span<const float> frequency_factors);

  int head_size() const { return head_size_; }
  int seq_len() const { return seq_len_; }

  // Rotate, in place, `heads` heads of HS floats starting at x (one row at position pos).
  void forward(float* x, int heads, int pos) const;
  // The backward of forward: rotate the gradient by the opposite angle, in place.
  void backward(float* dx, int heads, int pos) const;

 private:
  int seq_len_ = 0, head_size_ = 0;
  std::vector<float> cos_, sin_;  // [S, HS/2]
};

}  // namespace tpcli::nn
