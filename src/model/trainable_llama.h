// tpcli::model — the trainable model: one tensor-parallel device's shard of a Llama model in f32,
// its batched training forward and backward, its gradients and saved activations. Built on the
// same core as the inference model (model/llama_core.h: the sharding recipe, shard plans, RoPE).
//
// QLoRA: with LoRA options, a packed (quantized or 16-bit) checkpoint is taken too, and its base
// stays packed: each block holds either the f32 linears (nn/linear.h) or their packed twins
// (nn/quantized_linear.h, loaded by LlamaCore as the inference model loads them: the same rows,
// lanes and formats), one std::variant per block's attention projections, and the packed SwiGLU
// (nn::QuantizedSwiGluFeedForward) as its TrainableFeedForward; the embedding and classifier stay
// as stored too (the head's packed_embedding / packed_output), the norms f32. The two kinds of
// linear have the same interface, so a block's forward and backward visit whichever it holds. The
// adapters are f32 and the same on either base (nn/lora.h's functions, the same specs, names,
// binding and collectives); the input gradients go through the packed weights
// (tensor::PackedMatrix::transposed_product), never an f32 copy of them. Without LoRA a packed
// checkpoint is refused: full fine-tuning needs f32 weights.
//
// Dimension legend: B batch, T time, N = B*T rows, C dim, V vocab, L layers; *_L = this device's
// part. Replicated parameters (norms) get identical gradients on every device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distributed/group.h"
#include "model/llama_core.h"
#include "model/parameter_binding.h"
#include "model/weights.h"
#include "nn/moe.h"

namespace tpcli::model {

struct TrainableQkvExtras;

// LoRA fine-tuning (nn/lora.h): the base frozen, adapters on the named linears of the last blocks.
// The adapters are the model's only parameters: they alone get gradients, an optimizer and a
// checkpoint; each is named "layers.L.wq.lora_a" [r, IN] / "layers.L.wq.lora_b" [OUT, r].
struct LoraOptions {
  int rank = 8;
  double alpha = 16;  // scale = alpha / rank
  std::vector<std::string> targets = {"wq", "wk", "wv", "wo", "w1", "w3", "w2"};  // tpcli's names of the linears
  int last_layers = 0;  // adapt the last N blocks; 0 = every block
  uint64_t seed = 0;    // A's initialisation (B starts at zero, so the model starts unchanged), dropout's masks
  double dropout = 0;   // on the adapters' inputs in forward_backward (nn/lora.h), in [0, 1)
};
// The adapters' specs, A then B for each adapted linear, blocks from the last (the order backward
// finishes them): A [r, IN] replicated and B [OUT, r] split by rows on AllToSharded linears, A split
// by columns and B replicated on ShardedToAll ones (nn/lora.h). Throws std::invalid_argument for
// options the model cannot take (MoE, rank < 1, more layers than it has, an unknown target).
std::vector<ParamSpec> lora_parameters(const LlamaConfig& config, const LoraOptions& options);

class TrainableLlama {
 public:
  // Copies only this device's slices of each tensor (see Llama's constructor). With `lora`, the
  // base is frozen and only the adapters train (dense models, whole rows); the base may then be
  // packed (QLoRA, above). Throws std::invalid_argument for packed weights without `lora`.
  TrainableLlama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group = {},
                 std::optional<LoraOptions> lora = std::nullopt);
  ~TrainableLlama();
  TrainableLlama(TrainableLlama&&) noexcept;
  TrainableLlama& operator=(TrainableLlama&&) noexcept;

  const LlamaConfig& config() const { return core_.config; }
  const ShardPlan& plan() const { return core_.plan; }

