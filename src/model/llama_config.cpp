#include "model/llama_config.h"

#include <stdexcept>

namespace tpcli::model {

void LlamaConfig::validate() const {
  auto positive = [](const char* field, int value) {
    if (value < 1) throw std::invalid_argument(std::string(field) + " = " + std::to_string(value) + " must be >= 1");
  };
  positive("dim", dim);
  positive("hidden_dim", hidden_dim);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("vocab_size", vocab_size);
  positive("seq_len", seq_len);
  if (head_dim < 0) throw std::invalid_argument("head_dim = " + std::to_string(head_dim) + " must be >= 0");
  if (head_dim == 0 && dim % n_heads != 0)
    throw std::invalid_argument("n_heads = " + std::to_string(n_heads) + " does not divide dim = " + std::to_string(dim));
  if (n_heads % n_kv_heads != 0)
    throw std::invalid_argument("n_kv_heads = " + std::to_string(n_kv_heads) + " does not divide n_heads = " +
                                std::to_string(n_heads));
  if (head_size() % 2 != 0)
    throw std::invalid_argument("head size = " + std::to_string(head_size()) + " must be even for RoPE");
  if (n_experts < 0) throw std::invalid_argument("n_experts = " + std::to_string(n_experts) + " must be >= 0");
  if (is_moe() && (top_k < 1 || top_k > n_experts))
    throw std::invalid_argument("top_k = " + std::to_string(top_k) + " must be in [1, n_experts = " +
                                std::to_string(n_experts) + "]");
  if (expert_hidden_dim < 0) throw std::invalid_argument("expert_hidden_dim must be >= 0");
}

std::vector<ParamSpec> llama_parameters(const LlamaConfig& c) {
  const int64_t C = c.dim, F = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(), Q = c.q_dim();
  std::vector<ParamSpec> specs;
  auto add = [&](std::string name, tensor::Shape shape, Split split, bool decay) {
    specs.push_back({std::move(name), std::move(shape), split, decay});
  };
  auto per_layer = [&](const std::string& kind, tensor::Shape shape, Split split, bool decay) {
    for (int l = 0; l < c.n_layers; ++l) add("layers." + std::to_string(l) + "." + kind, shape, split, decay);
  };
  // llama2.c order: embedding, attention norms, wq, wk, wv, wo, ffn norms, w1, w2, w3, final norm.
  add("tok_embeddings", {V, C}, Split::Rows, true);  // by vocabulary, as the classifier
  per_layer("attention_norm", {C}, Split::Replicated, false);
  per_layer("wq", {Q, C}, Split::Rows, true);
  per_layer("wk", {KV, C}, Split::Rows, true);
  per_layer("wv", {KV, C}, Split::Rows, true);
  per_layer("wo", {C, Q}, Split::Columns, true);
  per_layer("ffn_norm", {C}, Split::Replicated, false);
  if (c.is_moe()) {
    const int64_t E = c.n_experts, FE = c.expert_hidden_dim ? c.expert_hidden_dim : F;
    per_layer("router", {E, C}, Split::Replicated, true);
    per_layer("experts.w1", {E, FE, C}, Split::Rows, true);
    per_layer("experts.w2", {E, C, FE}, Split::Columns, true);
    per_layer("experts.w3", {E, FE, C}, Split::Rows, true);
  } else {
    per_layer("w1", {F, C}, Split::Rows, true);
    per_layer("w2", {C, F}, Split::Columns, true);
    per_layer("w3", {F, C}, Split::Rows, true);
  }
  add("norm", {C}, Split::Replicated, false);
  if (!c.shared_classifier) add("output", {V, C}, Split::Rows, true);
  return specs;
}

int64_t LlamaConfig::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : llama_parameters(*this)) n += tensor::numel(p.shape);
  return n;
}

}  // namespace tpcli::model
