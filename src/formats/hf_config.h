// tpcli::formats — a Hugging Face model directory's config.json (and generation_config.json) as a
// LlamaConfig, for the architectures tpcli runs: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3
// (q/k norms, head_dim), Phi-3 (fused qkv and gate|up projections), Mixtral and Qwen3-MoE (experts;
// Qwen3-MoE's dense blocks among them), each a row of formats/hf_architectures.h. Their tensor
// names: formats/hf_names.h.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/llama_config.h"

namespace tpcli::formats {

// What config.json (and generation_config.json) say beyond the LlamaConfig.
struct HfConfig {
  model::LlamaConfig llama;
  std::string architecture;   // config.json's, one of supported_architectures()
  std::string torch_dtype;    // "bfloat16", "float16", "float32" or "" when absent
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;  // config.json's, overridden by generation_config.json's
  // MoE routers quantized otherwise than llama.quantization (mlx-lm: 8-bit), by module path
  // ("model.layers.0.mlp.gate"); nullopt: stored in float.
  std::map<std::string, std::optional<model::Quantization>> router_quantization;
};

// True when `path` is a directory holding a config.json.
bool is_hf_model_dir(const std::string& path);

// Reads DIR/config.json and DIR/generation_config.json. Throws std::runtime_error
// "DIR/config.json: ..." naming the key for a missing file, an unknown architecture, a missing,
// mistyped or unsupported key.
HfConfig read_hf_config(const std::string& dir);

// config.json's "architectures" names tpcli runs.
const std::vector<std::string>& supported_architectures();

}  // namespace tpcli::formats
