// tpcli::model — the core both Llama roles share (see llama_core.h).
#include "model/llama_core.h"

#include <stdexcept>
#include <utility>

#include "nn/gather.h"
#include "nn/linear.h"
#include "nn/moe.h"
#include "nn/rmsnorm.h"

namespace tpcli::model {

using tensor::Tensor;

LlamaCore::LlamaCore(LlamaConfig c, dist::Group tensor_group, dist::Group experts)
    : config(std::move(c)), group(std::move(tensor_group)), expert_group(std::move(experts)) {
  config.validate();
  specs = llama_parameters(config);
  all_plans = plan_all_shards(config, group.size());
  plan = all_plans[static_cast<size_t>(group.rank())];
  const int kv_mul = config.n_heads / config.n_kv_heads;
  for (int h = 0; h < plan.heads.count; ++h) kv_of.push_back(plan.kv_head_of(h, kv_mul));
  rope = nn::RopeTable(config.seq_len, config.head_size(), config.rope_theta, config.rope_scaling);
}

nn::AttentionShape LlamaCore::attention_shape() const {
  return {static_cast<int>(plan.heads.count), static_cast<int>(plan.kv_heads.count), config.head_size(), kv_of};
}

nn::MoeSizes LlamaCore::moe_sizes() const {
  const LlamaConfig& c = config;
  return {c.dim, c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim, c.n_experts, c.top_k, c.moe_aux_loss,
          c.capacity_factor, c.norm_topk_prob};
}

std::vector<dist::Range> LlamaCore::vocab_ranges() const {
  std::vector<dist::Range> ranges;
  for (const auto& q : all_plans) ranges.push_back(q.vocab);
  return ranges;
}

const ParamSpec& LlamaCore::spec(const std::string& name) const {
  for (const auto& s : specs)
    if (s.name == name) return s;
  throw std::logic_error("llama: no parameter " + name);
}

void LlamaCore::rope_forward(float* qkv, int64_t N, int pos, int64_t period) const { rope_rows(qkv, N, pos, period, false); }

void LlamaCore::rope_backward(float* dqkv, int64_t N, int64_t period) const { rope_rows(dqkv, N, 0, period, true); }

void LlamaCore::rope_rows(float* qkv, int64_t N, int pos, int64_t period, bool backward) const {
  const nn::AttentionShape shape = attention_shape();
  const int64_t QKV = shape.qkv_dim(), QL = shape.q_dim();
  for (int64_t n = 0; n < N; ++n) {
    const int p = pos + static_cast<int>(n % period);
    for (auto [offset, heads] : {std::pair{int64_t{0}, shape.heads}, std::pair{QL, shape.kv_heads}}) {
      float* row = qkv + n * QKV + offset;
      if (backward) rope.backward(row, heads, p);
      else rope.forward(row, heads, p);
    }
  }
}

std::vector<float> LlamaCore::gather_vocab_columns(const float* local, int64_t N) {
  Tensor full = nn::gather_columns(group, local, vocab_ranges(), N, config.vocab_size);
  return std::vector<float>(full.span().begin(), full.span().end());
}

std::span<const float> checked_values(const WeightSource& w, const std::string& name, int64_t expected) {
  auto src = w.get(name);
  if (static_cast<int64_t>(src.size()) != expected)
    throw std::invalid_argument("llama: parameter '" + name + "' has " + std::to_string(src.size()) +
                                " values, expected " + std::to_string(expected));
  return src;
}

namespace {

// This device's part of the full parameter `s` (rows x cols).
Tensor copy_shard(std::span<const float> full, const ParamSpec& s, int64_t rows, int64_t cols, const ShardPlan& plan) {
  switch (s.split) {
    case Split::Replicated: return Tensor(s.shape, full);
    case Split::Rows: return nn::slice_rows(full.data(), cols, plan.range_of(s.sharded_dim));
    case Split::Columns: return nn::slice_columns(full.data(), rows, cols, {plan.range_of(s.sharded_dim)});
  }
  throw std::logic_error("llama: parameter '" + s.name + "' has no split");
}

}  // namespace

Tensor LlamaCore::local_slice(const WeightSource& w, const std::string& name) const {
  const ParamSpec& s = spec(name);
  const int64_t rows = s.shape[0], cols = tensor::numel(s.shape) / rows;
  Tensor local = copy_shard(checked_values(w, name, rows * cols), s, rows, cols, plan);
  w.release_pages(name);  // copied: the file's pages of it need not stay resident (weights.h)
  return local;
}

Tensor LlamaCore::block_slice(const WeightSource& w, int l, const std::string& name) const {
  return local_slice(w, "layers." + std::to_string(l) + "." + name);
}

F32AttentionLinears LlamaCore::load_f32_attention(const WeightSource& w, int l) const {
  std::vector<nn::Linear> parts;
  for (const char* name : {"wq", "wk", "wv"}) parts.emplace_back(block_slice(w, l, name));
  return {nn::AllToShardedLinear(std::move(parts), group), nn::ShardedToAllLinear(nn::Linear(block_slice(w, l, "wo")), group)};
}

std::unique_ptr<nn::TrainableFeedForward> LlamaCore::load_f32_feed_forward(const WeightSource& w, int l) const {
  const std::string p = "layers." + std::to_string(l) + ".";
  const LlamaConfig& c = config;
  if (c.is_moe_layer(l)) {
    const nn::MoeSizes sizes = moe_sizes();
    const int64_t C = sizes.dim, FE = sizes.hidden, E = sizes.n_experts;
    auto moe = std::make_unique<nn::MoeFeedForward>(sizes, checked_values(w, p + "router", E * C),
                                                    checked_values(w, p + "experts.w1", E * FE * C),
                                                    checked_values(w, p + "experts.w2", E * C * FE),
                                                    checked_values(w, p + "experts.w3", E * FE * C), expert_group, group, p);
    for (const char* name : {"router", "experts.w1", "experts.w2", "experts.w3"}) w.release_pages(p + name);
    return moe;
  }
  std::vector<dist::Range> ranges;
  for (const auto& q : all_plans) ranges.push_back(q.ffn);
  return std::make_unique<nn::SwiGluFeedForward>(block_slice(w, l, "w1"), block_slice(w, l, "w3"), block_slice(w, l, "w2"),
                                                 group, p, std::move(ranges), c.hidden_dim);
}

QkvExtras LlamaCore::load_qkv_extras(const WeightSource& w, int l) const {
  QkvExtras e;
  if (config.qkv_bias) {
    std::vector<float> bias;
    for (const char* name : {"bq", "bk", "bv"}) {
      const Tensor part = block_slice(w, l, name);
      bias.insert(bias.end(), part.span().begin(), part.span().end());
    }
    e.bias = Tensor({static_cast<int64_t>(bias.size())}, bias);
  }
  if (config.qk_norm) {
    e.q_norm = block_slice(w, l, "q_norm");
    e.k_norm = block_slice(w, l, "k_norm");
  }
  return e;
}

void LlamaCore::finish_qkv(float* qkv, int64_t N, const QkvExtras& e) const {
  const nn::AttentionShape shape = attention_shape();
  const int64_t QKV = shape.qkv_dim();
  if (!e.bias.empty())
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < QKV; ++i) qkv[n * QKV + i] += e.bias[i];
  if (e.q_norm.empty()) return;
  for (int64_t n = 0; n < N; ++n) {  // every head a row of HS
    float* q = qkv + n * QKV;
    nn::rmsnorm_forward(q, nullptr, q, e.q_norm.data(), shape.heads, shape.head_size, config.norm_eps);
    float* k = q + shape.q_dim();
    nn::rmsnorm_forward(k, nullptr, k, e.k_norm.data(), shape.kv_heads, shape.head_size, config.norm_eps);
  }
}

}  // namespace tpcli::model
