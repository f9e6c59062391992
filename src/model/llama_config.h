// tpcli::model — the blueprint of a Llama model and the table of its parameters.
//
// Dimension legend: C dim, F hidden_dim (ffn), L n_layers, NH n_heads, NKV n_kv_heads,
// HS head size (C / NH unless head_dim says otherwise), Q = NH * HS, V vocab_size, E n_experts,
// K top_k.
//
// The parameter table drives allocation, loading, saving, sharding and the optimizer: no code
// lists parameters by hand anywhere else. A block's parameters and their facts are one table,
// model/block_matrices.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/block_matrices.h"
#include "nn/rope.h"
#include "tensor/tensor.h"

namespace tpcli::model {

// MLX's quantization of a checkpoint's matrices (../shared/QUANT.md).
struct Quantization {
  int bits = 4;         // affine: 4 or 8; mxfp8: 8
  int group_size = 64;  // affine: 32, 64, 128; mxfp8: 32
  std::string mode = "affine";  // "affine" | "mxfp8"
};

struct LlamaConfig {
  int dim = 0;         // C
  int hidden_dim = 0;  // F
  int n_layers = 0;    // L
  int n_heads = 0;     // NH
  int n_kv_heads = 0;  // NKV (divides NH)
  int head_dim = 0;    // HS when it is not C / NH (Hugging Face's head_dim); 0 = C / NH
  int vocab_size = 0;  // V
  int seq_len = 0;     // longest context
  bool shared_classifier = true;  // classifier weight is the token embedding
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  std::optional<nn::RopeScaling> rope_scaling;  // Llama 3.1+ "llama3" scaling; none for older models
  // [HS/2] divisors of the RoPE frequencies: how a GGUF file (llama.cpp's rope_freqs.weight)
  // stores the llama3 scaling, which it does not keep as rope_scaling. Empty: none.
  std::vector<float> rope_freq_factors;
  // Mixture of experts (0 experts = dense feed-forward).
  int n_experts = 0;  // E
  int top_k = 0;      // K
  int expert_hidden_dim = 0;  // 0 = hidden_dim
  float moe_aux_loss = 0.0f;
  std::optional<float> capacity_factor;
  // Top-k gates renormalised to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob), else the softmax
  // probabilities over all E as they are.
  bool norm_topk_prob = true;
  // MoE: blocks whose feed-forward is the dense SwiGLU of hidden_dim instead (Qwen3-MoE's
  // mlp_only_layers, decoder_sparse_step), ascending.
  std::vector<int> dense_layers;
  // Qwen2: biases on q, k and v (layers.{l}.bq [Q], bk [KV], bv [KV]), split with their weights' rows.
  bool qkv_bias = false;
  // Qwen3: RMSNorm over each head of q and of k before RoPE, one weight [HS] shared by the heads
  // (layers.{l}.q_norm, k_norm).
  bool qk_norm = false;
  // The Hugging Face architecture the model was read as ("Qwen3ForCausalLM", ...; "" = a Llama):
  // `export --to hf` writes its config.json and tensor names (formats/hf_names.h).
  std::string hf_architecture;
  // Set when the checkpoint's matrices are quantized (stored as NAME, NAME.scales, NAME.biases).
  std::optional<Quantization> quantization;

  int head_size() const { return head_dim ? head_dim : dim / n_heads; }
  int q_dim() const { return head_size() * n_heads; }  // Q: rows of wq, columns of wo
  int kv_dim() const { return head_size() * n_kv_heads; }
  bool is_moe() const { return n_experts > 0; }  // some block's feed-forward is a MoE
  bool is_moe_layer(int l) const;                 // block l's is
  // The first feature beyond the Llama block (q/k/v biases, q/k norms, dense blocks among MoE ones,
  // unnormalised gates) the model has, or "": what llama2.c and Llama exports refuse.
  std::string beyond_llama_feature() const;
  int64_t parameter_count() const;
  // Throws std::invalid_argument naming the field when the dims don't fit together, exceed the
  // limits below, or a setting is not finite (norm_eps, rope_theta, ...).
  void validate() const;
};

// Upper bounds far above any model this tool runs: a number read from a file (a llama2.c header,
// safetensors metadata, a config) beyond them is garbage, and is refused before anything is
// allocated from it.
struct ConfigLimit {
  const char* field;
  int max;
};
constexpr ConfigLimit MAX_DIM{"dim", 1 << 16}, MAX_HIDDEN_DIM{"hidden_dim", 1 << 18},
    MAX_LAYERS{"n_layers", 1 << 10}, MAX_HEADS{"n_heads", 1 << 10}, MAX_KV_HEADS{"n_kv_heads", 1 << 10},
    MAX_VOCAB{"vocab_size", 1 << 22}, MAX_SEQ_LEN{"seq_len", 1 << 20}, MAX_EXPERTS{"n_experts", 1 << 10},
    MAX_EXPERT_HIDDEN_DIM{"expert_hidden_dim", 1 << 18};

struct ParamSpec {
  std::string name;      // "tok_embeddings", "layers.3.wq", ...
  tensor::Shape shape;   // full (unsharded) shape, [out, in] for matrices
  Split split = Split::Replicated;
  bool weight_decay = false;  // 2-D weights (matrices and embedding) decay; norm gains never
  // MoE experts: dealt out over the expert group (nn/moe.h), so each member holds different ones.
  bool expert = false;
  // wk, wv: rows are KV heads, which several tensor devices may each hold (model/shard_plan.h).
  bool kv_heads = false;
  ShardedDim sharded_dim = ShardedDim::None;
  // A block's parameter: its key (a LoRA adapter's spec: the adapted matrix's). nullopt: outside
  // the blocks (tok_embeddings, norm, output).
  std::optional<BlockKey> block;
};

// In llama2.c checkpoint order (per-kind arrays across layers are listed layer by layer).
std::vector<ParamSpec> llama_parameters(const LlamaConfig& config);

}  // namespace tpcli::model
