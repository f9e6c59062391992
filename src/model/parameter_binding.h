// tpcli::model — the one list that says which tensor holds which parameter of a trainable model
// (model/trainable_llama.h): its layers register {spec, value, grad} once, when the model is built,
// and everything else reads that list: the gradient buffer's layout and the marks where the
// backward has finished a stage of it, the checkpoints' gathering, the optimizer's table and ZeRO's
// slices (train/param_table.h), the memory report.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/llama_config.h"
#include "tensor/tensor.h"

namespace tpcli::model {

struct Parameter {
  const ParamSpec* spec = nullptr;
  tensor::Tensor* value = nullptr;  // this device's shard
  tensor::Tensor* grad = nullptr;   // same shape as value: a view of the gradient buffer at grad_offset
  int64_t grad_offset = 0;          // in the gradient buffer
};

class ParameterBinding {
 public:
  // Registers a parameter finished by the backward's `stage` (stages finish in ascending order; a
  // stage's parameters lie in the buffer in registration order). `value` and `grad` must outlive
  // the binding and keep their addresses.
  void bind(int stage, const ParamSpec& spec, tensor::Tensor& value, tensor::Tensor& grad);
  // Lays out the gradient buffer [P_local]: stage by stage, then the expert weights (nn/moe.h: the
  // data axis does not average them, and its buckets are the buffer's prefix). Every grad becomes
  // a view of the buffer, keeping its values. `specs`: every parameter, each bound exactly once.
  void lay_out(std::span<const ParamSpec> specs);

  std::span<float> buffer() { return buffer_; }
  // Where the buffer's final prefix ends once stage s is done (its non-expert parameters); stages
  // after the last one that holds parameters end where it does.
  int64_t end_of_stage(int s) const;
  // Every parameter in `specs` order (llama_parameters'), with its gradient's offset.
  const std::vector<Parameter>& parameters() const { return by_spec_; }

 private:
  struct Bound {
    int stage;
    Parameter p;
  };
  std::vector<Bound> bound_;  // registration order
  std::vector<float> buffer_;
  std::vector<int64_t> stage_ends_;
  std::vector<Parameter> by_spec_;
};

}  // namespace tpcli::model
