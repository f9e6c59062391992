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
#include <optional>
#include <span>
#include <string_view>

#include "tensor/kv_products.h"

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

// Training / batched: out[B*T, QL]; att[B, NH, T, T] saves the softmax probabilities. Rows go in
// blocks of 64: row t's entries are written up to the end of its block (zero for t2 > t), the
// rest of the row is not written and not read by the backward.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, const AttentionShape& s);
// dqkv[B*T, QL+2*KVL] += ...; needs the forward's qkv and att.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                        const AttentionShape& s);

// The element type of a KV cache: f32, or bf16 / f16 rounded to nearest even as keys and values
// are written and widened to f32 (exactly) as attention reads them.
using KvDtype = tensor::KvElement;
int kv_dtype_bytes(KvDtype dtype);         // 4 or 2
const char* kv_dtype_name(KvDtype dtype);  // "f32", "bf16", "f16"
std::optional<KvDtype> kv_dtype_from_name(std::string_view name);

// Where one sequence's keys and values lie in a KV cache of blocks: position t is row
// t % block_size of block blocks[t / block_size], and block b's rows start at element
// b * block_size * KVL of k (v likewise), elements of `dtype`. A contiguous cache [S, KVL] is one
// block of S positions.
struct KvBlocks {
  void* k = nullptr;
  void* v = nullptr;
  std::span<const int32_t> blocks;
  int64_t block_size = 0;
  KvDtype dtype = KvDtype::F32;
  bool contiguous() const { return blocks.size() == 1; }
};

// Decode at position pos: q[QL]; kv with positions 0..pos filled; out[QL]. Per head: the scores
// (tensor/kv_products.h's sequence), llama2.c's softmax, the values weighed in position order,
// wherever the blocks lie.
void attention_decode(float* out, const float* q, const KvBlocks& kv, int pos, const AttentionShape& s);

// Inference over a KV cache, P rows at positions pos..pos+P-1 (a prompt, or one decode step):
// qkv[P, QL+2*KVL] after RoPE. Writes each row's k and v into the cache at its position (rounded
// to the cache's dtype), then out[P, QL]: row n attends to cache positions 0..pos+n (causal; rows
// before pos must already be filled). Each row gets attention_decode's bits, whatever the other
// rows and however a prompt is cut into calls, while the rows of a call share every key and value
// they read (kv_products.h's tiles).
void attention_cached(float* out, const float* qkv, const KvBlocks& kv, int pos, int64_t P, const AttentionShape& s);

}  // namespace tpcli::nn
