// tpcli::nn — causal grouped-query attention (the part between the QKV projection and wo).
//
// Dimension legend: B batch, T time, S cache positions, NH query heads (this device's),
// NKV kv heads (this device's), HS head size, QL = NH*HS, KVL = NKV*HS.
// Query head h reads kv head kv_of[h] (local indices; given by the shard planner).
//
// Layout: the fused projection output qkv[N, QL + 2*KVL] holds per row q (QL) | k (KVL) | v (KVL),
// already rotated by RoPE. Scores are q.k / sqrt(HS), softmax over positions <= t (causal).
#pragma once

#include <cstdint>
#include <span>

namespace tpcli::nn {

struct AttentionShape {
  int heads = 0;     // NH (local)
  int kv_heads = 0;  // NKV (local)
  int head_size = 0; // HS
  std::span<const int> kv_of;  // [NH] local kv head of each local query head
  int64_t q_dim() const { return int64_t(heads) * head_size; }
  int64_t kv_dim() const { return int64_t(kv_heads) * head_size; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// Training / batched: out[B*T, QL]; att[B, NH, T, T] saves the softmax probabilities (entries
// with t2 > t are left zero).
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, const AttentionShape& s);
// dqkv[B*T, QL+2*KVL] += ...; needs the forward's qkv and att.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                        const AttentionShape& s);

// Decode at position pos: q[QL]; k_cache, v_cache: [S, KVL] with rows 0..pos filled;
// out[QL]; att_scratch[pos + 1]. llama2.c's operation order.
void attention_decode(float* out, float* att_scratch, const float* q, const float* k_cache, const float* v_cache,
                      int pos, const AttentionShape& s);

}  // namespace tpcli::nn
