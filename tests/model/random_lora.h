// Test support for the model tests: random LoRA adapters (model/lora_adapter.h), seeded.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "model/lora_adapter.h"

namespace tpcli::testing {

inline const std::vector<std::string> LORA_ALL = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// A random adapter (seeded) on `targets` (HF names) of `layers`; B is not zero, so it acts.
inline model::LoraAdapterSet random_adapter(const model::LlamaConfig& c, std::vector<std::string> targets, std::vector<int> layers, int r,
                              uint32_t seed) {
  model::LoraAdapterSet set;
  set.rank = r;
  set.alpha = 2.0 * r;
  set.dropout = 0.05;
  set.targets = std::move(targets);
  set.base_model = "test/random";
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.2f);
  for (int l : layers)
    for (const auto& t : set.targets) {
      const std::string m = *model::lora_matrix_of(t);
      const std::string name = "layers." + std::to_string(l) + "." + m;
      tensor::Shape w;
      for (const auto& p : model::llama_parameters(c))
        if (p.name == name) w = p.shape;
      std::vector<float> a(static_cast<size_t>(r * w[1])), b(static_cast<size_t>(w[0] * r));
      for (auto& x : a) x = d(rng);
      for (auto& x : b) x = d(rng);
      set.tensors.emplace(name + ".lora_a", tensor::Tensor({r, w[1]}, a));
      set.tensors.emplace(name + ".lora_b", tensor::Tensor({w[0], r}, b));
    }
  return set;
}

}  // namespace tpcli::testing
