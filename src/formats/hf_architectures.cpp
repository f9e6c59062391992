// tpcli::formats — the architecture table (see hf_architectures.h).
#include "formats/hf_architectures.h"

#include <stdexcept>

namespace tpcli::formats {

const std::vector<HfArchitecture>& hf_architectures() {
  static const std::vector<HfArchitecture> table{
      {.name = "LlamaForCausalLM", .model_type = "llama"},
      {.name = "MistralForCausalLM", .model_type = "mistral"},
      {.name = "Qwen2ForCausalLM", .model_type = "qwen2", .qkv_bias = true, .sliding_window_switch = true},
      {.name = "Qwen3ForCausalLM", .model_type = "qwen3", .qk_norm = true, .sliding_window_switch = true},
      {.name = "Phi3ForCausalLM", .model_type = "phi3", .fused_projections = true},
      {.name = "MixtralForCausalLM",
       .model_type = "mixtral",
       .moe_block = "block_sparse_moe",
       .experts_key = "num_local_experts",
       .expert_w1 = "w1",
       .expert_w2 = "w2",
       .expert_w3 = "w3"},
      {.name = "Qwen3MoeForCausalLM",
       .model_type = "qwen3_moe",
       .qk_norm = true,
       .sliding_window_switch = true,
       .moe_block = "mlp",
       .experts_key = "num_experts",
       .expert_hidden_key = "moe_intermediate_size",
       .expert_w1 = "gate_proj",
       .expert_w2 = "down_proj",
       .expert_w3 = "up_proj",
       .norm_topk_prob_key = true,
       .dense_layer_keys = true},
  };
  return table;
}

const HfArchitecture& hf_architecture(const std::string& name) {
  for (const HfArchitecture& a : hf_architectures())
    if (name == a.name) return a;
  throw std::invalid_argument("hf: architecture '" + name + "' is not one tpcli runs");
}

}  // namespace tpcli::formats
