// tpcli::model — Hugging Face tensor names by architecture (see hf_names.h).
#include "model/hf_names.h"

#include <cstring>
#include <map>
#include <stdexcept>
#include <utility>

#include "model/hf_architectures.h"

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

// The rows of a fused tensor (qkv_proj, gate_up_proj) that hold `kind`; no modules when it is not fused.
HfTensorRef fused_segment(const std::string& block, const std::string& kind, const LlamaConfig& c) {
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim;
  if (kind == "wq") return {{block + "self_attn.qkv_proj"}, "weight", c.n_heads, 0, Q, Q + 2 * KV};
  if (kind == "wk") return {{block + "self_attn.qkv_proj"}, "weight", c.n_kv_heads, Q, KV, Q + 2 * KV};
  if (kind == "wv") return {{block + "self_attn.qkv_proj"}, "weight", 0, Q + KV, KV, Q + 2 * KV};
  if (kind == "w1") return {{block + "mlp.gate_up_proj"}, "weight", 0, 0, F, 2 * F};
  if (kind == "w3") return {{block + "mlp.gate_up_proj"}, "weight", 0, F, F, 2 * F};
  return {};
}

// A MoE block's router and experts (one tensor each, or mlx-lm's switch_mlp stack).
HfTensorRef moe_tensor(const std::string& block, const std::string& kind, const LlamaConfig& c, const HfArchitecture& a) {
  const std::string moe = block + a.moe_block + ".";
  if (kind == "router") return {{moe + "gate"}};
  const std::pair<const char*, const char*> names = kind == "experts.w1"   ? std::pair{a.expert_w1, "gate_proj"}
                                                    : kind == "experts.w2" ? std::pair{a.expert_w2, "down_proj"}
                                                    : kind == "experts.w3" ? std::pair{a.expert_w3, "up_proj"}
                                                                           : std::pair{"", ""};
  if (!names.first[0]) return {};
  HfTensorRef ref;
  for (int e = 0; e < c.n_experts; ++e) ref.modules.push_back(moe + "experts." + std::to_string(e) + "." + names.first);
  ref.stacked_module = moe + "switch_mlp." + names.second;
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
    const HfArchitecture& a = hf_architecture(architecture);
    if (a.fused_projections)
      if (HfTensorRef fused = fused_segment(block, kind, c); !fused.modules.empty()) return fused;
    if (a.is_moe() && (kind == "router" || kind.starts_with("experts.")))
      if (HfTensorRef moe = moe_tensor(block, kind, c, a); !moe.modules.empty()) return moe;
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
