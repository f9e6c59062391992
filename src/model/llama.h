// tpcli::model — one tensor-parallel device's shard of a Llama model: decode, batched training
// forward/backward, parameters.
//
// Dimension legend: B batch, T time, N = B*T rows, C dim, V vocab, S seq_len, L layers,
// NH/NKV query/kv heads, HS head size; *_L = this device's part (QL = NH_L*HS, KVL = NKV_L*HS,
// FL ffn rows, VL vocab rows). Which part is this device's: model/shard_plan.h.
//
// Sharding (MLX's Llama recipe), per block:
//   x -[attention_norm]-> AllToSharded(wq|wk|wv) -> RoPE, attention on local heads
//     -> ShardedToAll(wo) (all_sum) -> + x
//   x -[ffn_norm]-> FeedForward (dense: AllToSharded(w1|w3), SwiGLU, ShardedToAll(w2); or MoE) -> + x
// then final norm -> classifier split by vocabulary rows (AllToSharded) -> logits gathered
// (all_gather_v) in decode, or a vocab-split cross-entropy in training.
// The token embedding is split by vocabulary rows too (nn::VocabParallelEmbedding: a lookup is one
// all_gather_v of the rows' owners); a tied classifier is the same rows. Replicated parameters
// (norms) get identical gradients on every device.
//
// Inference runs P tokens at positions pos..pos+P-1 in one pass: P = 1 is decode (matrix-vector
// products, llama2.c's operation order), P > 1 a batched prefill (gemm through BLIS, attention over
// the KV cache two gemms per head); both fill the KV cache at those positions.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "distributed/group.h"
#include "model/llama_config.h"
#include "model/shard_plan.h"
#include "model/weights.h"
#include "nn/embedding.h"
#include "nn/feed_forward.h"
#include "nn/linear.h"
#include "nn/moe.h"
#include "nn/quantized_linear.h"
#include "nn/rope.h"
#include "tensor/packed_matrix.h"
#include "tensor/tensor.h"

namespace tpcli::model {

class Llama {
 public:
  // Copies only this device's slices of each tensor. tensor_group: the devices that split the weights.
  // expert_group (MoE only): the devices the experts are dealt out over, each with its own tokens
  // (nn/moe.h; the mesh's expert axis, by default the data axis). Size 1: every expert here.
  // With a MoE model, every forward is a collective over the expert group as well.
  Llama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group = {});
  // The same, built inside a tensor::HugePageArena: every weight that decode streams lies back to
  // back on 2 MB pages, however its matrices were cut. Inference only: training steps ran slower
  // with the model built this way, for a cause not yet found (BENCHMARKS.md, Kernel design notes).
  static Llama for_inference(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group = {});
  ~Llama();
  Llama(Llama&&) noexcept;
  Llama& operator=(Llama&&) noexcept;

  const LlamaConfig& config() const { return config_; }
  const ShardPlan& plan() const { return plan_; }
  // Whether the weights are packed (quantized or 16-bit, WeightSource::stored()): they stay in that
  // format on the device (nn/quantized_linear.h) and the model is inference-only (training throws).
  bool frozen() const { return frozen_; }

  // Decode one token at position pos (0 <= pos < seq_len), filling the KV cache at pos.
  // Returns the logits [V], full vocabulary on every device (valid until the next call).
  std::span<const float> forward(int token, int pos);
  // Like forward, but only the greedy token: each device's local argmax, reduced across devices
  // (moves 2 floats per device instead of the logits). Ties go to the lowest token id; -1 (on
  // every device) when any device's logits are not finite.
  int forward_argmax(int token, int pos);

  // Batched prefill: tokens[P] at positions pos..pos+P-1 in one pass, filling the KV cache there
  // (pos + P <= seq_len; pos > 0 continues a sequence, e.g. a chat turn). Returns the logits [V] of
  // the last position: what feeding the tokens one by one through forward() returns last, up to
  // float rounding (gemm sums in another order than the decode kernels).
  std::span<const float> prefill(std::span<const int> tokens, int pos);
  // The greedy token after the last position, as forward_argmax.
  int prefill_argmax(std::span<const int> tokens, int pos);
  // Logits [P, V] of every position (tests, scoring a prompt).
  std::vector<float> prefill_logits(std::span<const int> tokens, int pos);

