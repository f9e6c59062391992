// tpcli::model — the table of a block's parameters (see block_matrices.h).
#include "model/block_matrices.h"

#include <charconv>
#include <stdexcept>

#include "model/llama_config.h"

namespace tpcli::model {

namespace {

using enum Matrix;
constexpr bool COLUMNS = true, ROWS = false, DECAY = true, NO_DECAY = false;
constexpr const char* QKV = "self_attn.qkv_proj";
constexpr const char* GATE_UP = "mlp.gate_up_proj";

// name, HF module, HF kind, PEFT name, sharded dim, side, decay, blocks, feature, RoPE rows, fused, part, GGUF name
constexpr MatrixFacts TABLE[] = {
    {AttentionNorm, "attention_norm", "input_layernorm", "weight", nullptr, ShardedDim::None, ROWS, NO_DECAY, Blocks::Every,
     Feature::None, RopeRows::None, nullptr, 0, "attn_norm.weight"},
    {Wq, "wq", "self_attn.q_proj", "weight", "q_proj", ShardedDim::QueryHeads, ROWS, DECAY, Blocks::Every, Feature::None,
     RopeRows::QueryHeads, QKV, 0, "attn_q.weight"},
    {Wk, "wk", "self_attn.k_proj", "weight", "k_proj", ShardedDim::KvHeads, ROWS, DECAY, Blocks::Every, Feature::None,
     RopeRows::KvHeads, QKV, 1, "attn_k.weight"},
    {Wv, "wv", "self_attn.v_proj", "weight", "v_proj", ShardedDim::KvHeads, ROWS, DECAY, Blocks::Every, Feature::None,
     RopeRows::None, QKV, 2, "attn_v.weight"},
    {Wo, "wo", "self_attn.o_proj", "weight", "o_proj", ShardedDim::QueryHeads, COLUMNS, DECAY, Blocks::Every, Feature::None,
     RopeRows::None, nullptr, 0, "attn_output.weight"},
    // Qwen2's biases: the q|k|v projection's output, split with their weights' rows.
    {Bq, "bq", "self_attn.q_proj", "bias", nullptr, ShardedDim::QueryHeads, ROWS, NO_DECAY, Blocks::Every, Feature::QkvBias,
     RopeRows::QueryHeads, nullptr, 0, "attn_q.bias"},
    {Bk, "bk", "self_attn.k_proj", "bias", nullptr, ShardedDim::KvHeads, ROWS, NO_DECAY, Blocks::Every, Feature::QkvBias,
     RopeRows::KvHeads, nullptr, 1, "attn_k.bias"},
    {Bv, "bv", "self_attn.v_proj", "bias", nullptr, ShardedDim::KvHeads, ROWS, NO_DECAY, Blocks::Every, Feature::QkvBias,
     RopeRows::None, nullptr, 2, "attn_v.bias"},
    // Qwen3's RMSNorm of each q and k head, one weight [HS] shared by the heads.
    {QNorm, "q_norm", "self_attn.q_norm", "weight", nullptr, ShardedDim::None, ROWS, NO_DECAY, Blocks::Every, Feature::QkNorm,
     RopeRows::OneHead, nullptr, 0, "attn_q_norm.weight"},
    {KNorm, "k_norm", "self_attn.k_norm", "weight", nullptr, ShardedDim::None, ROWS, NO_DECAY, Blocks::Every, Feature::QkNorm,
     RopeRows::OneHead, nullptr, 0, "attn_k_norm.weight"},
    {FfnNorm, "ffn_norm", "post_attention_layernorm", "weight", nullptr, ShardedDim::None, ROWS, NO_DECAY, Blocks::Every,
     Feature::None, RopeRows::None, nullptr, 0, "ffn_norm.weight"},
    {Router, "router", "gate", "weight", nullptr, ShardedDim::None, ROWS, DECAY, Blocks::Moe, Feature::None, RopeRows::None,
     nullptr, 0, "ffn_gate_inp.weight"},
    {ExpertsW1, "experts.w1", "gate_proj", "weight", nullptr, ShardedDim::Experts, ROWS, DECAY, Blocks::Moe, Feature::None,
     RopeRows::None, nullptr, 0, "ffn_gate_exps.weight"},
    {ExpertsW2, "experts.w2", "down_proj", "weight", nullptr, ShardedDim::Experts, COLUMNS, DECAY, Blocks::Moe, Feature::None,
     RopeRows::None, nullptr, 0, "ffn_down_exps.weight"},
    {ExpertsW3, "experts.w3", "up_proj", "weight", nullptr, ShardedDim::Experts, ROWS, DECAY, Blocks::Moe, Feature::None,
     RopeRows::None, nullptr, 0, "ffn_up_exps.weight"},
    {W1, "w1", "mlp.gate_proj", "weight", "gate_proj", ShardedDim::Hidden, ROWS, DECAY, Blocks::Dense, Feature::None,
     RopeRows::None, GATE_UP, 0, "ffn_gate.weight"},
    {W2, "w2", "mlp.down_proj", "weight", "down_proj", ShardedDim::Hidden, COLUMNS, DECAY, Blocks::Dense, Feature::None,
     RopeRows::None, nullptr, 0, "ffn_down.weight"},
    {W3, "w3", "mlp.up_proj", "weight", "up_proj", ShardedDim::Hidden, ROWS, DECAY, Blocks::Dense, Feature::None,
     RopeRows::None, GATE_UP, 1, "ffn_up.weight"},
};

constexpr bool in_matrix_order() {
  for (size_t i = 0; i < std::size(TABLE); ++i)
    if (static_cast<size_t>(TABLE[i].matrix) != i) return false;
  return std::size(TABLE) == static_cast<size_t>(W3) + 1;
}
static_assert(in_matrix_order(), "TABLE holds every Matrix once, in Matrix order");

constexpr Matrix LORA_ORDER[] = {Wq, Wk, Wv, Wo, W1, W3, W2};

}  // namespace

std::span<const MatrixFacts> block_matrices() { return TABLE; }
const MatrixFacts& facts(Matrix m) { return TABLE[static_cast<size_t>(m)]; }
std::span<const Matrix> lora_matrix_order() { return LORA_ORDER; }

tensor::Shape block_shape(Matrix m, const LlamaConfig& c) {
  const int64_t C = c.dim, F = c.hidden_dim, Q = c.q_dim(), KV = c.kv_dim(), HS = c.head_size(), E = c.n_experts,
                FE = c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim;
  switch (m) {
    case AttentionNorm: case FfnNorm: return {C};
    case Wq: return {Q, C};
    case Wk: case Wv: return {KV, C};
    case Wo: return {C, Q};
    case Bq: return {Q};
    case Bk: case Bv: return {KV};
    case QNorm: case KNorm: return {HS};
    case Router: return {E, C};
    case ExpertsW1: case ExpertsW3: return {E, FE, C};
    case ExpertsW2: return {E, C, FE};
    case W1: case W3: return {F, C};
    case W2: return {C, F};
  }
  throw std::logic_error("block_shape: no such matrix");
}

bool holds(const LlamaConfig& c, int l, Matrix m) {
  const MatrixFacts& f = facts(m);
  if ((f.feature == Feature::QkvBias && !c.qkv_bias) || (f.feature == Feature::QkNorm && !c.qk_norm)) return false;
  return f.blocks == Blocks::Every || (f.blocks == Blocks::Moe) == c.is_moe_layer(l);
}

int rope_heads(Matrix m, const LlamaConfig& c) {
  switch (facts(m).rope) {
    case RopeRows::None: return 0;
    case RopeRows::QueryHeads: return c.n_heads;
    case RopeRows::KvHeads: return c.n_kv_heads;
    case RopeRows::OneHead: return 1;
  }
  return 0;
}

std::vector<Matrix> linear_parts(Matrix m) {
  const MatrixFacts& f = facts(m);
  if (!f.fused_hf_module) return {m};
  std::vector<Matrix> parts;
  for (int part = 0;; ++part) {
    const size_t before = parts.size();
    for (const MatrixFacts& g : TABLE)
      if (g.fused_hf_module && std::string_view(g.fused_hf_module) == f.fused_hf_module && g.part == part) parts.push_back(g.matrix);
    if (parts.size() == before) return parts;
  }
}

std::string linear_name(Matrix m) {
  std::string name;
  for (Matrix part : linear_parts(m)) {
    if (!name.empty()) name += '|';
    name += facts(part).name;
  }
  return name;
}

bool is_dense_linear(const MatrixFacts& f) { return f.decay && f.blocks != Blocks::Moe; }

Split split_of(const MatrixFacts& f) {
  if (f.sharded_dim == ShardedDim::None) return Split::Replicated;
  return f.columns ? Split::Columns : Split::Rows;
}

std::string block_prefix(int layer) { return "layers." + std::to_string(layer) + "."; }
std::string tensor_name(BlockKey key) { return block_prefix(key.layer) + facts(key.matrix).name; }

std::optional<ParsedName> parse_tensor_name(std::string_view name) {
  constexpr std::string_view LAYERS = "layers.";
  if (!name.starts_with(LAYERS)) return std::nullopt;
  name.remove_prefix(LAYERS.size());
  size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') ++digits;
  if (digits < 1 || digits > 6 || digits == name.size() || name[digits] != '.') return std::nullopt;
  int layer = 0;
  std::from_chars(name.data(), name.data() + digits, layer);
  name.remove_prefix(digits + 1);
  for (const MatrixFacts& f : TABLE) {
    const std::string_view n = f.name;
    if (!name.starts_with(n)) continue;
    if (name.size() == n.size()) return ParsedName{{layer, f.matrix}, ""};
    if (name[n.size()] == '.') return ParsedName{{layer, f.matrix}, std::string(name.substr(n.size() + 1))};
  }
  return std::nullopt;
}

std::optional<Matrix> matrix_named(std::string_view name) {
  for (const MatrixFacts& f : TABLE)
    if (name == f.name) return f.matrix;
  return std::nullopt;
}

std::optional<Matrix> matrix_of_peft(std::string_view peft) {
  for (const MatrixFacts& f : TABLE)
    if (f.peft && peft == f.peft) return f.matrix;
  return std::nullopt;
}

}  // namespace tpcli::model
