// tpcli::nn — the feed-forward half of a transformer block, behind an interface so the
// mixture-of-experts layer (nn/moe.h) can take the dense layer's place (model/llama_core.cpp,
// load_f32_feed_forward, picks one per block).
//
// Dimension legend: N rows, C channels, F hidden features, FL this device's hidden rows.
// Input and output are mirrored [N, C] (the same on every tensor-parallel device); what happens
// inside is the layer's business, including its communication.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/group.h"
#include "nn/linear.h"
#include "nn/quantized_lora.h"
#include "nn/quantized_linear.h"
#include "tensor/tensor.h"

namespace tpcli::nn {

// A parameter of this device: its name as in model::llama_parameters, its local value and grad.
struct ParamRef {
  std::string name;
  tensor::Tensor* value = nullptr;
  tensor::Tensor* grad = nullptr;
};

// What every feed-forward does: forward. Inference runs any of them; training needs a
// TrainableFeedForward: the f32 ones, and the packed SwiGLU, whose only trained parameters are
// LoRA adapters on its frozen base (QLoRA).
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // out[N, C] = ffn(inp[N, C]); both mirrored. A collective. Saves what backward needs.
  virtual void forward(float* out, const float* inp, int64_t N) = 0;
  // Extra training loss of the last forward (MoE load balancing), already in the returned loss's
  // units; its gradient is added by backward. 0 for the dense layer.
  virtual float aux_loss() const { return 0.0f; }
  virtual int64_t parameter_bytes() const = 0;
  // Activation checkpointing (model/trainable_llama.h set_recompute): frees what forward saved for backward
  // (a later forward on the same input saves it again). The MoE layer keeps its buffers (no-op).
  virtual void release_activations() {}
  // Bytes of what forward keeps for backward (allocated capacity).
  virtual int64_t activation_bytes() const { return 0; }
};

// A feed-forward over f32 weights it can train: forward's backward and the parameters.
class TrainableFeedForward : public FeedForward {
 public:
  // dinp[N, C] += ... (mirrored); parameter grads +=. Follows forward on the same inp and N.
  virtual void backward(float* dinp, const float* dout, const float* inp, int64_t N) = 0;
  // This device's parameters (grads allocated).
  virtual std::vector<ParamRef> parameters() = 0;
  // Collective: every parameter's full tensor, by name (for saving).
  virtual std::vector<std::pair<std::string, tensor::Tensor>> gather_full() = 0;

  // Sequence parallel (nn/sequence_parallel.h, model/trainable_llama.h set_sequence_parallel): inp, out,
  // dinp and dout are this device's rows [NL, C] of the N rows (dist::even_split over the tensor
  // group); N is the full count. The dense layer only: the default throws.
  virtual bool supports_sequence_split() const { return false; }
  virtual void forward_sequence_split(float* out, const float* inp, int64_t N);
  virtual void backward_sequence_split(float* dinp, const float* dout, const float* inp, int64_t N);
};

// The dense SwiGLU's buffers, in floats, for N rows and FL hidden rows: forward saves h13 [N, 2*FL]
// and g [N, FL], backward's scratch is dg [N, FL] and dh13 [N, 2*FL]. The layers size them from
// here; model/block_activations.h counts them.
struct SwiGluActivationSizes {
  int64_t h13 = 0, g = 0, dg = 0, dh13 = 0;
  int64_t total() const { return h13 + g + dg + dh13; }
};
SwiGluActivationSizes swiglu_activation_sizes(int64_t N, int64_t FL);

// The dense SwiGLU feed-forward: w2(silu(w1 x) * w3 x).
//   w1|w3: one AllToShardedLinear with two segments (rows FL of each) -> h13[N, 2*FL]
//   w2:    ShardedToAllLinear over FL columns -> all_sum -> out[N, C]
// Communication: one all_sum of [N, C] in forward, one in backward. Sequence split: w1|w3 is an
// all_gather_matmul and w2 a matmul_reduce_scatter (nn/collective_matmul.h); backward their
// transposes (nn/sequence_parallel.h).
class SwiGluFeedForward : public TrainableFeedForward {
 public:
  // w1, w3: [FL, C]; w2: [C, FL]; prefix: "layers.3."; ffn_ranges: every member's FL rows of F.
  SwiGluFeedForward(tensor::Tensor w1, tensor::Tensor w3, tensor::Tensor w2, dist::Group group, std::string prefix,
                    std::vector<dist::Range> ffn_ranges, int64_t hidden_dim);