  // tokens/targets: [B*T] (B sequences of T, T <= seq_len). Returns the mean cross-entropy over
  // the B*T targets; accumulates (+=) every parameter's grad. A target of -1 (nn::IGNORED_TARGET)
  // is not counted. loss_divisor: the cross-entropy is the sum over the counted targets divided by
  // it (its gradient too) instead of their mean, so that micro-batches and data ranks add up to
  // the mean over a whole step's counted targets (train/sft_batches.h); the MoE auxiliary loss is
  // added as before.
  float forward_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T,
                         std::optional<double> loss_divisor = std::nullopt);
  // The same loss without gradients.
  float loss(std::span<const int> tokens, std::span<const int> targets, int B, int T,
             std::optional<double> loss_divisor = std::nullopt);
  // Batched forward; returns logits [B*T, V] gathered on every device (tests, prompt checks).
  std::vector<float> forward_logits(std::span<const int> tokens, int B, int T);

  // Activation checkpointing: forward_backward keeps only each block's input and recomputes the
  // block's activations during backward (the same arithmetic, so the same gradients bit for bit;
  // the block's collectives run again). Off by default.
  void set_recompute(bool on) { recompute_ = on; }
  // Sequence parallelism (Megatron-LM's; nn/sequence_parallel.h): the residual stream and the
  // norms hold this device's rows of the B*T token rows (dist::even_split over the tensor group,
  // batch-major) instead of all of them. wq|wk|wv and w1|w3 become all_gather_matmuls, wo and w2
  // matmul_reduce_scatters (their backwards the transposes), the norms' weight gradients are
  // summed over the group. Embedding: the lookup as before, then each device keeps its rows
  // (backward: dx all-gathered first). Final norm on the rows, all-gathered into the vocab-split
  // classifier and loss (unchanged); the classifier's dx is reduce-scattered instead of
  // all-summed. Same losses and gradients, up to float summation order. Dense models only.
  void set_sequence_parallel(bool on);
  // Largest activation memory held during the last forward_backward: what the forward saved for
  // the backward (activations and the feed-forwards' buffers), not the backward's transient gradients.
  int64_t peak_activation_bytes() const { return peak_activation_bytes_; }

  // Whether the model trains LoRA adapters on a frozen base (then parameters() are the adapters).
  bool lora() const { return lora_.has_value(); }
  // LoRA dropout's masks for the next forward_backward calls: `pass` names the pass (the step; 0 =
  // no dropout), `first_row` is the global index of the call's first token row (so every mesh
  // draws the same masks). loss() and forward_logits() never drop.
  void set_dropout_pass(uint64_t pass, int64_t first_row) { dropout_pass_ = {pass, first_row}; }

  // Every parameter of llama_parameters (same order), or every adapter's A and B with LoRA: its spec (name, full shape, how it is split,
  // whether it decays), this device's tensors and where its gradient sits in grad_buffer().
  const std::vector<Parameter>& parameters() const { return binding_.parameters(); }
  // Every gradient of this device, one contiguous buffer [P_local], in the order the backward
  // finishes them: the classifier and the final norm, the blocks from the last to the first, the
  // token embedding; then the expert weights (nn/moe.h), which the data axis does not average.
  std::span<float> grad_buffer() { return binding_.buffer(); }
  // forward_backward calls ready(end) each time grad_buffer()[0, end) holds its final value for
  // this call (after the classifier, after each block, after the embedding, at the end), so a
  // caller can start the data-parallel collectives of those gradients while backward goes on.
  // With replicated KV heads (wk/wv) or sequence parallelism (the norms) some gradients are summed
  // over the tensor group after the backward: then ready is called once, at the end. An empty
  // function turns it off.
  void set_gradients_ready(std::function<void(int64_t end)> ready) { gradients_ready_ = std::move(ready); }
  void zero_grad();
  // This device's part of every parameter of parameters() (the adapters, with LoRA), sliced from
  // the full tensor `prefix + name` in `full` (a checkpoint's weights or optimizer moments). Throws
  // naming a parameter that is missing or of another shape. Not for expert weights (nn/moe.h deals them).
  std::vector<tensor::Tensor> local_parts(const WeightSource& full, const std::string& prefix = "") const;
  // Sets every parameter to local_parts(full) (a resumed or loaded adapter).
  void load_parameters(const WeightSource& full);
  // Collective over the tensor group: the full weights (with LoRA: the adapters), for saving.
  TensorWeights gather_weights();
  // Collective: the full gradients, by parameter name (dense models; tests and diagnostics).
  TensorWeights gather_grads();

  int64_t parameter_bytes() const;  // this device's parameter values (with LoRA: the adapters)
  // With LoRA, this device's bytes of the frozen base as it holds them (packed matrices as stored,
  // f32 norms); 0 without LoRA (everything is a parameter).
  int64_t frozen_bytes() const;
  // MoE: per block, what the last forward (+ backward) routed and moved: per-expert token counts
  // over the expert group, drops, bytes (nn/moe.h). Empty for a dense model.
  std::vector<nn::MoeStats> moe_stats() const;
  // MoE gradient accumulation: per block, the load-balancing f_e of the whole accumulated batch
  // (nn::MoeFeedForward::set_batch_fraction); empty: each forward's own.
  void set_moe_batch_fractions(const std::vector<std::vector<float>>& per_block);

 private:
  struct Layer;
  struct Head;
  struct Acts;
  void bind_parameters();
  void load_packed_head(const WeightSource& weights);  // QLoRA: the embedding and classifier as stored
  TrainableQkvExtras load_qkv_extras(const WeightSource& weights, int l) const;  // block l's biases, q/k norms
  // LoRA (model/trainable_lora.cpp): the adapters' specs and tensors, the base frozen.
  void add_adapters(const LoraOptions& options);
  void bind_adapters();
  // The adapter of `target` (Matrix::Wq, ..., Matrix::W2) in layer l, or null.
  nn::LoraAdapter* adapter(size_t l, Matrix target);
  // Sets every adapter's pass (nn::LoraAdapter pass_seed, row_offset).
  void set_adapter_pass(uint64_t seed, int64_t row_offset);
  float train_forward(std::span<const int> tokens, std::span<const int> targets, int B, int T);
  // Block l on x_in[N, C] -> x_out[N, C], saving what its backward needs (the block's x_in is the caller's).
  void block_forward(size_t l, const float* x_in, float* x_out, int B, int T);
  void block_backward(size_t l, float* dx, int B, int T);  // dx[N, C]: d out -> d in, in place
  // The classifier and the final norm's backward: dx[R, C] of the residual stream after the blocks.
  std::vector<float> head_backward(std::span<const int> targets, int B, int T);
  void train_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T);
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
  // The gradients whose rows are KV rows, layer after layer: wk's and wv's, or with LoRA their
  // adapters' B.
  std::vector<tensor::Tensor*> kv_row_grads();
  std::vector<tensor::Tensor> kv_grads();  // copies of kv_row_grads()
  void sync_replicated_kv_grads(const std::vector<tensor::Tensor>& before);
  // Tells gradients_ready_ (when set) that grad_buffer()[0, end) is final; with replicated KV heads
  // or split rows only the last call (after their sums) is passed on.
  void gradients_ready(int64_t end, bool last = false) const;
  // Collective over the tensor group: the full tensor of a parameter from every device's `local` shard.
  tensor::Tensor gather_parameter(const ParamSpec& spec, const float* local);
  TensorWeights gather(bool grads);

  LlamaCore core_;
  std::optional<LoraOptions> lora_;
  std::vector<ParamSpec> lora_specs_;  // with LoRA: the adapters', in binding order
  std::vector<nn::LoraAdapter*> adapters_;  // with LoRA: every adapter, in lora_specs_ order (bind_adapters)
  std::pair<uint64_t, int64_t> dropout_pass_{0, 0};  // set_dropout_pass
  std::unique_ptr<Head> head_;  // embedding, final norm, classifier (on the heap: the binding points into it)
  std::vector<Layer> layers_;
  ParameterBinding binding_;
  std::function<void(int64_t)> gradients_ready_;

  std::optional<double> loss_divisor_;  // of the forward_backward / loss call under way
  std::unique_ptr<Acts> acts_;  // training activations, sized for the last B*T
  bool recompute_ = false;
  bool sequence_parallel_ = false;
  int64_t peak_activation_bytes_ = 0;
};

}  // namespace tpcli::model
