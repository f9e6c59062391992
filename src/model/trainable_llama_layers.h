// tpcli::model — the trainable model's per-block and head parameters, shared by its two source
// files (trainable_llama.cpp: forward and backward; trainable_lora.cpp: the adapters). Internal.
#pragma once

#include <memory>
#include <optional>
#include <variant>

#include "model/llama_core.h"
#include "model/trainable_llama.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/feed_forward.h"

namespace tpcli::model {

// A block's attention projections on a packed (frozen) base: QLoRA.
struct PackedAttentionLinears {
  nn::QuantizedAllToShardedLinear qkv;  // parts: wq [QL, C], wk [KVL, C], wv [KVL, C], as stored
  nn::QuantizedShardedToAllLinear wo;   // [C, QL] as stored, in lanes
};

// Qwen2's q/k/v biases and Qwen3's RMSNorm of each q and k head, between the q|k|v projection and
// RoPE, as the trainable model holds them (QkvExtras is the inference form): this device's rows of
// bq|bk|bv and the norms' gains (replicated). Parameters, unless LoRA freezes the base.
struct TrainableQkvExtras {
  tensor::Tensor bq, bk, bv, bq_grad, bk_grad, bv_grad;     // [QL], [KVL], [KVL]; empty: no biases
  tensor::Tensor q_norm, k_norm, q_norm_grad, k_norm_grad;  // [HS]; empty: no norms

  bool has_bias() const { return !bq.empty(); }
  bool has_norms() const { return !q_norm.empty(); }
  // qkv[N, QL+2KVL] += bq|bk|bv; then each q and k head normalised in place, its input kept in
  // qk_in[N, QL+KVL] and its 1/rms in qk_rstd[N, NH_L+NKV_L] for the backward.
  void forward(float* qkv, float* qk_in, float* qk_rstd, int64_t N, const nn::AttentionShape& shape, float eps) const;
  // dqkv[N, QL+2KVL]: the gradient after the norms becomes the gradient before the biases, in place.
  // Unless `frozen`, adds to the parameters' gradients; a norm's gain serves every head, so each
  // device's part (its heads) is summed over the tensor group.
  void backward(float* dqkv, const float* qk_in, const float* qk_rstd, int64_t N, const nn::AttentionShape& shape,
                bool frozen, dist::Group& group);
  int64_t bytes() const;  // the values', f32
};

struct TrainableLlama::Layer {
  tensor::Tensor attention_norm, attention_norm_grad;  // [C]
  TrainableQkvExtras qkv_extras;
  tensor::Tensor ffn_norm, ffn_norm_grad;              // [C]
  // f32 (training, LoRA) or packed (QLoRA); both kinds have the same forward, backward(dinp, dout,
  // inp, N), set_adapter and adapter, so the block's code visits whichever it holds.
  std::variant<F32AttentionLinears, PackedAttentionLinears> linears;
  // nn::SwiGluFeedForward or nn::MoeFeedForward (f32), nn::QuantizedSwiGluFeedForward (packed)
  std::unique_ptr<nn::TrainableFeedForward> ffn;

  F32AttentionLinears& f32() { return std::get<F32AttentionLinears>(linears); }
  template <class F>
  decltype(auto) visit(F&& f) { return std::visit(std::forward<F>(f), linears); }
};

struct TrainableLlama::Head {
  nn::VocabParallelEmbedding embedding;  // [VL, C] this device's vocabulary rows (f32 base)
  tensor::Tensor norm, norm_grad;                // [C]
  nn::Linear output;                     // [VL, C] unshared classifier rows (empty when shared)
  bool tied = false;
  // QLoRA: the embedding and the unshared classifier as stored (frozen); the f32 ones stay empty.
  std::optional<nn::PackedVocabParallelEmbedding> packed_embedding;  // [VL, C]
  nn::QuantizedLinear packed_output;                                 // [VL, C]

  // The classifier's shard [VL, C] (f32 base): the embedding's rows when shared, else the output rows.
  nn::Linear& classifier() { return tied ? embedding.rows() : output; }
  // x[N, C] (mirrored) = the rows of tokens[N].
  void embed(float* x, std::span<const int> tokens) {
    if (packed_embedding) packed_embedding->forward(x, tokens);
    else embedding.forward(x, tokens);
  }
  // logits_local[N, VL] = x[N, C] @ W_cls^T.
  void classify(float* logits_local, const float* x, int64_t N) {
    if (!packed_embedding) return classifier().forward(logits_local, x, N);
    const int64_t VL = packed_embedding->local_range().count;
    if (tied) packed_embedding->rows().matmul(logits_local, x, N, 0, VL, VL);
    else packed_output.forward(logits_local, x, N);
  }
  // dx[N, C] += dlogits[N, VL] @ W_cls (partial: the caller sums it); dW_cls += dlogits^T x unless frozen.
  void classify_backward(float* dx, const float* dlogits, const float* x, int64_t N) {
    if (!packed_embedding) return classifier().backward(dx, dlogits, x, N);
    if (tied) packed_embedding->rows().transposed_product(dx, dlogits, N, 1.0f);
    else packed_output.backward(dx, dlogits, N);
  }
};

}  // namespace tpcli::model
