// tpcli::model — the sizes of what one block's training forward keeps for its backward (and what the
// forward keeps after the blocks), from the dims alone: TrainableLlama::block_forward and train_forward size
// their buffers from block_activation_sizes and head_activation_sizes and train/memory.h counts with
// them, so the two cannot drift.
//
// Dimension legend: B batch, T time, N = B*T rows, R residual rows (N, or this device's NL of the N
// under sequence parallelism: dist::even_split over the tensor group), C dim, NH_L this device's
// query heads, QL/KVL its q/kv rows, FL its ffn rows.
#pragma once

#include <cstdint>

#include "model/llama_config.h"
#include "model/shard_plan.h"

namespace tpcli::model {

// Floats of each buffer of one block (the names of Llama's per-layer activations).
struct BlockActivationSizes {
  int64_t rows = 0;   // R
  int64_t x_in = 0;   // [R, C] the block's input: kept for every block, also under recompute
  int64_t xn1 = 0;    // [R, C] attention_norm output
  int64_t rstd1 = 0;  // [R]
  int64_t qk_in = 0;    // [N, QL+KVL] q and k before their norms (Qwen3's q/k norms; else 0)
  int64_t qk_rstd = 0;  // [N, NH_L+NKV_L] their 1/rms (q/k norms; else 0)
  int64_t qkv = 0;    // [N, QL+2KVL] after RoPE
  int64_t att = 0;    // [B, NH_L, T, T] softmax probabilities
  int64_t y = 0;      // [N, QL] attention output (wo input)
  int64_t xm = 0;     // [R, C] residual after attention
  int64_t xn2 = 0;    // [R, C] ffn_norm output
  int64_t rstd2 = 0;  // [R]
  int64_t tmp = 0;    // [R, C] scratch the blocks share (the model's, counted once)
  // The dense feed-forward's own buffers (nn::swiglu_activation_sizes: saved and backward scratch);
  // 0 for a MoE model, whose expert buffers are not counted.
  int64_t ffn = 0;
  // What the block saves besides its input and the feed-forward: xn1 .. rstd2.
  int64_t saved() const { return xn1 + rstd1 + qk_in + qk_rstd + qkv + att + y + xm + xn2 + rstd2; }
};

// What the training forward keeps after the blocks, for the final norm, classifier and loss.
struct HeadActivationSizes {
  int64_t x_final = 0;  // [R, C] residual stream after the last block
  int64_t xf = 0;       // [N, C] final norm output (all rows: the classifier's input)
  int64_t rstdf = 0;    // [R]
  int64_t probs = 0;    // [N, VL] softmax over this device's vocabulary rows
  int64_t losses = 0;   // [N]
  int64_t total() const { return x_final + xf + rstdf + probs + losses; }
};

// Block sizes on the device with shard plan `plan`, for B sequences of T; sequence_parallel: the
// residual stream is split by rows over the plan's devices (TrainableLlama::set_sequence_parallel).
BlockActivationSizes block_activation_sizes(const LlamaConfig& config, const ShardPlan& plan, int B, int T,
                                            bool sequence_parallel);
// The same for the head (the blocks' scratch tmp is BlockActivationSizes').
HeadActivationSizes head_activation_sizes(const LlamaConfig& config, const ShardPlan& plan, int B, int T,
                                          bool sequence_parallel);

}  // namespace tpcli::model
