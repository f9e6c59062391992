// tpcli::model — Hugging Face tensor names by architecture (see hf_names.h).
#include "model/hf_names.h"

#include <cstring>
#include <map>
#include <stdexcept>

namespace tpcli::model {

void rope_rows_from_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes) {
  const int half = head_size / 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j)
        std::memcpy(out + static_cast<size_t>(h * head_size + 2 * i + j) * row_bytes,
                    in + static_cast<size_t>(h * head_size + j * half + i) * row_bytes, row_bytes);
}

void rope_rows_to_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes) {
  const int half = head_size / 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j)
        std::memcpy(out + static_cast<size_t>(h * head_size + j * half + i) * row_bytes,
                    in + static_cast<size_t>(h * head_size + 2 * i + j) * row_bytes, row_bytes);
}

namespace {

// Llama's names for the per-block parameters every architecture shares.
const std::map<std::string, std::string>& llama_block_modules() {
  static const std::map<std::string, std::string> modules{
      {"attention_norm", "input_layernorm"}, {"wq", "self_attn.q_proj"}, {"wk", "self_attn.k_proj"},
      {"wv", "self_attn.v_proj"},            {"wo", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
      {"w1", "mlp.gate_proj"},               {"w2", "mlp.down_proj"},    {"w3", "mlp.up_proj"},
      {"q_norm", "self_attn.q_norm"},        {"k_norm", "self_attn.k_norm"}};
  return modules;
}

// The rows of a fused Phi-3 tensor that hold `kind`, or rows 0 when it is not fused.
HfTensorRef phi3_fused(const std::string& block, const std::string& kind, const LlamaConfig& c) {
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim;
  if (kind == "wq") return {{block + "self_attn.qkv_proj"}, "weight", c.n_heads, 0, Q, Q + 2 * KV};
  if (kind == "wk") return {{block + "self_attn.qkv_proj"}, "weight", c.n_kv_heads, Q, KV, Q + 2 * KV};
  if (kind == "wv") return {{block + "self_attn.qkv_proj"}, "weight", 0, Q + KV, KV, Q + 2 * KV};
  if (kind == "w1") return {{block + "mlp.gate_up_proj"}, "weight", 0, 0, F, 2 * F};
  if (kind == "w3") return {{block + "mlp.gate_up_proj"}, "weight", 0, F, F, 2 * F};
  return {};
}

// A MoE block's router and stacked experts.
HfTensorRef moe_tensor(const std::string& block, const std::string& kind, const LlamaConfig& c, bool mixtral) {
  const std::string moe = block + (mixtral ? "block_sparse_moe." : "mlp.");
  if (kind == "router") return {{moe + "gate"}};
  static const std::map<std::string, std::pair<const char*, const char*>> experts{
      {"experts.w1", {"w1", "gate_proj"}}, {"experts.w2", {"w2", "down_proj"}}, {"experts.w3", {"w3", "up_proj"}}};
  auto it = experts.find(kind);
  if (it == experts.end()) return {};
  HfTensorRef ref;
  for (int e = 0; e < c.n_experts; ++e)
    ref.modules.push_back(moe + "experts." + std::to_string(e) + "." + (mixtral ? it->second.first : it->second.second));
  ref.stacked_module = moe + "switch_mlp." + it->second.second;
  return ref;
}

}  // namespace

HfTensorRef hf_tensor_of(const std::string& name, const LlamaConfig& c, const std::string& architecture) {
  if (name == "tok_embeddings") return {{"model.embed_tokens"}};
  if (name == "norm") return {{"model.norm"}};
  if (name == "output") return {{"lm_head"}};
  const size_t dot = name.find('.', 7);  // "layers.{i}.{kind}"
  if (name.starts_with("layers.") && dot != std::string::npos) {
    const std::string block = "model." + name.substr(0, dot) + ".", kind = name.substr(dot + 1);
    const bool mixtral = architecture == "MixtralForCausalLM";
    if (architecture == "Phi3ForCausalLM")
      if (HfTensorRef fused = phi3_fused(block, kind, c); !fused.modules.empty()) return fused;
    if (kind == "router" || kind.starts_with("experts."))
      if (HfTensorRef moe = moe_tensor(block, kind, c, mixtral); !moe.modules.empty()) return moe;
    if (kind == "bq" || kind == "bk" || kind == "bv") {
      const int heads = kind == "bq" ? c.n_heads : kind == "bk" ? c.n_kv_heads : 0;
      return {{block + "self_attn." + kind.substr(1) + "_proj"}, "bias", heads};
    }
    if (auto it = llama_block_modules().find(kind); it != llama_block_modules().end()) {
      const int heads = kind == "wq" ? c.n_heads : kind == "wk" ? c.n_kv_heads : kind == "q_norm" || kind == "k_norm" ? 1 : 0;
      return {{block + it->second}, "weight", heads};
    }
  }
  throw std::invalid_argument("hf: parameter '" + name + "' has no " + architecture + " name");
}

}  // namespace tpcli::model
