// tpcli::model — the parameters of a transformer block, each said once: its name in tpcli's files,
// its Hugging Face module and PEFT target name, its shape, how it is split over the tensor group,
// its part of a fused linear, the rows RoPE rotates, whether LoRA adapts it. Every reader of a
// block's parameters looks its facts up here: llama_parameters (model/llama_config.h), the loaders
// of both roles, the Hugging Face names (formats/hf_names.h), the PEFT reader and writer
// (model/lora_adapter.h), the trainable model's LoRA sites and the communication plan.
//
// Keys are values, BlockKey{3, Matrix::Wq}; they become strings ("layers.3.wq") in one place,
// tensor_name(), where they meet the files (safetensors, llama2.c, checkpoints, adapters).
//
// Dimension legend: C dim, F hidden_dim, FE expert hidden dim, E n_experts, Q q_dim, KV kv_dim,
// HS head size.
#pragma once

#include <cstdint>
#include <compare>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace tpcli::model {

struct LlamaConfig;

// How a parameter is split over the tensor-parallel group (see model/shard_plan.h for the counts).
enum class Split {
  Replicated,  // norms, MoE routers: the same on every device
  Rows,        // output features split (AllToSharded: wq, wk, wv, w1, w3); the embedding and the
               // classifier by vocabulary rows
  Columns,     // input features split (ShardedToAll: wo, w2)
};

// Which dimension of the model a split parameter's rows (Split::Rows) or columns (Split::Columns)
// follow: the shard plan (model/shard_plan.h, ShardPlan::range_of) says which part is a device's.
enum class ShardedDim {
  None,        // replicated
  Vocab,       // tok_embeddings, output rows
  QueryHeads,  // wq rows, wo columns (head_size per head)
  KvHeads,     // wk, wv rows
  Hidden,      // w1, w3 rows, w2 columns (F)
  Experts,     // MoE experts: dealt out and split by nn/moe.h itself
};

// A block's parameters, in llama2.c's checkpoint order (llama_parameters lists them so).
enum class Matrix : uint8_t {
  AttentionNorm, Wq, Wk, Wv, Wo, Bq, Bk, Bv, QNorm, KNorm, FfnNorm,
  Router, ExpertsW1, ExpertsW2, ExpertsW3, W1, W2, W3,
};

// Parameter `matrix` of block `layer`.
struct BlockKey {
  int layer = 0;
  Matrix matrix = Matrix::Wq;
  friend auto operator<=>(const BlockKey&, const BlockKey&) = default;
};

// Which blocks hold a parameter: every one, the MoE ones, the dense ones (LlamaConfig::is_moe_layer).
enum class Blocks { Every, Moe, Dense };
// The config setting that adds a parameter to the Llama block (none: every Llama has it).
enum class Feature { None, QkvBias, QkNorm };
// The rows RoPE's layout orders (formats/hf_names.h reorders them between tpcli and Hugging Face):
// heads of HS rows of q, of k, or the one HS vector of a q/k norm.
enum class RopeRows { None, QueryHeads, KvHeads, OneHead };

struct MatrixFacts {
  Matrix matrix;
  const char* name;       // tpcli's: the tensor layers.{l}.NAME
  const char* hf_module;  // Hugging Face's module under model.layers.{l}. (MoE ones: under the
                          // architecture's MoE block; experts: mlx-lm's switch_mlp names)
  const char* hf_kind;    // the tensor is MODULE.weight or MODULE.bias
  const char* peft;       // PEFT's target_modules name; nullptr: LoRA does not adapt it
  ShardedDim sharded_dim;
  bool columns;           // split by input columns (ShardedToAll: wo, w2) rather than output rows
  bool decay;             // weight decay: matrices; norm gains and biases never
  Blocks blocks;
  Feature feature;
  RopeRows rope;
  // The fused linear it is a part of, and its place there: the AllToSharded parts wq|wk|wv and
  // w1|w3 (nn/linear.h), which Phi-3 stores as one tensor (HF self_attn.qkv_proj, mlp.gate_up_proj).
  const char* fused_hf_module;  // nullptr: not a part
  int part;
  // llama.cpp's tensor blk.{l}.NAME in a GGUF file (experts stacked [E, out, in]; Phi-3's fused
  // parts in attn_qkv and ffn_up, as in its Hugging Face directory).
  const char* gguf;
};

// Every block parameter, in Matrix order.
std::span<const MatrixFacts> block_matrices();
const MatrixFacts& facts(Matrix m);
// The matrices LoRA adapts, in PEFT's order (q k v o gate up down).
std::span<const Matrix> lora_matrix_order();

// Its full (unsharded) shape, [out, in] for matrices; experts [E, out, in].
tensor::Shape block_shape(Matrix m, const LlamaConfig& c);
// Whether block l of `c` holds it (its feature is on, and the block is of its kind).
bool holds(const LlamaConfig& c, int l, Matrix m);
// The rows RoPE orders, as a count of heads of HS rows (0: none).
int rope_heads(Matrix m, const LlamaConfig& c);
// The parts of the linear m is one of, in order (wq|wk|wv, w1|w3); {m} when it is no part.
std::vector<Matrix> linear_parts(Matrix m);
// Their names joined by '|': "wq|wk|wv", "w1|w3", "wo".
std::string linear_name(Matrix m);
// A dense block's linear weights (wq, wk, wv, wo, w1, w2, w3): what the cost model plans.
bool is_dense_linear(const MatrixFacts& f);
// Split::Rows, Split::Columns or Split::Replicated, from its sharded dim and side.
Split split_of(const MatrixFacts& f);

// The one place a key becomes a string: "layers.{l}." and "layers.{l}.wq".
std::string block_prefix(int layer);
std::string tensor_name(BlockKey key);
// "layers.{l}.{name}" followed by nothing or by ".rest": the key and "rest" ("" when nothing);
// nullopt for any other name. l has 1 to 6 digits.
struct ParsedName {
  BlockKey key;
  std::string rest;
};
std::optional<ParsedName> parse_tensor_name(std::string_view name);

// tpcli's name ("wq") and PEFT's ("q_proj") to the Matrix; nullopt when no parameter has it.
std::optional<Matrix> matrix_named(std::string_view name);
std::optional<Matrix> matrix_of_peft(std::string_view peft);

}  // namespace tpcli::model
