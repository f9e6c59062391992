// tpcli::model — the core both Llama roles share (see llama_core.h).
#include "model/llama_core.h"

#include <numeric>
#include <stdexcept>
#include <utility>

#include "nn/gather.h"
#include "nn/linear.h"
#include "nn/moe.h"
#include "nn/rmsnorm.h"
#include "model/packed_weights.h"

namespace tpcli::model {

using tensor::Tensor;

LlamaCore::LlamaCore(LlamaConfig c, dist::Group tensor_group, dist::Group experts, std::vector<ShardPlan> plans)
    : config(std::move(c)), group(std::move(tensor_group)), expert_group(std::move(experts)), all_plans(std::move(plans)) {
  config.validate();
  specs = llama_parameters(config);
  if (all_plans.empty()) all_plans = plan_all_shards(config, group.size());
  if (static_cast<int>(all_plans.size()) != group.size())
    throw std::logic_error("llama: " + std::to_string(all_plans.size()) + " shard plans for a tensor group of " +
                           std::to_string(group.size()) + " devices");
  plan = all_plans[static_cast<size_t>(group.rank())];
  const int kv_mul = config.n_heads / config.n_kv_heads;
  for (int h = 0; h < plan.heads.count; ++h) kv_of.push_back(plan.kv_head_of(h, kv_mul));
  rope = nn::RopeTable(config.seq_len, config.head_size(), config.rope_theta, config.rope_scaling, config.rope_freq_factors);
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

Tensor LlamaCore::block_slice(const WeightSource& w, BlockKey key) const {
  return local_slice(w, tensor_name(key));
}

F32AttentionLinears LlamaCore::load_f32_attention(const WeightSource& w, int l) const {
  std::vector<nn::Linear> parts;
  for (Matrix m : linear_parts(Matrix::Wq)) parts.emplace_back(block_slice(w, {l, m}));
  return {nn::AllToShardedLinear(std::move(parts), group), nn::ShardedToAllLinear(nn::Linear(block_slice(w, {l, Matrix::Wo})), group)};
}

std::unique_ptr<nn::TrainableFeedForward> LlamaCore::load_f32_feed_forward(const WeightSource& w, int l) const {
  const LlamaConfig& c = config;
  if (c.is_moe_layer(l)) {
    const nn::MoeSizes sizes = moe_sizes();
    const int64_t C = sizes.dim, FE = sizes.hidden, E = sizes.n_experts;
    const auto name = [l](Matrix m) { return tensor_name({l, m}); };
    auto moe = std::make_unique<nn::MoeFeedForward>(sizes, checked_values(w, name(Matrix::Router), E * C),
                                                    checked_values(w, name(Matrix::ExpertsW1), E * FE * C),
                                                    checked_values(w, name(Matrix::ExpertsW2), E * C * FE),
                                                    checked_values(w, name(Matrix::ExpertsW3), E * FE * C), expert_group, group,
                                                    block_prefix(l));
    for (Matrix m : {Matrix::Router, Matrix::ExpertsW1, Matrix::ExpertsW2, Matrix::ExpertsW3}) w.release_pages(name(m));
    return moe;
  }
  std::vector<dist::Range> ranges;
  for (const auto& q : all_plans) ranges.push_back(q.ffn);
  return std::make_unique<nn::SwiGluFeedForward>(block_slice(w, {l, Matrix::W1}), block_slice(w, {l, Matrix::W3}),
                                                 block_slice(w, {l, Matrix::W2}), group, block_prefix(l), std::move(ranges),
                                                 c.hidden_dim);
}

QkvExtras LlamaCore::load_qkv_extras(const WeightSource& w, int l) const {
  QkvExtras e;
  if (config.qkv_bias) {
    std::vector<float> bias;
    for (Matrix m : {Matrix::Bq, Matrix::Bk, Matrix::Bv}) {
      const Tensor part = block_slice(w, {l, m});
      bias.insert(bias.end(), part.span().begin(), part.span().end());
    }
    e.bias = Tensor({static_cast<int64_t>(bias.size())}, bias);
  }
  if (config.qk_norm) {
    e.q_norm = block_slice(w, {l, Matrix::QNorm});
    e.k_norm = block_slice(w, {l, Matrix::KNorm});
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


// ---- packed (frozen) layers ----

nn::QuantizedLinear packed_rows(const WeightSource& w, const std::string& name, int64_t R, int64_t K, dist::Range r) {
  return nn::QuantizedLinear(load_packed(w, name, R, K, r.offset, r.count));
}

nn::QuantizedLinear packed_columns(const WeightSource& w, const std::string& name, int64_t R, int64_t K, dist::Range c) {
  return nn::QuantizedLinear(load_packed(w, name, R, K, 0, R, {{c.offset, c.count}}));
}

// The ShardedToAll products (wo, w2) sum over their input columns in lanes (nn/quantized_linear.h):
// K cut into as many equal lanes of whole `unit`s as a power of two up to 8 allows, the same cut
// on every device count.
int64_t lane_width(int64_t K, int64_t unit) {
  for (int64_t lanes : {8, 4, 2})
    if (K % (lanes * unit) == 0) return K / lanes;
  return K;
}

// Whether columns r are a whole subtree of the lanes: a power-of-two run of lanes that starts at a
// multiple of its length.
bool whole_subtree(dist::Range r, int64_t width) {
  if (r.count == 0 || r.offset % width != 0 || r.count % width != 0) return false;
  const int64_t n = r.count / width;
  return (n & (n - 1)) == 0 && (r.offset / width) % n == 0;
}

// The unit a lane of parameter `name`'s columns is made of: `unit`, and whole quantization groups.
int64_t lane_unit(const WeightSource& w, const std::string& name, int64_t unit) {
  const tensor::WeightFormat f = stored_format(w, name);
  return f.quantized() ? std::lcm(unit, f.group_size) : unit;
}

// Rows `rows` and columns `mine` of `name` [R, K] as stored. Columns that cut its quantization
// groups (wo's local heads' rows; w2's FFN rows where the shard plan knows no group, as in a GGUF
// file whose block sizes differ by tensor) keep the whole groups they touch, their input placed
// among zeros (nn::QuantizedLinear), so every device count works and no f32 copy is made.
nn::QuantizedLinear packed_part(const WeightSource& w, const std::string& name, int64_t R, int64_t K, dist::Range rows,
                                dist::Range mine) {
  const dist::Range held = held_columns(stored_format(w, name), mine);
  tensor::PackedMatrix part = load_packed(w, name, R, K, rows.offset, rows.count, {{held.offset, held.count}});
  if (held.count == mine.count) return nn::QuantizedLinear(std::move(part));
  return nn::QuantizedLinear(std::move(part), mine.offset - held.offset, mine.count);
}

namespace {

// ShardedToAll weight `name` [R, K] of which this device holds columns `mine`: its lanes, each its
// own matrix, when they are a whole subtree; else `whole()`, the columns in one chain.
template <class Whole>
nn::QuantizedShardedToAllLinear lanes_or(const WeightSource& w, const std::string& name, int64_t R, int64_t K, dist::Range mine,
                                          int64_t unit, const dist::Group& group, Whole whole) {
  const int64_t width = lane_width(K, lane_unit(w, name, unit));
  if (!whole_subtree(mine, width)) return nn::QuantizedShardedToAllLinear(whole(), group);
  std::vector<nn::QuantizedLinear> lanes;
  for (int64_t c = mine.offset; c < mine.offset + mine.count; c += width) lanes.push_back(packed_columns(w, name, R, K, {c, width}));
  return nn::QuantizedShardedToAllLinear(std::move(lanes), group);
}


}  // namespace

// wo's columns are the local heads' rows, in lanes of whole heads.
nn::QuantizedShardedToAllLinear LlamaCore::load_wo(const WeightSource& weights, int l) const {
  const std::string name = tensor_name({l, Matrix::Wo});
  const int64_t C = config.dim, Q = config.q_dim();
  const dist::Range q_rows = plan.q_rows();
  return lanes_or(weights, name, C, Q, q_rows, config.head_size(), group,
                  [&] { return packed_part(weights, name, C, Q, {0, C}, q_rows); });
}

// The dense SwiGLU, its matrices as stored (f32 as f32): w1, w3 by this device's FFN rows, w2 by
// those columns, in lanes.
std::unique_ptr<nn::QuantizedSwiGluFeedForward> LlamaCore::load_dense_ffn(const WeightSource& weights, int l) const {
  const std::string w1 = tensor_name({l, Matrix::W1}), w2 = tensor_name({l, Matrix::W2}), w3 = tensor_name({l, Matrix::W3});
  const int64_t C = config.dim, F = config.hidden_dim;
  const dist::Range ffn = plan.ffn;
  return std::make_unique<nn::QuantizedSwiGluFeedForward>(
      nn::QuantizedAllToShardedLinear({packed_rows(weights, w1, F, C, ffn), packed_rows(weights, w3, F, C, ffn)}, group),
      lanes_or(weights, w2, C, F, ffn, 1, group, [&] { return packed_part(weights, w2, C, F, {0, C}, ffn); }));
}

// wq|wk|wv as stored, this device's rows of each.
nn::QuantizedAllToShardedLinear LlamaCore::load_packed_qkv(const WeightSource& weights, int l) const {
  std::vector<nn::QuantizedLinear> parts;
  for (Matrix m : linear_parts(Matrix::Wq)) {
    const tensor::Shape shape = block_shape(m, config);
    parts.push_back(packed_rows(weights, tensor_name({l, m}), shape[0], shape[1], plan.range_of(facts(m).sharded_dim)));
  }
  return nn::QuantizedAllToShardedLinear(std::move(parts), group);
}

}  // namespace tpcli::model