  // Training. tokens/targets: [B*T] (B sequences of T, T <= seq_len). Returns the mean
  // cross-entropy over the B*T targets; accumulates (+=) every parameter's grad.
  float forward_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T);
  // Activation checkpointing: forward_backward keeps only each block's input and recomputes the
  // block's activations during backward (the same arithmetic, so the same gradients bit for bit;
  // the block's collectives run again). Off by default.
  void set_recompute(bool on) { recompute_ = on; }
  // Sequence parallelism (Megatron-LM's; nn/sequence_parallel.h): in forward_backward and loss the
  // residual stream and the norms hold this device's rows of the B*T token rows (dist::even_split
  // over the tensor group, batch-major) instead of all of them. wq|wk|wv and w1|w3 become
  // all_gather_matmuls, wo and w2 matmul_reduce_scatters (their backwards the transposes), the
  // norms' weight gradients are summed over the group. Embedding: the lookup as before, then each
  // device keeps its rows (backward: dx all-gathered first). Final norm on the rows, all-gathered
  // into the vocab-split classifier and loss (unchanged); the classifier's dx is reduce-scattered
  // instead of all-summed. Same losses and gradients, up to float summation order. Dense models
  // only (throws for MoE). Decode and prefill are unaffected.
  void set_sequence_parallel(bool on);
  // Largest activation memory held during the last forward_backward: what the forward saved for
  // the backward (Acts and the feed-forwards' buffers), not the backward's transient gradients.
  int64_t peak_activation_bytes() const { return peak_activation_bytes_; }
  // The same loss without gradients.
  float loss(std::span<const int> tokens, std::span<const int> targets, int B, int T);
  // Batched forward; returns logits [B*T, V] gathered on every device (tests, prompt checks).
  std::vector<float> forward_logits(std::span<const int> tokens, int B, int T);

  // The parameter table: one entry per parameter of llama_parameters (same order). The spec says
  // its name, full shape, how it is split (ShardPlan::range_of its sharded_dim) and whether it
  // decays; the table adds this device's tensors and where its gradient sits in grad_buffer().
  // The model's gathering (checkpoints), load_moments' slicing and the optimizer (train/param_table.h)
  // all read it.
  struct Parameter {
    const ParamSpec* spec;
    tensor::Tensor* value;    // this device's shard
    tensor::Tensor* grad;     // same shape as value: a view of grad_buffer() at grad_offset
    int64_t grad_offset = 0;  // in grad_buffer()
  };
  // Allocates the gradients (grad_buffer()) on first use. The pointers are this object's (a moved
  // model answers with its new members).
  std::vector<Parameter> parameters();
  // Every gradient of this device, one contiguous buffer [P_local], in the order the backward
  // finishes them: the classifier and the final norm, the blocks from the last to the first, the
  // token embedding; then the expert weights (nn/moe.h), which the data axis does not average.
  std::span<float> grad_buffer();
  // Training: forward_backward calls ready(end) each time grad_buffer()[0, end) holds its final
  // value for this call (after the classifier, after each block, after the embedding, at the end),
  // so a caller can start the data-parallel collectives of those gradients while backward goes on.
  // With replicated KV heads (wk/wv) or sequence parallelism (the norms) some gradients are summed
  // over the tensor group after the backward: then ready is called once, at the end. An empty
  // function turns it off.
  void set_gradients_ready(std::function<void(int64_t end)> ready) { gradients_ready_ = std::move(ready); }
  void zero_grad();
  // Collective over the tensor group: the full weights, for saving.
  TensorWeights gather_weights();
  // Collective: the full gradients, by parameter name (dense models; tests and diagnostics).
  TensorWeights gather_grads();

  int64_t parameter_bytes() const;  // this device's parameter values
  // MoE: per block, what the last forward (+ backward) routed and moved: per-expert token counts
  // over the expert group, drops, bytes (nn/moe.h). Empty for a dense model.
  std::vector<nn::MoeStats> moe_stats() const;
  // MoE gradient accumulation: per block, the load-balancing f_e of the whole accumulated batch
  // (nn::MoeFeedForward::set_batch_fraction); empty: each forward's own.
  void set_moe_batch_fractions(const std::vector<std::vector<float>>& per_block);
  int64_t kv_cache_bytes() const;   // this device's KV cache

 private:
  struct Layer;
  struct Acts;
  float train_forward(std::span<const int> tokens, std::span<const int> targets, int B, int T);
  // Block l on x_in[N, C] -> x_out[N, C], saving into a what its backward needs (a.x_in not set).
  void block_forward(size_t l, const float* x_in, float* x_out, int B, int T);
  void block_backward(size_t l, float* dx, int B, int T);  // dx[N, C]: d out -> d in, in place
  int64_t activation_bytes() const;
  void note_activation_bytes();
  // Whether the residual stream is split by rows: sequence parallel on more than one device.
  bool rows_split() const;
  // This device's rows of the N token rows: all of them, or its chunk when rows_split().
  dist::Range sequence_rows(int64_t N) const;
  std::vector<float> norm_grads() const;  // [(2L+1) * C] every RMSNorm weight's gradient
  // Sequence parallel: each device's norm gradients cover its rows only; sums this call's
  // contribution (now minus `before`) over the tensor group.
  void sum_norm_grads(const std::vector<float>& before);
  void train_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T);
  // The classifier's shard [VL, C]: the embedding's rows when shared, else the output rows.
  nn::Linear& classifier() { return config_.shared_classifier ? embedding_.rows() : output_; }
  // tokens[P] at pos.. through every block (KV cache filled); the residual stream is left in run_.x.
  void blocks_forward(std::span<const int> tokens, int pos);
  // blocks_forward, final norm and classifier of the last position: this device's logits [VL]
  // (logits_ itself on a lone device).
  float* last_logits_local(std::span<const int> tokens, int pos);
  std::span<const float> gather_logits(const float* local);  // [VL] split -> [V] mirrored
  int argmax_over_devices(const float* local);                // greedy token from [VL] split logits
  // Frozen models read the packed table (embedding_packed_, output_packed_) instead.
  void embed(float* x, std::span<const int> tokens);                   // x[N, C] rows of tokens[N]
  void classifier_forward(float* logits_local, const float* x, int64_t N);  // [N, VL]
  void load_packed_layers(const WeightSource& weights, std::vector<dist::Range> vocab_ranges);
  void require_trainable(const char* what) const;
  const ParamSpec& spec_of(const std::string& name) const;
  void sync_replicated_kv_grads(const std::vector<tensor::Tensor>& before);
  void ensure_grads();
  // The one place that says which member holds which parameter: (name, value, grad) in the order
  // backward finishes them (grad_buffer()'s order), each block's list ending at layer_ends.
  struct Held {
    std::string name;
    tensor::Tensor* value;
    tensor::Tensor* grad;
  };
  std::vector<Held> held_parameters(std::vector<size_t>& layer_ends);
  void lay_out_gradients();  // grad_buffer_, grad_offsets_ and the *_grads_end_ marks; grads become views
  // Tells gradients_ready_ (when set) that grad_buffer()[0, end) is final; with replicated KV heads
  // or split rows only the last call (after their sums) is passed on.
  void gradients_ready(int64_t end, bool last = false) const;
  // Collective over the tensor group: the full tensor of a parameter from every device's `local` shard.
  tensor::Tensor gather_parameter(const ParamSpec& spec, const float* local);
  TensorWeights gather(bool grads);

  LlamaConfig config_;
  std::vector<ParamSpec> specs_;
  dist::Group group_;
  dist::Group expert_group_;  // MoE: the experts are dealt out over it
  ShardPlan plan_;
  std::vector<ShardPlan> all_plans_;
  std::vector<int> kv_of_;  // [NH_L] local kv head of each local query head
  nn::RopeTable rope_;

  nn::VocabParallelEmbedding embedding_;  // [VL, C] this device's vocabulary rows
  tensor::Tensor norm_, norm_grad_;       // [C]
  nn::Linear output_;                     // [VL, C] unshared classifier rows (empty when shared)
  // Frozen (packed) models hold these instead of embedding_ and output_.
  bool frozen_ = false;
  nn::PackedVocabParallelEmbedding embedding_packed_;  // [VL, C] this device's rows; also the tied classifier
  nn::QuantizedAllToShardedLinear output_packed_;      // [VL, C] unshared classifier rows
  std::vector<Layer> layers_;

  // inference state, sized for the last P rows
  struct Run {
    std::vector<float> x, xb, xb2;  // [P, C]
    std::vector<float> qkv;         // [P, QL+2KVL]
    std::vector<float> y;           // [P, QL]
    std::vector<float> att;         // [P, pos+P] attention scratch
  } run_;
  std::vector<float> logits_local_, logits_;  // [VL], [V]
  std::vector<int64_t> vocab_counts_;         // [T] vocab rows of each device

  std::vector<float> grad_buffer_;      // [P_local], grad_buffer(); empty until the first parameters()
  std::vector<int64_t> grad_offsets_;   // [specs_.size()] each parameter's gradient in grad_buffer_
  // Where grad_buffer()'s final prefix ends after the classifier and final norm, after block l
  // ([L]), after the embedding (then the experts follow).
  int64_t head_grads_end_ = 0, dense_grads_end_ = 0;
  std::vector<int64_t> block_grads_end_;
  std::function<void(int64_t)> gradients_ready_;

  std::unique_ptr<Acts> acts_;  // training activations, sized for the last B*T
  bool recompute_ = false;
  bool sequence_parallel_ = false;
  int64_t peak_activation_bytes_ = 0;
};

}  // namespace tpcli::model