  void forward(float* out, const float* inp, int64_t N) override;
  void backward(float* dinp, const float* dout, const float* inp, int64_t N) override;
  std::vector<ParamRef> parameters() override;
  std::vector<std::pair<std::string, tensor::Tensor>> gather_full() override;
  int64_t parameter_bytes() const override;
  void release_activations() override;
  int64_t activation_bytes() const override;
  bool supports_sequence_split() const override { return true; }
  void forward_sequence_split(float* out, const float* inp, int64_t N) override;
  void backward_sequence_split(float* dinp, const float* dout, const float* inp, int64_t N) override;
  // The two products, for freezing and adapting them (nn/lora.h).
  AllToShardedLinear& gate_up() { return w13_; }  // parts: w1, w3
  ShardedToAllLinear& down() { return w2_; }

 private:
  AllToShardedLinear w13_;  // parts: w1 [FL, C], w3 [FL, C]
  ShardedToAllLinear w2_;   // [C, FL]
  dist::Group group_;
  std::string prefix_;
  std::vector<dist::Range> ffn_ranges_;
  int64_t hidden_dim_;
  std::vector<float> h13_;  // [N, 2*FL] saved
  std::vector<float> g_;    // [N, FL] saved
  std::vector<float> dg_;   // [N, FL] scratch
  std::vector<float> dh13_; // [N, 2*FL] scratch
};

// The same SwiGLU over frozen packed weights (quantized or 16-bit checkpoints). Inference runs
// forward only; QLoRA trains adapters around it (set on gate_up() and down(), nn/lora.h) and needs
// its input gradient: with keep_activations(true), forward keeps h13 [N, 2*FL] and g [N, FL] and
// backward gives dinp and the adapters' gradients (no weight gradients: the packed weights are
// frozen, so parameters() is empty: the trainer binds the adapters).
// Communication: forward one all_sum of [N, C] (w2); backward one all_sum of [N, C] (w13's dinp),
// none in w2's.
class QuantizedSwiGluFeedForward : public TrainableFeedForward {
 public:
  // w13: parts w1 [FL, C], w3 [FL, C]; w2: [C, FL].
  QuantizedSwiGluFeedForward(QuantizedAllToShardedLinear w13, QuantizedShardedToAllLinear w2);

  void forward(float* out, const float* inp, int64_t N) override;
  // dinp[N, C] += the input gradient of out for dout[N, C] (both mirrored), after forward on the
  // same N with keep_activations(true) (std::logic_error otherwise). A collective. No trained
  // adapters (they need inp: the overload below).
  void backward(float* dinp, const float* dout, int64_t N);
  // The same and the trained adapters' gradients; inp[N, C] is forward's input.
  void backward(float* dinp, const float* dout, const float* inp, int64_t N) override;
  std::vector<ParamRef> parameters() override { return {}; }  // frozen
  std::vector<std::pair<std::string, tensor::Tensor>> gather_full() override { return {}; }
  // Off (inference): forward's h13 and g live in a per-thread scratch shared by every layer.
  void keep_activations(bool on);
  int64_t parameter_bytes() const override;
  void release_activations() override;
  int64_t activation_bytes() const override;
  // The two products, for adapting them (nn/lora.h).
  QuantizedAllToShardedLinear& gate_up() { return w13_; }  // parts: w1, w3
  QuantizedShardedToAllLinear& down() { return w2_; }

  int64_t hidden_local() const { return w2_.in_features(); }  // FL
  int w2_lanes() const { return w2_.lanes(); }
  // LoRA adapters, unmerged (nn/quantized_lora.h): w13 over h13's columns (w1 at 0, w3 at FL; ld 2*FL),
  // w2 with the base's lanes (its own all_sum of [N, r] after the base's).
  void set_lora(LoraAllToSharded w13, std::optional<LoraShardedToAll> w2);

 private:
  QuantizedAllToShardedLinear w13_;
  QuantizedShardedToAllLinear w2_;
  bool keep_ = false;
  std::vector<float> h13_;  // [N, 2*FL] saved by forward when keep_
  std::vector<float> g_;    // [N, FL] saved by forward when keep_ (the input of w2's adapter)
  LoraAllToSharded w13_lora_;
  std::optional<LoraShardedToAll> w2_lora_;
};

}  // namespace tpcli::nn
