// tpcli::train — AdamW (PyTorch's torch.optim.AdamW formulas), global-norm clipping, lr schedule.
//
// Dimension legend: N elements of one parameter shard (this device's slice).
//
// The optimizer sees each parameter as a Slot: this device's slice of the value and its gradient.
// Nothing here communicates: the loop sums local_grad_sq over the world (every device weights its
// slots so that each distinct gradient element is counted exactly once; see Slot::norm_weight).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tpcli::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied only to slots with decay = true
};

struct Slot {
  std::span<float> value;      // (N,) this device's slice of the parameter
  std::span<float> grad;       // (N,) its gradient, already averaged over the data axis
  bool decay = false;          // ParamSpec::weight_decay: matrices and embedding, never norm gains
  // 1 / (number of devices in the world that hold this very gradient slice): a slice replicated
  // over the tensor group and the data axis counts 1 / (D * TP) on each device, so summing
  // norm_weight * |grad|^2 over the world counts every distinct element once.
  double norm_weight = 1.0;
  // When not empty, replaces norm_weight row by row (the slice is row_norm_weights.size() equal
  // rows): KV heads shared by some tensor devices and not others (model/shard_plan.h).
  std::vector<double> row_norm_weights;
};

class AdamW {
 public:
  // sizes[i]: element count of slot i (the moments are allocated zero, like PyTorch's lazy state).
  AdamW(AdamWOptions options, const std::vector<int64_t>& sizes);

  // One update of every slot with learning rate lr; the step count t advances first (PyTorch: 1-based).
  void step(std::span<const Slot> slots, double lr);

  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  const AdamWOptions& options() const { return options_; }
  std::vector<tensor::Tensor>& exp_avg() { return m_; }      // first moments, one (N,) tensor per slot
  std::vector<tensor::Tensor>& exp_avg_sq() { return v_; }   // second moments

 private:
  AdamWOptions options_;
  int64_t t_ = 0;
  std::vector<tensor::Tensor> m_;  // (N,) per slot
  std::vector<tensor::Tensor> v_;  // (N,) per slot
};

// Sum over slots of norm_weight * sum(grad^2), in double. The world-wide all_sum of this is the
// squared global norm.
double local_grad_sq(std::span<const Slot> slots);

// torch.nn.utils.clip_grad_norm_: scale = max_norm / (total_norm + 1e-6), applied when < 1.
// max_norm <= 0 turns clipping off. Returns the scale applied (1 when none).
double clip_grads(std::span<const Slot> slots, double total_norm, double max_norm);

enum class Decay { Cosine, Constant };
Decay parse_decay(const std::string& name);  // "cosine" | "constant"; throws naming the value

// Linear warm-up from lr/(warmup+1) to lr over warmup_steps, then cosine decay to min_lr at
// total_steps (nanoGPT's get_lr), or lr held constant after warm-up.
struct LrSchedule {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  Decay decay = Decay::Cosine;
  double at(int64_t step) const;  // step counts from 0
};

}  // namespace tpcli::train
