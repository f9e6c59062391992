// Test support for the model tests: random-weight Llama models of several shapes (replicated KV
// heads, uneven head splits, an unshared classifier), random tokens, token-by-token decode logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "model/llama.h"

namespace tpcli::testing {

using model::LlamaConfig;
using model::TensorWeights;

inline LlamaConfig make_config(int dim, int heads, int kv_heads, int hidden, int layers, int vocab, bool shared) {
  LlamaConfig c{.dim = dim, .hidden_dim = hidden, .n_layers = layers, .n_heads = heads, .n_kv_heads = kv_heads,
      .vocab_size = vocab, .seq_len = 16, .shared_classifier = shared};
  return c;
}

// Qwen2's q/k/v biases and Qwen3's q/k norms on one model, heads of head_dim (not dim / 4).
inline LlamaConfig qwen_like(int dim, int head_dim) {
  LlamaConfig c = make_config(dim, 4, 2, 30, 2, 19, false);
  c.head_dim = head_dim;
  c.qkv_bias = c.qk_norm = true;
  return c;
}

inline TensorWeights random_weights(const LlamaConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  TensorWeights w(c);
  for (const auto& spec : model::llama_parameters(c)) {
    const bool gain = spec.shape.size() == 1;
    std::normal_distribution<float> d(gain ? 1.0f : 0.0f, gain ? 0.1f : 0.3f);
    std::vector<float> v(static_cast<size_t>(tensor::numel(spec.shape)));
    for (auto& x : v) x = d(rng);
    w.set(spec.name, tensor::Tensor(spec.shape, std::move(v)));
  }
  return w;
}

inline std::vector<int> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<int> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Decode logits [steps, V] of every device of a T-device run (rank order).
inline std::vector<std::vector<float>> decode_logits(const TensorWeights& w, int T, const std::vector<int>& tokens) {
  std::vector<std::vector<float>> out(T);
  dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    std::vector<float> all;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
      auto logits = m.forward(tokens[pos], static_cast<int>(pos));
      all.insert(all.end(), logits.begin(), logits.end());
    }
    out[dev.rank()] = std::move(all);
  });
  return out;
}

inline float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

struct Shape {
  const char* name;
  LlamaConfig config;
  int max_devices;
};

inline std::vector<Shape> shapes() {
  return {
      {"8 heads, 4 KV heads (stories260K-like)", make_config(32, 8, 4, 40, 2, 29, true), 8},
      {"6 heads, 3 KV heads, unshared classifier", make_config(24, 6, 3, 30, 2, 23, false), 6},
      {"4 heads, 1 KV head (multi-query)", make_config(16, 4, 1, 20, 1, 13, true), 4},
      {"Qwen-like: q/k/v biases, q/k norms, head_dim 8 (q 32 wide on dim 24), 4 heads, 2 KV heads", qwen_like(24, 8), 4},
  };
}


}  // namespace tpcli::testing
