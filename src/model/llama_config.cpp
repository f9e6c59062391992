#include "model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace tpcli::model {

void LlamaConfig::validate() const {
  auto positive = [](const char* field, int value) {
    if (value < 1) throw std::invalid_argument(std::string(field) + " = " + std::to_string(value) + " must be >= 1");
  };
  auto bounded = [&](const ConfigLimit& limit, int value) {
    positive(limit.field, value);
    if (value > limit.max)
      throw std::invalid_argument(std::string(limit.field) + " = " + std::to_string(value) + " exceeds the limit " +
                                  std::to_string(limit.max));
  };
  bounded(MAX_DIM, dim);
  bounded(MAX_HIDDEN_DIM, hidden_dim);
  bounded(MAX_LAYERS, n_layers);
  bounded(MAX_HEADS, n_heads);
  bounded(MAX_KV_HEADS, n_kv_heads);
  bounded(MAX_VOCAB, vocab_size);
  bounded(MAX_SEQ_LEN, seq_len);
  // A NaN or a negative epsilon / base makes every activation NaN, silently.
  auto finite_positive = [](const char* field, float value) {
    if (!std::isfinite(value) || value <= 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", static_cast<double>(value));
      throw std::invalid_argument(std::string(field) + " = " + buf + " must be a finite number > 0");
    }
  };
  finite_positive("norm_eps", norm_eps);
  finite_positive("rope_theta", rope_theta);
  if (!std::isfinite(moe_aux_loss) || moe_aux_loss < 0)
    throw std::invalid_argument("moe_aux_loss = " + std::to_string(moe_aux_loss) + " must be a finite number >= 0");
  if (capacity_factor) finite_positive("capacity_factor", *capacity_factor);
  if (head_dim < 0 || head_dim > MAX_DIM.max)
    throw std::invalid_argument("head_dim = " + std::to_string(head_dim) + " must be in [0, " + std::to_string(MAX_DIM.max) + "]");
  if (head_dim == 0 && dim % n_heads != 0)
    throw std::invalid_argument("n_heads = " + std::to_string(n_heads) + " does not divide dim = " + std::to_string(dim));
  if (n_heads % n_kv_heads != 0)
    throw std::invalid_argument("n_kv_heads = " + std::to_string(n_kv_heads) + " does not divide n_heads = " +
                                std::to_string(n_heads));
  if (head_size() % 2 != 0)
    throw std::invalid_argument("head size = " + std::to_string(head_size()) + " must be even for RoPE");
  if (!rope_freq_factors.empty()) {
    if (rope_freq_factors.size() != static_cast<size_t>(head_size() / 2))
      throw std::invalid_argument("rope_freq_factors: " + std::to_string(rope_freq_factors.size()) + " values, the head size " +
                                  std::to_string(head_size()) + " needs " + std::to_string(head_size() / 2));
    for (const float f : rope_freq_factors) finite_positive("rope_freq_factors value", f);
    if (rope_scaling) throw std::invalid_argument("rope_freq_factors and rope_scaling together: the model has one llama3 scaling");
  }
  if (n_experts < 0 || n_experts > MAX_EXPERTS.max)
    throw std::invalid_argument("n_experts = " + std::to_string(n_experts) + " must be in [0, " +
                                std::to_string(MAX_EXPERTS.max) + "]");
  if (is_moe() && (top_k < 1 || top_k > n_experts))
    throw std::invalid_argument("top_k = " + std::to_string(top_k) + " must be in [1, n_experts = " +
                                std::to_string(n_experts) + "]");
  for (size_t i = 0; i < dense_layers.size(); ++i)
    if (!is_moe() || dense_layers[i] < 0 || dense_layers[i] >= n_layers || (i > 0 && dense_layers[i] <= dense_layers[i - 1]))
      throw std::invalid_argument("dense_layers: " + std::to_string(dense_layers[i]) +
                                  (is_moe() ? " is not a block in [0, n_layers), ascending" : " with no experts"));
  if (expert_hidden_dim < 0 || expert_hidden_dim > MAX_EXPERT_HIDDEN_DIM.max)
    throw std::invalid_argument("expert_hidden_dim = " + std::to_string(expert_hidden_dim) + " must be in [0, " +
                                std::to_string(MAX_EXPERT_HIDDEN_DIM.max) + "]");
}

bool LlamaConfig::is_moe_layer(int l) const {
  return is_moe() && !std::binary_search(dense_layers.begin(), dense_layers.end(), l);
}

std::string LlamaConfig::beyond_llama_feature() const {
  if (qkv_bias) return "q/k/v biases";
  if (qk_norm) return "q/k norms";
  if (!dense_layers.empty()) return "dense blocks among MoE blocks";
  if (is_moe() && !norm_topk_prob) return "unnormalised top-k gates";
  return "";
}

std::vector<ParamSpec> llama_parameters(const LlamaConfig& c) {
  const int64_t C = c.dim, V = c.vocab_size;
  std::vector<ParamSpec> specs;
  auto add = [&](std::string name, tensor::Shape shape, ShardedDim dim, bool decay) {
    specs.push_back({std::move(name), std::move(shape), dim == ShardedDim::None ? Split::Replicated : Split::Rows, decay,
                     false, false, dim});
  };
  // llama2.c order: embedding, each block parameter for every block that holds it (attention
  // norms, wq, wk, wv, wo, ..., ffn norms, w1, w2, w3), final norm.
  add("tok_embeddings", {V, C}, ShardedDim::Vocab, true);  // by vocabulary, as the classifier
  for (const MatrixFacts& f : block_matrices())
    for (int l = 0; l < c.n_layers; ++l)
      if (holds(c, l, f.matrix))
        specs.push_back({tensor_name({l, f.matrix}), block_shape(f.matrix, c), split_of(f), f.decay,
                         f.sharded_dim == ShardedDim::Experts, f.sharded_dim == ShardedDim::KvHeads, f.sharded_dim,
                         BlockKey{l, f.matrix}});
  add("norm", {C}, ShardedDim::None, false);
  if (!c.shared_classifier) add("output", {V, C}, ShardedDim::Vocab, true);
  return specs;
}

int64_t LlamaConfig::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : llama_parameters(*this)) n += tensor::numel(p.shape);
  return n;
}

}  // namespace tpcli::model
