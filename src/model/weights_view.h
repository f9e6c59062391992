// tpcli::model — a WeightSource seen through an adjusted config: the same tensors, with a
// shorter context (the KV cache is allocated for config().seq_len positions) or presented as f32
// only (`infer --dtype f32`: stored() is nullopt and there is no quantization, so the model
// computes from get()'s converted or dequantized f32).
#pragma once

#include <memory>

#include "model/weights.h"

namespace tpcli::model {

class WeightsView : public WeightSource {
 public:
  explicit WeightsView(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)), config_(inner_->config()) {}

  // Positions to run at most: seq_len becomes min(seq_len, positions). RoPE does not depend on it.
  void limit_context(int positions);
  // From now on: f32 only, as described above.
  void as_f32();

  const LlamaConfig& config() const override { return config_; }
  std::span<const float> get(const std::string& name) const override { return inner_->get(name); }
  std::optional<StoredTensor> stored(const std::string& name) const override;
  void release_conversions() const override { inner_->release_conversions(); }
  void release_pages(const std::string& name) const override { inner_->release_pages(name); }
  void release_all_pages() const override { inner_->release_all_pages(); }
  const LoraAdapterSet* adapter() const override { return inner_->adapter(); }

 private:
  std::unique_ptr<WeightSource> inner_;
  LlamaConfig config_;
  bool f32_only_ = false;
};

}  // namespace tpcli::model
