// tpcli::model — what the two roles of a Llama shard share: the inference model (model/llama.h:
// packed or f32 weights, KV cache, decode and prefill) and the trainable one
// (model/trainable_llama.h: f32 parameters, gradients, activations; with LoRA, a packed frozen
// base loaded by the same packed loaders as the inference model's). Both are built on one
// LlamaCore: the config and its parameter specs, every device's shard plan, the local heads'
// attention shape, RoPE, and the slicing of a parameter's local part out of a full tensor.
//
// Dimension legend: N rows, C dim, V vocab, VL this device's vocabulary rows, QL/KVL its q/kv rows.
//
// Sharding (MLX's Llama recipe), per block:
//   x -[attention_norm]-> AllToSharded(wq|wk|wv) -> RoPE, attention on local heads
//     -> ShardedToAll(wo) (all_sum) -> + x
//   x -[ffn_norm]-> FeedForward (dense: AllToSharded(w1|w3), SwiGLU, ShardedToAll(w2); or MoE) -> + x
// then final norm -> classifier split by vocabulary rows (AllToSharded) -> logits gathered
// (all_gather_v) in decode, or a vocab-split cross-entropy in training.
// The token embedding is split by vocabulary rows too (nn::VocabParallelEmbedding: a lookup is one
// all_gather_v of the rows' owners); a tied classifier is the same rows. Which part is this
// device's: model/shard_plan.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "distributed/group.h"
#include "model/llama_config.h"
#include "model/shard_plan.h"
#include "model/weights.h"
#include "nn/attention.h"
#include "nn/feed_forward.h"
#include "nn/linear.h"
#include "nn/moe.h"
#include "nn/quantized_linear.h"
#include "nn/rope.h"
#include "tensor/tensor.h"

namespace tpcli::model {

// A block's attention linears in f32, this device's parts.
struct F32AttentionLinears {
  nn::AllToShardedLinear qkv;  // parts: wq [QL, C], wk [KVL, C], wv [KVL, C]
  nn::ShardedToAllLinear wo;   // [C, QL]
};

// What some architectures add to a block's q|k|v projection before RoPE: Qwen2's biases (this
// device's rows of bq|bk|bv, as the projection's output), Qwen3's RMSNorm of each q and k head.
struct QkvExtras {
  tensor::Tensor bias;            // [QL+2KVL]; empty: none
  tensor::Tensor q_norm, k_norm;  // [HS]; empty: none
};

struct LlamaCore {
  LlamaCore() = default;
  // tensor_group: the devices that split the weights; expert_group (MoE only): the devices the
  // experts are dealt out over (nn/moe.h). Validates the config. all_plans: every tensor device's
  // shard plan as a Placement made them for this config (model/placement.h); empty: planned here.
  LlamaCore(LlamaConfig config, dist::Group tensor_group, dist::Group expert_group, std::vector<ShardPlan> all_plans = {});

  LlamaConfig config;
  std::vector<ParamSpec> specs;  // llama_parameters(config)
  dist::Group group;             // tensor group
  dist::Group expert_group;
  std::vector<ShardPlan> all_plans;  // [TP] every device's
  ShardPlan plan;                    // this device's
  std::vector<int> kv_of;            // [NH_L] local kv head of each local query head
  nn::RopeTable rope;

  nn::AttentionShape attention_shape() const;
  nn::MoeSizes moe_sizes() const;  // a MoE block's (full FE, before any split)
  std::vector<dist::Range> vocab_ranges() const;  // [TP] every device's vocabulary rows
  const ParamSpec& spec(const std::string& name) const;
  // RoPE on q and k of qkv[N, QL+2KVL]: row n sits at position pos + n % period.
  void rope_forward(float* qkv, int64_t N, int pos, int64_t period) const;
  void rope_backward(float* dqkv, int64_t N, int64_t period) const;  // positions n % period
  void rope_rows(float* qkv, int64_t N, int pos, int64_t period, bool backward) const;  // either one
  // Collective over the tensor group: full logits [N, V] from every device's [N, VL] columns.
  std::vector<float> gather_vocab_columns(const float* local, int64_t N);
  // This device's part of parameter `name` (rows or columns by its spec's sharded dimension, the
  // whole of a replicated one), copied from the full tensor in `w`.
  tensor::Tensor local_slice(const WeightSource& w, const std::string& name) const;
  // The same for block parameter `key` ({3, Matrix::Wq}).
  tensor::Tensor block_slice(const WeightSource& w, BlockKey key) const;
  // Block l's f32 layers, this device's parts: both roles load f32 weights alike. The feed-forward
  // is the dense SwiGLU or, for a MoE config, the MoE layer (its experts over expert_group).
  F32AttentionLinears load_f32_attention(const WeightSource& w, int l) const;
  std::unique_ptr<nn::TrainableFeedForward> load_f32_feed_forward(const WeightSource& w, int l) const;
  // Block l's layers as stored (packed, or f32 as an f32 PackedMatrix), this device's parts: both
  // roles load packed weights alike (the inference model, and QLoRA's frozen base).
  // wq|wk|wv by rows; wo by the local heads' columns, in lanes of whole heads (a quantized wo
  // whose groups the heads cut is kept as this device's f32 slice); the dense SwiGLU, w1 and w3 by
  // this device's FFN rows, w2 by those columns, in lanes.
  nn::QuantizedAllToShardedLinear load_packed_qkv(const WeightSource& w, int l) const;
  nn::QuantizedShardedToAllLinear load_wo(const WeightSource& w, int l) const;
  std::unique_ptr<nn::QuantizedSwiGluFeedForward> load_dense_ffn(const WeightSource& w, int l) const;
  QkvExtras load_qkv_extras(const WeightSource& w, int l) const;  // empty tensors where the config has none
  // Applies `extras` in place to the projection's output qkv[N, QL+2KVL].
  void finish_qkv(float* qkv, int64_t N, const QkvExtras& extras) const;
};

// Rows r (or columns c) of parameter `name` [R, K] in its stored format.
nn::QuantizedLinear packed_rows(const WeightSource& w, const std::string& name, int64_t R, int64_t K, dist::Range r);
nn::QuantizedLinear packed_columns(const WeightSource& w, const std::string& name, int64_t R, int64_t K, dist::Range c);
// Rows r and columns c of `name` [R, K] in its stored format: where c cuts its quantization groups,
// the whole groups c touches (held_columns), c's input placed among zeros.
nn::QuantizedLinear packed_part(const WeightSource& w, const std::string& name, int64_t R, int64_t K, dist::Range r,
                                dist::Range c);
// The lanes of a ShardedToAll product's K input columns (nn/quantized_linear.h): their width, in
// whole `unit`s (lane_unit: and whole quantization groups of `name`), and whether columns r are a
// whole subtree of them (then the device computes its lanes alone, split-invariantly).
int64_t lane_width(int64_t K, int64_t unit);
bool whole_subtree(dist::Range r, int64_t width);
int64_t lane_unit(const WeightSource& w, const std::string& name, int64_t unit);

// The full values of `name` in `w`, checked to hold `expected` floats.
std::span<const float> checked_values(const WeightSource& w, const std::string& name, int64_t expected);

}  // namespace tpcli::model
