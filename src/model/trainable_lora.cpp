// tpcli::model — the trainable model's LoRA adapters (see trainable_llama.h, nn/lora.h): which
// linears they sit on, how each is split, their initialisation and their parameter binding.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/trainable_llama.h"
#include "model/trainable_llama_layers.h"

namespace tpcli::model {

using tensor::Tensor;

namespace {

// The linears LoRA adapts (model/block_matrices.h: those with a PEFT name) in the order the
// backward finishes them: the feed-forward (w2, then w1|w3), then attention (wo, then wq|wk|wv).
// How each is split, and its part of an AllToSharded linear, are the table's.
constexpr Matrix SITES[] = {Matrix::W2, Matrix::W1, Matrix::W3, Matrix::Wo, Matrix::Wq, Matrix::Wk, Matrix::Wv};

std::optional<Matrix> site_of(const std::string& target) {
  const auto m = matrix_named(target);
  if (!m || !facts(*m).peft) return std::nullopt;
  return m;
}

// PEFT's initialisation of A, kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(IN), 1/sqrt(IN)), drawn for
// the whole [r, IN] matrix from (seed, name): every mesh starts from the same adapters.
// A random stream named by (seed, name).
uint64_t stream_of(uint64_t seed, const std::string& name) {
  uint64_t key = nn::mix64(seed);
  for (char c : name) key = nn::mix64(key ^ static_cast<unsigned char>(c));
  return key;
}

Tensor initial_lora_a(uint64_t seed, const std::string& name, int64_t r, int64_t IN) {
  const uint64_t key = stream_of(seed, name);
  const float bound = 1.0f / std::sqrt(static_cast<float>(IN));
  Tensor a({r, IN});
  for (int64_t i = 0; i < r * IN; ++i) {
    const double u = static_cast<double>(nn::mix64(key + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;  // [0, 1)
    a[i] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
  return a;
}

// Columns `r` of a [rows, cols] matrix.
Tensor columns(const Tensor& m, dist::Range r) {
  return nn::slice_columns(m.data(), m.dim(0), m.dim(1), {r});
}

}  // namespace

std::vector<ParamSpec> lora_parameters(const LlamaConfig& c, const LoraOptions& o) {
  if (o.rank < 1) throw std::invalid_argument("llama: LoRA rank " + std::to_string(o.rank) + " must be at least 1");
  if (o.last_layers < 0 || o.last_layers > c.n_layers)
    throw std::invalid_argument("llama: LoRA layers = " + std::to_string(o.last_layers) + " outside 0.." +
                                std::to_string(c.n_layers));
  for (const std::string& t : o.targets)
    if (!site_of(t)) throw std::invalid_argument("llama: '" + t + "' is not a linear LoRA can adapt");
  const int first = o.last_layers == 0 ? 0 : c.n_layers - o.last_layers;
  const int64_t r = o.rank;
  std::vector<ParamSpec> specs;
  for (int l = c.n_layers - 1; l >= first; --l)
    for (Matrix m : SITES) {
      const MatrixFacts& site = facts(m);
      if (std::ranges::find(o.targets, std::string(site.name)) == o.targets.end()) continue;
      if (!holds(c, l, m)) continue;  // a MoE block's experts take no adapters
      const BlockKey key{l, m};
      const std::string name = tensor_name(key);
      const tensor::Shape shape = block_shape(m, c);
      const int64_t OUT = shape[0], IN = shape[1];
      const ShardedDim dim = site.sharded_dim;
      const bool kv = !site.columns && dim == ShardedDim::KvHeads;
      specs.push_back({name + ".lora_a", {r, IN}, site.columns ? Split::Columns : Split::Replicated, true, false, false,
                       site.columns ? dim : ShardedDim::None, key});
      specs.push_back({name + ".lora_b", {OUT, r}, site.columns ? Split::Replicated : Split::Rows, true, false, kv,
                       site.columns ? ShardedDim::None : dim, key});
    }
  if (specs.empty())
    throw std::invalid_argument("llama: the LoRA targets adapt nothing in the last " +
                                std::to_string(c.n_layers - first) +
                                " blocks (their feed-forwards are mixtures of experts, which take no adapters)");
  return specs;
}

namespace {

// f(gate_up, down) on the dense SwiGLU of a block, f32 or packed (LoRA takes no MoE block).
template <class F>
decltype(auto) with_swiglu(nn::TrainableFeedForward& ffn, F&& f) {
  if (auto* packed = dynamic_cast<nn::QuantizedSwiGluFeedForward*>(&ffn)) return f(packed->gate_up(), packed->down());
  auto& dense = dynamic_cast<nn::SwiGluFeedForward&>(ffn);
  return f(dense.gate_up(), dense.down());
}

// Sets `ad` on the site's linear of block L: ShardedToAll ones (wo, w2) take one adapter,
// AllToSharded ones (wq|wk|wv, w1|w3) one per part.
template <class Layer>
void set_on(const MatrixFacts& site, Layer& L, nn::LoraAdapter ad) {
  if (site.sharded_dim != ShardedDim::Hidden)
    return L.visit([&](auto& attention) {
      if (site.columns) attention.wo.set_adapter(std::move(ad));
      else attention.qkv.set_adapter(site.part, std::move(ad));
    });
  with_swiglu(*L.ffn, [&](auto& gate_up, auto& down) {
    if (site.columns) down.set_adapter(std::move(ad));
    else gate_up.set_adapter(site.part, std::move(ad));
  });
}

}  // namespace

void TrainableLlama::add_adapters(const LoraOptions& o) {
  for (Layer& L : layers_) {
    if (auto* f32 = std::get_if<F32AttentionLinears>(&L.linears)) {  // a packed base has no gradients to switch off
      f32->qkv.freeze();
      f32->wo.freeze();
    }
    if (auto* dense = dynamic_cast<nn::SwiGluFeedForward*>(L.ffn.get())) {
      dense->gate_up().freeze();
      dense->down().freeze();
    }
    if (auto* moe = dynamic_cast<nn::MoeFeedForward*>(L.ffn.get())) moe->freeze();
  }
  if (!head_->packed_embedding) head_->classifier().set_frozen(true);
  for (size_t i = 0; i < lora_specs_.size(); i += 2) {  // A, then B
    const ParamSpec& a_spec = lora_specs_[i];
    const BlockKey key = *a_spec.block;
    const MatrixFacts& site = facts(key.matrix);
    Layer& L = layers_[static_cast<size_t>(key.layer)];
    const int64_t r = o.rank, OUT = lora_specs_[i + 1].shape[0];
    const dist::Range mine = core_.plan.range_of(site.sharded_dim);
    const std::string name = tensor_name(key);  // names A's and the dropout's random streams
    Tensor a = initial_lora_a(o.seed, name, r, a_spec.shape[1]);
    nn::LoraAdapter ad = site.columns ? nn::make_lora_adapter(columns(a, mine), Tensor({OUT, r}), o.alpha)
                                      : nn::make_lora_adapter(std::move(a), Tensor({mine.count, r}), o.alpha);
    ad.dropout = static_cast<float>(o.dropout);
    ad.stream = stream_of(o.seed ^ 0x64726f70ULL, name);  // not A's stream
    ad.column_offset = site.columns ? mine.offset : 0;
    set_on(site, L, std::move(ad));
  }
}

nn::LoraAdapter* TrainableLlama::adapter(size_t l, Matrix target) {
  const MatrixFacts* site = &facts(target);
  Layer& L = layers_.at(l);
  if (site->sharded_dim != ShardedDim::Hidden)
    return L.visit([&](auto& linears) { return site->columns ? linears.wo.adapter() : linears.qkv.adapter(site->part); });
  return with_swiglu(*L.ffn, [&](auto& gate_up, auto& down) {
    return site->columns ? down.adapter() : gate_up.adapter(site->part);
  });
}

std::vector<Tensor> TrainableLlama::local_parts(const WeightSource& full, const std::string& prefix) const {
  std::vector<Tensor> out;
  for (const Parameter& p : parameters()) {
    const ParamSpec& spec = *p.spec;
    const std::string name = prefix + spec.name;
    if (spec.expert) throw std::invalid_argument("llama: slicing '" + name + "': experts are dealt out by the MoE layer");
    const int64_t rows = spec.shape[0], cols = tensor::numel(spec.shape) / rows;
    const std::span<const float> values = full.get(name);  // throws naming it when missing
    if (static_cast<int64_t>(values.size()) != rows * cols)
      throw std::invalid_argument("llama: '" + name + "' holds " + std::to_string(values.size()) +
                                  " values, the model's is " + tensor::to_string(spec.shape));
    if (spec.split == Split::Replicated)
      out.emplace_back(spec.shape, std::vector<float>(values.begin(), values.end()));
    else if (spec.split == Split::Rows)
      out.push_back(nn::slice_rows(values.data(), cols, core_.plan.range_of(spec.sharded_dim)));
    else
      out.push_back(nn::slice_columns(values.data(), rows, cols, {core_.plan.range_of(spec.sharded_dim)}));
  }
  return out;
}

void TrainableLlama::load_parameters(const WeightSource& full) {
  const std::vector<Tensor> parts = local_parts(full);
  for (size_t i = 0; i < parts.size(); ++i) std::ranges::copy(parts[i].span(), parameters()[i].value->span().begin());
}

void TrainableLlama::set_adapter_pass(uint64_t seed, int64_t row_offset) {
  for (nn::LoraAdapter* ad : adapters_) {
    ad->pass_seed = seed;
    ad->row_offset = row_offset;
  }
}

// The adapters of block l finish with its backward: stage L - l, as the base's weights would.
void TrainableLlama::bind_adapters() {
  const int L = static_cast<int>(layers_.size());
  for (size_t i = 0; i < lora_specs_.size(); i += 2) {  // A, then B
    const auto [l, target] = *lora_specs_[i].block;
    nn::LoraAdapter* ad = adapter(static_cast<size_t>(l), target);
    adapters_.push_back(ad);
    binding_.bind(L - l, lora_specs_[i], ad->a, ad->a_grad);
    binding_.bind(L - l, lora_specs_[i + 1], ad->b, ad->b_grad);
  }
  binding_.lay_out(lora_specs_);
}

}  // namespace tpcli::model
