// tpcli::model — where full (unsharded) parameters come from when a device builds its shard.
//
// A device asks for a parameter by its ParamSpec name and copies only its own slice, so an
// mmap'd checkpoint is never copied whole into any device.
#pragma once

#include <map>
#include <span>
#include <string>

#include "model/llama_config.h"
#include "tensor/tensor.h"

namespace tpcli::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const LlamaConfig& config() const = 0;
  // The full tensor named by llama_parameters(config()), row-major in its ParamSpec shape.
  // Throws std::out_of_range naming the parameter when absent.
  virtual std::span<const float> get(const std::string& name) const = 0;
};

// Parameters held in memory (random init, tests, safetensors after reading).
class TensorWeights : public WeightSource {
 public:
  explicit TensorWeights(LlamaConfig config) : config_(std::move(config)) {}
  const LlamaConfig& config() const override { return config_; }
  std::span<const float> get(const std::string& name) const override;
  tensor::Tensor& at(const std::string& name) { return tensors_.at(name); }
  void set(const std::string& name, tensor::Tensor value) { tensors_[name] = std::move(value); }

 private:
  LlamaConfig config_;
  std::map<std::string, tensor::Tensor> tensors_;
};

}  // namespace tpcli::model
