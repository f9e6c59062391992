// tpcli::formats — where each tpcli parameter (llama_parameters) lives among a Hugging Face
// directory's tensors, architecture by architecture, and the RoPE row order of q/k projections.
//
// Per block {i}, under model.layers.{i}. (Llama, Mistral, Qwen2, Qwen3; the others differ below):
//   input_layernorm.weight                attention_norm
//   self_attn.{q,k,v,o}_proj.weight       w{q,k,v,o}
//   self_attn.{q,k,v}_proj.bias           b{q,k,v} (Qwen2)
//   self_attn.{q,k}_norm.weight           {q,k}_norm (Qwen3, Qwen3-MoE)
//   post_attention_layernorm.weight       ffn_norm
//   mlp.{gate,down,up}_proj.weight        w{1,2,3}
// Phi-3: self_attn.qkv_proj.weight rows [0, Q) wq, [Q, Q+KV) wk, [Q+KV, Q+2KV) wv; mlp.gate_up_proj
// rows [0, F) w1, [F, 2F) w3 (each device then takes its slice of every segment, as MLX's
// shard_linear with segments). Mixtral: block_sparse_moe.gate router, block_sparse_moe.experts.{e}.
// w{1,2,3} experts.w{1,2,3}. Qwen3-MoE: mlp.gate router, mlp.experts.{e}.{gate,down,up}_proj
// experts.w{1,2,3}. mlx-lm stores both MoEs' experts stacked instead, as
// {block_sparse_moe,mlp}.switch_mlp.{gate,down,up}_proj [E, ...]. Outside the blocks: model.embed_tokens tok_embeddings, model.norm norm,
// lm_head output (absent when tie_word_embeddings).
//
// RoPE layout. Within a head of HS rows, tpcli (like llama2.c) rotates the pairs of rows (2i, 2i+1);
// Hugging Face's q/k projections (and their biases and norm weights) are stored for rotate_half,
// which pairs rows (i, i + HS/2). The rows are reordered on the way in and out
// (convert_llama_weights_to_hf.py's permute, llama2.c's export.py's permute_reverse):
// HF row h*HS + j*HS/2 + i  <->  tpcli row h*HS + 2i + j.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"

namespace tpcli::formats {

struct HfTensorRef {
  // Module paths ("model.layers.0.self_attn.q_proj"); several: experts, stacked in this order.
  std::vector<std::string> modules;
  std::string kind = "weight";       // the tensor is MODULE.weight, or MODULE.bias
  int rope_heads = 0;                // heads of rows to reorder for RoPE (0: none)
  int64_t row_offset = 0, rows = 0;  // rows [row_offset, +rows) of a fused tensor; rows 0: all of it
  int64_t fused_rows = 0;            // the fused tensor's rows (every segment's)
  // Experts: the module holding them already stacked [E, ...] (mlx-lm's switch_mlp, as
  // mlx-community's checkpoints store them), read when the per-expert tensors are absent.
  std::string stacked_module;
};

// Where block parameter `key` lives in a directory of `architecture` (model/block_matrices.h holds
// Llama's module names; the architecture row what differs). Throws std::invalid_argument for a
// name the architecture does not hold.
HfTensorRef hf_tensor_of(model::BlockKey key, const model::LlamaConfig& c, const std::string& architecture);
HfTensorRef hf_tensor_of(const std::string& name, const model::LlamaConfig& c, const std::string& architecture);

// Reorders the rows of a q/k projection [heads * HS, row_bytes] between the two RoPE layouts
// (see the top of this file). out and in must not overlap.
void rope_rows_from_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes);
void rope_rows_to_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes);

}  // namespace tpcli::formats
