// tpcli::formats — the Hugging Face architectures tpcli runs, one row each: what an architecture's
// config.json and tensor names hold beyond Llama's (the way mlx-lm keeps one short file per model
// family). formats/hf_config.cpp, formats/hf_names.cpp and the exporter read these fields; none of them
// tests an architecture's name.
#pragma once

#include <string>
#include <vector>

namespace tpcli::formats {

struct HfArchitecture {
  const char* name;        // config.json "architectures"
  const char* model_type;  // config.json "model_type"
  bool qkv_bias = false;   // q/k/v projections always carry biases (Qwen2), whatever attention_bias says
  bool qk_norm = false;    // self_attn.q_norm / k_norm before RoPE (Qwen3)
  bool fused_projections = false;  // self_attn.qkv_proj and mlp.gate_up_proj (Phi-3)
  // sliding_window applies only when use_sliding_window is true (Qwen); otherwise whenever present.
  bool sliding_window_switch = false;
  // Mixture of experts ("" moe_block: none).
  const char* moe_block = "";        // the block's MoE module: block_sparse_moe (Mixtral), mlp (Qwen3-MoE)
  const char* experts_key = "";      // config.json's expert count
  const char* expert_hidden_key = "";  // config.json's expert hidden size ("": intermediate_size)
  const char* expert_w1 = "";        // an expert's gate, down and up projections
  const char* expert_w2 = "";
  const char* expert_w3 = "";
  bool norm_topk_prob_key = false;   // reads norm_topk_prob (default false); else the top-k always renormalised
  bool dense_layer_keys = false;     // reads mlp_only_layers and decoder_sparse_step
  bool is_moe() const { return moe_block[0] != '\0'; }
};

const std::vector<HfArchitecture>& hf_architectures();
// The row named `name`; throws std::invalid_argument when tpcli does not run it.
const HfArchitecture& hf_architecture(const std::string& name);

}  // namespace tpcli::formats
