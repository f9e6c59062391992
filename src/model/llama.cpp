#include "model/llama.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>

#include "nn/attention.h"
#include "nn/collective_matmul.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/gather.h"
#include "nn/rmsnorm.h"
#include "nn/sequence_parallel.h"
#include "model/block_activations.h"
#include "model/packed_weights.h"
#include "tensor/aligned_storage.h"
#include "tensor/blas.h"

namespace tpcli::model {

using tensor::Tensor;

namespace {
// Attention's two linears, all of one kind: f32 (trainable) or packed (a frozen checkpoint's
// quantized or 16-bit weights, forward only).
template <class AllToSharded, class ShardedToAll>
struct AttentionLinears {
  AllToSharded qkv;  // parts: wq [QL, C], wk [KVL, C], wv [KVL, C]
  ShardedToAll wo;   // [C, QL]
};
using TrainableLinears = AttentionLinears<nn::AllToShardedLinear, nn::ShardedToAllLinear>;
using PackedLinears = AttentionLinears<nn::QuantizedAllToShardedLinear, nn::QuantizedShardedToAllLinear>;
}  // namespace

struct Llama::Layer {
  Tensor attention_norm, attention_norm_grad;  // [C]
  Tensor ffn_norm, ffn_norm_grad;              // [C]
  std::variant<TrainableLinears, PackedLinears> linears;  // frozen models: packed
  // Every forward runs ffn; training runs trainable_ffn, the same layer with its backward (f32
  // models: dense SwiGLU or MoE, make_feed_forward). Frozen models' is forward only (null here).
  std::unique_ptr<nn::FeedForward> ffn;
  nn::TrainableFeedForward* trainable_ffn = nullptr;
  std::vector<float> k_cache, v_cache;         // [S, KVL]

  void set_trainable_ffn(std::unique_ptr<nn::TrainableFeedForward> f) {
    trainable_ffn = f.get();
    ffn = std::move(f);
  }
  // Training's view of the attention linears: f32 models only (training calls require_trainable first).
  TrainableLinears& trainable() { return std::get<TrainableLinears>(linears); }
  void qkv_forward(float* out, const float* inp, int64_t N) const {
    std::visit([&](const auto& l) { l.qkv.forward(out, inp, N); }, linears);
  }
  void wo_forward(float* out, const float* inp, int64_t N) {
    std::visit([&](auto& l) { l.wo.forward(out, inp, N); }, linears);
  }
  // The linears' weights as this device holds them.
  int64_t linears_bytes() const {
    if (const auto* packed = std::get_if<PackedLinears>(&linears)) return packed->qkv.bytes() + packed->wo.bytes();
    const auto& f32 = std::get<TrainableLinears>(linears);
    int64_t n = f32.wo.local().weight().numel();
    for (int i = 0; i < f32.qkv.n_parts(); ++i) n += f32.qkv.part(i).weight().numel();
    return n * static_cast<int64_t>(sizeof(float));
  }
};

// Activations saved by the training forward for the backward.
struct Llama::Acts {
  int64_t B = 0, T = 0;
  struct PerLayer {
    // R = N rows, or this device's NL under sequence parallelism (Llama::sequence_rows).
    std::vector<float> x_in;   // [R, C] residual stream entering the block
    std::vector<float> xn1;    // [R, C] attention_norm output
    std::vector<float> rstd1;  // [R]
    std::vector<float> qkv;    // [N, QL+2KVL] after RoPE
    std::vector<float> att;    // [B, NH_L, T, T] softmax probabilities
    std::vector<float> y;      // [N, QL] attention output (wo input)
    std::vector<float> xm;     // [R, C] residual after attention
    std::vector<float> xn2;    // [R, C] ffn_norm output
    std::vector<float> rstd2;  // [R]
  };
  std::vector<PerLayer> layers;
  std::vector<float> x_final;  // [R, C] residual stream after the last block
  std::vector<float> xf;       // [N, C] final norm output (all rows: the classifier's input)
  std::vector<float> rstdf;    // [R]
  std::vector<float> probs;    // [N, VL] softmax (this device's vocabulary columns)
  std::vector<float> losses;   // [N]
  std::vector<float> tmp;      // [R, C] scratch
};

namespace {

Tensor copy_full(const WeightSource& w, const ParamSpec& spec) {
  auto src = w.get(spec.name);
  if (static_cast<int64_t>(src.size()) != tensor::numel(spec.shape))
    throw std::invalid_argument("llama: parameter '" + spec.name + "' has " + std::to_string(src.size()) +
                                " values, expected " + tensor::to_string(spec.shape));
  return Tensor(spec.shape, src);
}

std::span<const float> checked(const WeightSource& w, const std::string& name, int64_t expected) {
  auto src = w.get(name);
  if (static_cast<int64_t>(src.size()) != expected)
    throw std::invalid_argument("llama: parameter '" + name + "' has " + std::to_string(src.size()) +
                                " values, expected " + std::to_string(expected));
  return src;
}

// This device's part of a parameter (rows or columns by its spec's sharded dimension, the whole
// of a replicated one), from the full tensor in `w`.
Tensor local_slice(const WeightSource& w, const ParamSpec& spec, const ShardPlan& plan) {
  const int64_t rows = spec.shape[0], cols = tensor::numel(spec.shape) / rows;
  if (spec.split == Split::Replicated) return copy_full(w, spec);
  const std::span<const float> full = checked(w, spec.name, rows * cols);
  switch (spec.split) {
    case Split::Replicated: break;
    case Split::Rows: return nn::slice_rows(full.data(), cols, plan.range_of(spec.sharded_dim));
    case Split::Columns: return nn::slice_columns(full.data(), rows, cols, {plan.range_of(spec.sharded_dim)});
  }
  throw std::logic_error("llama: parameter '" + spec.name + "' has no split");
}

// The feed-forward of block `l`. MoE: the MoE helper's layer (nn/moe.h) is plugged in here.
using SpecOf = std::function<const ParamSpec&(const std::string& name)>;

std::unique_ptr<nn::TrainableFeedForward> make_feed_forward(const WeightSource& w, const LlamaConfig& c, int l,
                                                            const ShardPlan& plan, const std::vector<ShardPlan>& all,
                                                            dist::Group group, dist::Group experts, const SpecOf& spec) {
  const std::string p = "layers." + std::to_string(l) + ".";
  if (c.is_moe()) {
    const int64_t C = c.dim, FE = c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim, E = c.n_experts;
    const nn::MoeSizes sizes{C, FE, c.n_experts, c.top_k, c.moe_aux_loss, c.capacity_factor};
    return std::make_unique<nn::MoeFeedForward>(sizes, checked(w, p + "router", E * C),
                                                checked(w, p + "experts.w1", E * FE * C),
                                                checked(w, p + "experts.w2", E * C * FE),
                                                checked(w, p + "experts.w3", E * FE * C), experts, group, p);
  }
  std::vector<dist::Range> ranges;
  for (const auto& q : all) ranges.push_back(q.ffn);
  Tensor w1 = local_slice(w, spec(p + "w1"), plan), w3 = local_slice(w, spec(p + "w3"), plan),
         w2 = local_slice(w, spec(p + "w2"), plan);
  return std::make_unique<nn::SwiGluFeedForward>(std::move(w1), std::move(w3), std::move(w2), group, p,
                                                 std::move(ranges), c.hidden_dim);
}

// The MoE feed-forward of block `l` of a frozen checkpoint: the router in f32, this device's
// experts (of the expert group) with its rows of FE (of the tensor group, in whole groups:
// shard_plan.h) in their stored format. experts.w1/w3 are [E*FE, C] matrices, experts.w2 [E*C, FE].
std::unique_ptr<nn::FeedForward> make_packed_moe(const WeightSource& w, const LlamaConfig& c, int l,
                                                 const ShardPlan& plan, dist::Group group, dist::Group experts) {
  const std::string p = "layers." + std::to_string(l) + ".";
  const int64_t C = c.dim, FE = c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim, E = c.n_experts;
  const nn::MoeSizes sizes{C, FE, c.n_experts, c.top_k, c.moe_aux_loss, c.capacity_factor};
  const dist::Range mine = nn::local_experts(c.n_experts, experts.size(), experts.rank()), h = plan.expert_ffn;
  std::vector<nn::PackedExpert> local;
  for (int64_t e = mine.offset; e < mine.offset + mine.count; ++e)
    local.push_back({nn::QuantizedLinear(load_packed(w, p + "experts.w1", E * FE, C, e * FE + h.offset, h.count)),
                     nn::QuantizedLinear(load_packed(w, p + "experts.w3", E * FE, C, e * FE + h.offset, h.count)),
                     nn::QuantizedLinear(load_packed(w, p + "experts.w2", E * C, FE, e * C, C, {{h.offset, h.count}}))});
  Tensor router({E, C}, checked(w, p + "router", E * C));
  return std::make_unique<nn::QuantizedMoeFeedForward>(sizes, std::move(router), std::move(local), std::move(experts),
                                                       std::move(group));
}

// The KV cache is sized by seq_len alone (read from a file's metadata): a seq_len within the
// limits can still ask for more memory than the machine has, and zero-filling it would end in the
// kernel's OOM killer rather than an error.
void require_memory_for_kv_cache(const LlamaConfig& c, int64_t kv_rows_local) {
  const double bytes = 2.0 * c.n_layers * static_cast<double>(c.seq_len) * static_cast<double>(kv_rows_local) * sizeof(float);
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (memory > 0 && bytes > memory)
    throw std::runtime_error("llama: the KV cache needs " + std::to_string(static_cast<int64_t>(bytes / 1e6)) +
                             " MB per device (n_layers " + std::to_string(c.n_layers) + " x seq_len " +
                             std::to_string(c.seq_len) + "), more than this machine's " +
                             std::to_string(static_cast<int64_t>(memory / 1e6)) + " MB: lower seq_len");
}

}  // namespace

Llama::~Llama() = default;
Llama::Llama(Llama&&) noexcept = default;
Llama& Llama::operator=(Llama&&) noexcept = default;

Llama Llama::for_inference(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group) {
  const tensor::HugePageArena weights_on_huge_pages;
  return Llama(weights, std::move(tensor_group), std::move(expert_group));
}

Llama::Llama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group)
    : config_(weights.config()), group_(std::move(tensor_group)), expert_group_(std::move(expert_group)) {
  config_.validate();
  specs_ = llama_parameters(config_);
  all_plans_ = plan_all_shards(config_, group_.size());
  plan_ = all_plans_[static_cast<size_t>(group_.rank())];
  const int64_t C = config_.dim, HS = config_.head_size(), S = config_.seq_len;
  const int kv_mul = config_.n_heads / config_.n_kv_heads;
  for (int h = 0; h < plan_.heads.count; ++h) kv_of_.push_back(plan_.kv_head_of(h, kv_mul));
  rope_ = nn::RopeTable(config_.seq_len, static_cast<int>(HS), config_.rope_theta, config_.rope_scaling);

  const auto spec = [this](const std::string& name) -> const ParamSpec& { return spec_of(name); };
  std::vector<dist::Range> vocab_ranges;  // [T] every device's vocabulary rows
  for (const auto& q : all_plans_) vocab_ranges.push_back(q.vocab);
  frozen_ = holds_packed_weights(weights);
  if (!frozen_) {
    embedding_ = nn::VocabParallelEmbedding(local_slice(weights, spec("tok_embeddings"), plan_), std::move(vocab_ranges), group_);
    if (!config_.shared_classifier) output_ = nn::Linear(local_slice(weights, spec("output"), plan_));
  }
  norm_ = local_slice(weights, spec("norm"), plan_);

  const dist::Range kv_rows = plan_.kv_rows();
  require_memory_for_kv_cache(config_, kv_rows.count);
  layers_.resize(static_cast<size_t>(config_.n_layers));
  for (int l = 0; l < config_.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Layer& L = layers_[static_cast<size_t>(l)];
    L.attention_norm = local_slice(weights, spec(p + "attention_norm"), plan_);
    L.ffn_norm = local_slice(weights, spec(p + "ffn_norm"), plan_);
    L.attention_norm_grad = Tensor({C});
    L.ffn_norm_grad = Tensor({C});
    L.k_cache.assign(static_cast<size_t>(S * kv_rows.count), 0.0f);
    L.v_cache.assign(static_cast<size_t>(S * kv_rows.count), 0.0f);
    if (frozen_) continue;
    std::vector<nn::Linear> parts;
    for (const char* name : {"wq", "wk", "wv"}) parts.emplace_back(local_slice(weights, spec(p + name), plan_));
    nn::AllToShardedLinear qkv(std::move(parts), group_);
    nn::ShardedToAllLinear wo(nn::Linear(local_slice(weights, spec(p + "wo"), plan_)), group_);
    L.linears = TrainableLinears{std::move(qkv), std::move(wo)};
    L.set_trainable_ffn(make_feed_forward(weights, config_, l, plan_, all_plans_, group_, expert_group_, spec));
  }
  if (frozen_) load_packed_layers(weights, std::move(vocab_ranges));
  norm_grad_ = Tensor({C});

  logits_local_.resize(static_cast<size_t>(plan_.vocab.count));
  logits_.resize(static_cast<size_t>(config_.vocab_size));
  for (const auto& q : all_plans_) vocab_counts_.push_back(q.vocab.count);
}

// ---- inference ----

void Llama::embed(float* x, std::span<const int> tokens) {
  if (frozen_) embedding_packed_.forward(x, tokens);
  else embedding_.forward(x, tokens);
}

// logits_local[N, VL] = x[N, C] @ W_cls[VL, C]^T (the classifier split by vocabulary rows).
void Llama::classifier_forward(float* logits_local, const float* x, int64_t N) {
  const int64_t VL = plan_.vocab.count;
  if (!frozen_) classifier().forward(logits_local, x, N);
  else if (config_.shared_classifier) embedding_packed_.rows().matmul(logits_local, x, N, 0, VL, VL);
  else output_packed_.forward(logits_local, x, N);
}

// Frozen checkpoints: every matrix in its stored format (f32 ones as f32 PackedMatrix), this
// device's rows or whole-group columns only; the embedding by vocabulary rows, like the f32 one.
void Llama::load_packed_layers(const WeightSource& weights, std::vector<dist::Range> vocab_ranges) {
  const int64_t C = config_.dim, Q = config_.q_dim(), KV = config_.kv_dim(), F = config_.hidden_dim,
                V = config_.vocab_size;
  const dist::Range q_rows = plan_.q_rows(), kv_rows = plan_.kv_rows();
  auto rows = [&](const std::string& name, int64_t R, int64_t K, dist::Range r) {
    return nn::QuantizedLinear(load_packed(weights, name, R, K, r.offset, r.count));
  };
  auto columns = [&](const std::string& name, int64_t R, int64_t K, dist::Range c) {
    return nn::QuantizedLinear(load_packed(weights, name, R, K, 0, R, {{c.offset, c.count}}));
  };
  // wo's columns are the local heads' rows; a quantized wo whose groups they cut is kept in f32
  // for this device (its slice of the dequantized weight), so every device count works.
  auto wo_columns = [&](const std::string& name) {
    const tensor::WeightFormat f = stored_format(weights, name);
    if (!f.quantized() || (q_rows.offset % f.group_size == 0 && q_rows.count % f.group_size == 0))
      return columns(name, C, Q, q_rows);
    const Tensor local = nn::slice_columns(checked(weights, name, C * Q).data(), C, Q, {q_rows});  // [C, QL]
    return nn::QuantizedLinear(tensor::PackedMatrix::from_f32(local.data(), C, q_rows.count, tensor::WeightFormat::f32()));
  };
  embedding_packed_ = nn::PackedVocabParallelEmbedding(
      load_packed(weights, "tok_embeddings", V, C, plan_.vocab.offset, plan_.vocab.count), std::move(vocab_ranges), group_);
  if (!config_.shared_classifier)
    output_packed_ = nn::QuantizedAllToShardedLinear({rows("output", V, C, plan_.vocab)}, group_);
  for (int l = 0; l < config_.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Layer& L = layers_[static_cast<size_t>(l)];
    L.linears = PackedLinears{
        nn::QuantizedAllToShardedLinear(
            {rows(p + "wq", Q, C, q_rows), rows(p + "wk", KV, C, kv_rows), rows(p + "wv", KV, C, kv_rows)}, group_),
        nn::QuantizedShardedToAllLinear(wo_columns(p + "wo"), group_)};
    if (config_.is_moe()) {  // experts stay packed (nn/moe.h QuantizedMoeFeedForward)
      L.ffn = make_packed_moe(weights, config_, l, plan_, group_, expert_group_);
      continue;
    }
    L.ffn = std::make_unique<nn::QuantizedSwiGluFeedForward>(
        nn::QuantizedAllToShardedLinear({rows(p + "w1", F, C, plan_.ffn), rows(p + "w3", F, C, plan_.ffn)}, group_),
        nn::QuantizedShardedToAllLinear(columns(p + "w2", C, F, plan_.ffn), group_));
  }
}

void Llama::require_trainable(const char* what) const {
  if (frozen_)
    throw std::invalid_argument(std::string("llama: ") + what + ": the model's weights are " +
                                (config_.quantization ? weight_format(*config_.quantization).name() : std::string("16-bit")) +
                                " (frozen); training a quantized model is not supported, train the f32 checkpoint");
}

void Llama::blocks_forward(std::span<const int> tokens, int pos) {
  const int64_t P = static_cast<int64_t>(tokens.size()), C = config_.dim;
  if (P < 1 || pos < 0 || pos + P > config_.seq_len)
    throw std::out_of_range("llama: " + std::to_string(P) + " token(s) at position " + std::to_string(pos) +
                            " outside [0, seq_len = " + std::to_string(config_.seq_len) + ")");
  const nn::AttentionShape shape{static_cast<int>(plan_.heads.count), static_cast<int>(plan_.kv_heads.count),
                                 config_.head_size(), kv_of_};
  const int64_t QL = shape.q_dim(), QKV = shape.qkv_dim();
  auto size = [](std::vector<float>& v, int64_t n) { v.resize(static_cast<size_t>(n)); };
  Run& r = run_;
  size(r.x, P * C); size(r.xb, P * C); size(r.xb2, P * C); size(r.qkv, P * QKV); size(r.y, P * QL);
  size(r.att, P * (pos + P));
  float* x = r.x.data();
  embed(x, tokens);  // all_gather_v of the rows from their owners (frozen: from the packed rows)
  for (auto& L : layers_) {
    // attention rmsnorm, then q, k, v of the local heads (no communication)
    nn::rmsnorm_forward(r.xb.data(), nullptr, x, L.attention_norm.data(), P, C, config_.norm_eps);
    L.qkv_forward(r.qkv.data(), r.xb.data(), P);
    // RoPE on q and k of each row at its position
    for (int64_t n = 0; n < P; ++n) {
      rope_.forward(r.qkv.data() + n * QKV, shape.heads, pos + static_cast<int>(n));
      rope_.forward(r.qkv.data() + n * QKV + QL, shape.kv_heads, pos + static_cast<int>(n));
    }
    // k, v into the cache at pos.., causal attention over the cache
    nn::attention_cached(r.y.data(), r.att.data(), r.qkv.data(), L.k_cache.data(), L.v_cache.data(), pos, P, shape);
    // wo over the local heads' columns, all_sum; residual connection back into x
    L.wo_forward(r.xb2.data(), r.y.data(), P);
    for (int64_t i = 0; i < P * C; ++i) x[i] += r.xb2[static_cast<size_t>(i)];
    // ffn rmsnorm, feed-forward (ends in an all_sum), residual
    nn::rmsnorm_forward(r.xb.data(), nullptr, x, L.ffn_norm.data(), P, C, config_.norm_eps);
    L.ffn->forward(r.xb2.data(), r.xb.data(), P);
    for (int64_t i = 0; i < P * C; ++i) x[i] += r.xb2[static_cast<size_t>(i)];
  }
}

float* Llama::last_logits_local(std::span<const int> tokens, int pos) {
  const int64_t C = config_.dim;
  blocks_forward(tokens, pos);
  float* x = run_.x.data() + (static_cast<int64_t>(tokens.size()) - 1) * C;  // [C] the last position
  nn::rmsnorm_forward(x, nullptr, x, norm_.data(), 1, C, config_.norm_eps);
  // classifier: this device's vocabulary rows (alone, straight into the full logits)
  float* local = group_.size() == 1 ? logits_.data() : logits_local_.data();
  classifier_forward(local, x, 1);
  return local;
}

std::span<const float> Llama::gather_logits(const float* local) {
  if (group_.size() > 1)  // split -> mirrored
    group_.all_gather_v(std::span<const float>(local, static_cast<size_t>(plan_.vocab.count)), logits_, vocab_counts_);
  return logits_;
}

int Llama::argmax_over_devices(const float* local) {
  const int64_t VL = plan_.vocab.count;
  const int64_t best = std::max_element(local, local + VL) - local;  // first maximum, as llama2.c
  const bool finite = std::all_of(local, local + VL, [](float v) { return std::isfinite(v); });
  if (group_.size() == 1) return finite ? static_cast<int>(best) : -1;
  // Reduce (value, token) pairs instead of gathering the logits: 2 floats per device; a device
  // with a non-finite logit sends NaN, so every device returns -1.
  const float mine[2] = {finite ? local[best] : NAN, static_cast<float>(plan_.vocab.offset + best)};
  std::vector<float> all(static_cast<size_t>(2 * group_.size()));  // [T, 2]
  group_.all_gather(mine, all);
  size_t winner = 0;  // devices hold ascending vocabulary ranges: strict > keeps the lowest token on ties
  for (size_t d = 0; d < static_cast<size_t>(group_.size()); ++d) {
    if (std::isnan(all[2 * d])) return -1;
    if (all[2 * d] > all[2 * winner]) winner = d;
  }
  return static_cast<int>(all[2 * winner + 1]);
}

std::span<const float> Llama::forward(int token, int pos) {
  return gather_logits(last_logits_local(std::span<const int>(&token, 1), pos));
}

int Llama::forward_argmax(int token, int pos) {
  return argmax_over_devices(last_logits_local(std::span<const int>(&token, 1), pos));
}

std::span<const float> Llama::prefill(std::span<const int> tokens, int pos) {
  return gather_logits(last_logits_local(tokens, pos));
}

int Llama::prefill_argmax(std::span<const int> tokens, int pos) {
  return argmax_over_devices(last_logits_local(tokens, pos));
}

std::vector<float> Llama::prefill_logits(std::span<const int> tokens, int pos) {
  const int64_t P = static_cast<int64_t>(tokens.size()), C = config_.dim, V = config_.vocab_size;
  blocks_forward(tokens, pos);
  float* x = run_.x.data();  // [P, C]
  nn::rmsnorm_forward(x, nullptr, x, norm_.data(), P, C, config_.norm_eps);
  std::vector<float> local(static_cast<size_t>(P * plan_.vocab.count));  // [P, VL]
  classifier_forward(local.data(), x, P);
  std::vector<dist::Range> cols;
  for (const auto& q : all_plans_) cols.push_back(q.vocab);
  Tensor full = nn::gather_columns(group_, local.data(), cols, P, V);  // [P, V]
  return std::vector<float>(full.span().begin(), full.span().end());
}

// ---- training ----

float Llama::train_forward(std::span<const int> tokens, std::span<const int> targets, int B, int T) {
  const int64_t N = int64_t(B) * T, C = config_.dim, V = config_.vocab_size, VL = plan_.vocab.count;
  if (B < 1 || T < 1 || T > config_.seq_len)
    throw std::invalid_argument("llama: batch " + std::to_string(B) + " x " + std::to_string(T) +
                                " needs B >= 1 and 1 <= T <= seq_len = " + std::to_string(config_.seq_len));
  if (static_cast<int64_t>(tokens.size()) != N || static_cast<int64_t>(targets.size()) != N)
    throw std::invalid_argument("llama: tokens/targets must hold B*T = " + std::to_string(N) + " ids");
  for (int t : targets)
    if (t < 0 || t >= V) throw std::out_of_range("llama: target " + std::to_string(t) + " outside the vocabulary");
  if (!acts_) acts_ = std::make_unique<Acts>();
  Acts& A = *acts_;
  A.B = B;
  A.T = T;
  // Recompute: every block writes its activations into the one scratch entry (layers[L]).
  A.layers.resize(layers_.size() + (recompute_ ? 1 : 0));
  auto size = [](std::vector<float>& v, int64_t n) { v.resize(static_cast<size_t>(n)); };

  const dist::Range rows = sequence_rows(N);
  const int64_t R = rows.count;
  const bool split = rows_split();  // the same on every device (R may not be: uneven rows)
  std::vector<float> x(static_cast<size_t>(N * C));  // [N, C], then [R, C]: the residual stream
  embed(x.data(), tokens);  // all_gather_v of the rows from their owners (frozen: from the packed rows)
  if (split) x = std::vector<float>(x.begin() + rows.offset * C, x.begin() + (rows.offset + R) * C);
  for (size_t l = 0; l < layers_.size(); ++l) {
    A.layers[l].x_in = x;
    block_forward(l, A.layers[l].x_in.data(), x.data(), B, T);
    if (recompute_) layers_[l].ffn->release_activations();
  }
  A.x_final = std::move(x);
  const HeadActivationSizes sizes = head_activation_sizes(config_, plan_, B, T, split);
  size(A.xf, sizes.xf); size(A.rstdf, sizes.rstdf); size(A.probs, sizes.probs); size(A.losses, sizes.losses);
  size(A.tmp, block_activation_sizes(config_, plan_, B, T, split).tmp);
  float* xf_rows = split ? A.tmp.data() : A.xf.data();  // [R, C]
  nn::rmsnorm_forward(xf_rows, A.rstdf.data(), A.x_final.data(), norm_.data(), R, C, config_.norm_eps);
  if (split) nn::all_gather_rows(A.xf.data(), xf_rows, N, C, group_);  // split -> mirrored
  classifier_forward(A.probs.data(), A.xf.data(), N);  // logits, turned into probabilities in place
  float loss = nn::cross_entropy_forward(A.losses.data(), A.probs.data(), A.probs.data(), targets.data(),
                                         plan_.vocab.offset, N, VL, group_);
  for (const auto& L : layers_) loss += L.ffn->aux_loss();
  note_activation_bytes();
  return loss;
}

void Llama::block_forward(size_t l, const float* x_in, float* x_out, int B, int T) {
  Acts& A = *acts_;
  const int64_t N = int64_t(B) * T, C = config_.dim;
  const nn::AttentionShape shape{static_cast<int>(plan_.heads.count), static_cast<int>(plan_.kv_heads.count),
                                 config_.head_size(), kv_of_};
  const int64_t QKV = shape.qkv_dim(), QL = shape.q_dim();
  auto size = [](std::vector<float>& v, int64_t n) { v.resize(static_cast<size_t>(n)); };
  Layer& L = layers_[l];
  auto& a = A.layers[recompute_ ? layers_.size() : l];
  const BlockActivationSizes sizes = block_activation_sizes(config_, plan_, B, T, rows_split());
  const int64_t R = sizes.rows;  // rows of the residual stream here
  size(a.xn1, sizes.xn1); size(a.rstd1, sizes.rstd1); size(a.qkv, sizes.qkv); size(a.att, sizes.att);
  size(a.y, sizes.y); size(a.xm, sizes.xm); size(a.xn2, sizes.xn2); size(a.rstd2, sizes.rstd2); size(A.tmp, sizes.tmp);
  nn::rmsnorm_forward(a.xn1.data(), a.rstd1.data(), x_in, L.attention_norm.data(), R, C, config_.norm_eps);
  if (rows_split())
    nn::all_gather_matmul(a.qkv.data(), a.xn1.data(), N, L.trainable().qkv, group_);  // [R, C] split -> [N, QKV]
  else
    L.qkv_forward(a.qkv.data(), a.xn1.data(), N);
  for (int64_t n = 0; n < N; ++n) {
    const int pos = static_cast<int>(n % T);
    rope_.forward(a.qkv.data() + n * QKV, shape.heads, pos);
    rope_.forward(a.qkv.data() + n * QKV + QL, shape.kv_heads, pos);
  }
  nn::attention_forward(a.y.data(), a.att.data(), a.qkv.data(), B, T, shape);
  if (rows_split())
    nn::matmul_reduce_scatter(A.tmp.data(), a.y.data(), N, L.trainable().wo, group_);  // -> [R, C] split
  else
    L.wo_forward(A.tmp.data(), a.y.data(), N);  // all_sum
  for (int64_t i = 0; i < R * C; ++i) a.xm[i] = x_in[i] + A.tmp[i];
  nn::rmsnorm_forward(a.xn2.data(), a.rstd2.data(), a.xm.data(), L.ffn_norm.data(), R, C, config_.norm_eps);
  if (rows_split())
    L.trainable_ffn->forward_sequence_split(A.tmp.data(), a.xn2.data(), N);  // collective matmuls inside
  else
    L.ffn->forward(A.tmp.data(), a.xn2.data(), N);  // all_sum inside
  for (int64_t i = 0; i < R * C; ++i) x_out[i] = a.xm[i] + A.tmp[i];
}

void Llama::train_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T) {
  Acts& A = *acts_;
  const int64_t N = int64_t(B) * T, C = config_.dim, VL = plan_.vocab.count;

  // softmax cross-entropy, mean over N
  std::vector<float> dlogits(static_cast<size_t>(N * VL), 0.0f);  // [N, VL]
  nn::cross_entropy_backward(dlogits.data(), A.probs.data(), targets.data(), plan_.vocab.offset, N, VL,
                             1.0f / static_cast<float>(N));
  // classifier (AllToSharded by vocab rows): dxf = all_sum(dlogits @ W_cls); dW_cls += dlogits^T xf.
  // Tied: W_cls is this device's rows of the embedding, so its gradient lands on those rows.
  std::vector<float> dxf(static_cast<size_t>(N * C), 0.0f);  // [N, C] partial
  classifier().backward(dxf.data(), dlogits.data(), A.xf.data(), N);
  const int64_t R = sequence_rows(N).count;
  const bool split = rows_split();
  if (split) {  // partial -> split: only this device's rows go on
    std::vector<float> mine(static_cast<size_t>(R * C));  // [R, C]
    nn::reduce_scatter_rows(mine.data(), dxf.data(), N, C, group_);
    dxf = std::move(mine);
  } else {
    group_.all_sum(dxf);  // partial -> mirrored
  }

  std::vector<float> dx(static_cast<size_t>(R * C), 0.0f);    // [R, C] gradient of the residual stream
  nn::rmsnorm_backward(dx.data(), norm_grad_.data(), dxf.data(), A.x_final.data(), norm_.data(), A.rstdf.data(), R, C);
  gradients_ready(head_grads_end_);
  for (size_t li = layers_.size(); li-- > 0;) {
    if (recompute_) {  // the block's activations again, from its saved input (x_out is scratch)
      block_forward(li, A.layers[li].x_in.data(), dxf.data(), B, T);
    }
    block_backward(li, dx.data(), B, T);
    gradients_ready(block_grads_end_[li]);
    if (recompute_) {
      note_activation_bytes();
      layers_[li].ffn->release_activations();
    }
  }
  if (split) {  // split -> mirrored: the embedding's rows are owned by vocabulary, not by position
    std::vector<float> all(static_cast<size_t>(N * C));  // [N, C]
    nn::all_gather_rows(all.data(), dx.data(), N, C, group_);
    dx = std::move(all);
  }
  embedding_.backward(dx.data(), tokens);  // dx is mirrored: each device adds to the rows it owns
  gradients_ready(dense_grads_end_);
}

void Llama::block_backward(size_t li, float* dx, int B, int T) {
  Acts& A = *acts_;
  const int64_t N = int64_t(B) * T, C = config_.dim;
  const nn::AttentionShape shape{static_cast<int>(plan_.heads.count), static_cast<int>(plan_.kv_heads.count),
                                 config_.head_size(), kv_of_};
  const int64_t QKV = shape.qkv_dim(), QL = shape.q_dim(), R = sequence_rows(N).count;
  std::vector<float> dxn(static_cast<size_t>(R * C), 0.0f);    // [R, C]
  std::vector<float> dy(static_cast<size_t>(N * QL), 0.0f);    // [N, QL]
  std::vector<float> dqkv(static_cast<size_t>(N * QKV), 0.0f); // [N, QL+2KVL]
  Layer& L = layers_[li];
  const auto& a = A.layers[recompute_ ? layers_.size() : li];
  const float* x_in = A.layers[li].x_in.data();
  // feed-forward branch: x_out = xm + ffn(ffn_norm(xm))
  if (rows_split())
    L.trainable_ffn->backward_sequence_split(dxn.data(), dx, a.xn2.data(), N);
  else
    L.trainable_ffn->backward(dxn.data(), dx, a.xn2.data(), N);
  nn::rmsnorm_backward(dx, L.ffn_norm_grad.data(), dxn.data(), a.xm.data(), L.ffn_norm.data(), a.rstd2.data(), R, C);
  // attention branch: xm = x_in + wo(attention(rope(qkv(attention_norm(x_in)))))
  TrainableLinears& lin = L.trainable();
  if (rows_split())
    nn::matmul_reduce_scatter_backward(dy.data(), dx, a.y.data(), N, lin.wo, group_);  // all_gather of dx
  else
    lin.wo.backward(dy.data(), dx, a.y.data(), N);
  nn::attention_backward(dqkv.data(), dy.data(), a.qkv.data(), a.att.data(), B, T, shape);
  for (int64_t n = 0; n < N; ++n) {
    const int pos = static_cast<int>(n % T);
    rope_.backward(dqkv.data() + n * QKV, shape.heads, pos);
    rope_.backward(dqkv.data() + n * QKV + QL, shape.kv_heads, pos);
  }
  std::fill(dxn.begin(), dxn.end(), 0.0f);
  if (rows_split())
    nn::all_gather_matmul_backward(dxn.data(), dqkv.data(), a.xn1.data(), N, lin.qkv, group_);  // reduce_scatter
  else
    lin.qkv.backward(dxn.data(), dqkv.data(), a.xn1.data(), N);  // all_sum (sum_gradients)
  nn::rmsnorm_backward(dx, L.attention_norm_grad.data(), dxn.data(), x_in, L.attention_norm.data(), a.rstd1.data(), R, C);
}

bool Llama::rows_split() const { return sequence_parallel_ && group_.size() > 1; }

dist::Range Llama::sequence_rows(int64_t N) const {
  return rows_split() ? dist::even_split(N, group_.size(), group_.rank()) : dist::Range{0, N};
}

void Llama::set_sequence_parallel(bool on) {
  if (on && config_.is_moe())
    throw std::invalid_argument("llama: sequence parallelism needs a dense model (the MoE layer takes all the rows)");
  if (on) require_trainable("sequence parallelism");  // its forward runs the trainable layers
  sequence_parallel_ = on;
}

std::vector<float> Llama::norm_grads() const {
  std::vector<float> all(norm_grad_.span().begin(), norm_grad_.span().end());
  for (const auto& L : layers_)
    for (const Tensor* g : {&L.attention_norm_grad, &L.ffn_norm_grad}) all.insert(all.end(), g->span().begin(), g->span().end());
  return all;
}

void Llama::sum_norm_grads(const std::vector<float>& before) {
  std::vector<float> added = norm_grads();  // [(2L+1) * C]
  for (size_t i = 0; i < added.size(); ++i) added[i] -= before[i];
  group_.all_sum(added);
  size_t i = 0;
  auto put = [&](Tensor& g) {
    for (int64_t j = 0; j < g.numel(); ++j, ++i) g[j] = before[i] + added[i];
  };
  put(norm_grad_);
  for (auto& L : layers_) {
    put(L.attention_norm_grad);
    put(L.ffn_norm_grad);
  }
}

int64_t Llama::activation_bytes() const {
  if (!acts_) return 0;
  const Acts& A = *acts_;
  size_t n = 0;
  for (const auto& a : A.layers)
    for (const auto* v : {&a.x_in, &a.xn1, &a.rstd1, &a.qkv, &a.att, &a.y, &a.xm, &a.xn2, &a.rstd2}) n += v->capacity();
  for (const auto* v : {&A.x_final, &A.xf, &A.rstdf, &A.probs, &A.losses, &A.tmp}) n += v->capacity();
  int64_t bytes = static_cast<int64_t>(n * sizeof(float));
  for (const auto& L : layers_) bytes += L.ffn->activation_bytes();
  return bytes;
}

void Llama::note_activation_bytes() { peak_activation_bytes_ = std::max(peak_activation_bytes_, activation_bytes()); }

const ParamSpec& Llama::spec_of(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return s;
  throw std::logic_error("llama: no spec " + name);
}

void Llama::ensure_grads() {
  require_trainable("gradients");
  if (grad_buffer_.empty()) lay_out_gradients();
}

std::vector<Llama::Held> Llama::held_parameters(std::vector<size_t>& layer_ends) {
  std::vector<Held> out;
  if (!config_.shared_classifier) out.push_back({"output", &output_.weight(), &output_.grad()});
  out.push_back({"norm", &norm_, &norm_grad_});
  layer_ends.assign(layers_.size(), 0);
  for (size_t l = layers_.size(); l-- > 0;) {  // backward order: feed-forward, then attention
    Layer& L = layers_[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    for (auto& r : L.trainable_ffn->parameters()) out.push_back({r.name, r.value, r.grad});
    out.push_back({p + "ffn_norm", &L.ffn_norm, &L.ffn_norm_grad});
    TrainableLinears& lin = L.trainable();
    out.push_back({p + "wo", &lin.wo.local().weight(), &lin.wo.local().grad()});
    const char* qkv[] = {"wq", "wk", "wv"};
    for (int i = 0; i < 3; ++i) out.push_back({p + qkv[i], &lin.qkv.part(i).weight(), &lin.qkv.part(i).grad()});
    out.push_back({p + "attention_norm", &L.attention_norm, &L.attention_norm_grad});
    layer_ends[l] = out.size();
  }
  out.push_back({"tok_embeddings", &embedding_.rows().weight(), &embedding_.rows().grad()});
  return out;
}

// Backward order, expert weights last (they are not averaged over the data axis, and the data
// axis's buckets are grad_buffer()'s prefix).
void Llama::lay_out_gradients() {
  std::vector<size_t> layer_ends;
  const std::vector<Held> held = held_parameters(layer_ends);
  std::map<std::string, size_t> spec_index;
  for (size_t i = 0; i < specs_.size(); ++i) spec_index[specs_[i].name] = i;
  std::vector<int64_t> offsets(held.size()), end_after(held.size());
  int64_t size = 0;
  for (const bool experts : {false, true})
    for (size_t i = 0; i < held.size(); ++i) {
      auto it = spec_index.find(held[i].name);
      if (it == spec_index.end()) throw std::logic_error("llama: the model holds '" + held[i].name + "', not a parameter");
      if (specs_[it->second].expert != experts) continue;
      offsets[i] = size;
      size += held[i].value->numel();
      end_after[i] = size;
    }
  grad_buffer_.assign(static_cast<size_t>(size), 0.0f);
  grad_offsets_.assign(specs_.size(), -1);
  for (size_t i = 0; i < held.size(); ++i) {
    const size_t n = static_cast<size_t>(held[i].value->numel());
    std::span<float> storage = std::span<float>(grad_buffer_).subspan(static_cast<size_t>(offsets[i]), n);
    std::copy(held[i].grad->span().begin(), held[i].grad->span().end(), storage.begin());
    *held[i].grad = Tensor::view(held[i].value->shape(), storage);
    grad_offsets_[spec_index.at(held[i].name)] = offsets[i];
  }
  for (size_t i = 0; i < specs_.size(); ++i)
    if (grad_offsets_[i] < 0) throw std::logic_error("llama: parameter '" + specs_[i].name + "' not held by the model");
  head_grads_end_ = end_after[config_.shared_classifier ? 0 : 1];
  block_grads_end_.clear();
  for (size_t end : layer_ends) block_grads_end_.push_back(end_after[end - 1]);
  dense_grads_end_ = end_after[held.size() - 1];
}

std::span<float> Llama::grad_buffer() {
  ensure_grads();
  return grad_buffer_;
}

void Llama::gradients_ready(int64_t end, bool last) const {
  // Replicated KV heads and sequence-split norms get their sums after the whole backward.
  if (gradients_ready_ && (last || (!plan_.kv_replicated && !rows_split()))) gradients_ready_(end);
}

// KV heads held by several devices: each holder's wk/wv gradient covers only its own query heads;
// summing over the holders (an all_sum of the full [KV, C] rows, zero where not held) gives every
// holder the full gradient, so the replicated rows stay identical after an optimizer step.
void Llama::sync_replicated_kv_grads(const std::vector<Tensor>& before) {
  const int64_t C = config_.dim, KV = config_.kv_dim();
  const dist::Range rows = plan_.kv_rows();
  std::vector<float> full(static_cast<size_t>(2 * KV * C));  // [2, KV, C]
  size_t b = 0;
  for (auto& L : layers_) {
    std::fill(full.begin(), full.end(), 0.0f);
    for (int part = 1; part <= 2; ++part) {
      const Tensor& g = L.trainable().qkv.part(part).grad();
      const Tensor& prev = before[b + static_cast<size_t>(part - 1)];
      float* dst = full.data() + (part - 1) * KV * C + rows.offset * C;
      for (int64_t i = 0; i < g.numel(); ++i) dst[i] = g[i] - prev[i];  // this call's contribution
    }
    group_.all_sum(full);
    for (int part = 1; part <= 2; ++part) {
      Tensor& g = L.trainable().qkv.part(part).grad();
      const Tensor& prev = before[b + static_cast<size_t>(part - 1)];
      const float* src = full.data() + (part - 1) * KV * C + rows.offset * C;
      for (int64_t i = 0; i < g.numel(); ++i) g[i] = prev[i] + src[i];
    }
    b += 2;
  }
}

float Llama::forward_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T) {
  ensure_grads();
  std::vector<Tensor> before;  // wk, wv grads per layer before this call (replicated KV only)
  if (plan_.kv_replicated)
    for (auto& L : layers_) {
      before.push_back(L.trainable().qkv.part(1).grad());
      before.push_back(L.trainable().qkv.part(2).grad());
    }
  const bool split_norms = rows_split();
  const std::vector<float> norms_before = split_norms ? norm_grads() : std::vector<float>{};
  peak_activation_bytes_ = 0;
  float loss = train_forward(tokens, targets, B, T);
  train_backward(tokens, targets, B, T);
  if (split_norms) sum_norm_grads(norms_before);
  if (!recompute_) note_activation_bytes();  // the feed-forwards' backward buffers are allocated now
  if (plan_.kv_replicated) sync_replicated_kv_grads(before);
  gradients_ready(static_cast<int64_t>(grad_buffer_.size()), /*last=*/true);
  return loss;
}

float Llama::loss(std::span<const int> tokens, std::span<const int> targets, int B, int T) {
  return train_forward(tokens, targets, B, T);
}

std::vector<float> Llama::forward_logits(std::span<const int> tokens, int B, int T) {
  std::vector<int> targets(tokens.size(), 0);
  train_forward(tokens, targets, B, T);
  // Recompute logits from the saved final norm output (the probabilities overwrote them).
  const int64_t N = int64_t(B) * T, C = config_.dim, V = config_.vocab_size, VL = plan_.vocab.count;
  std::vector<float> local(static_cast<size_t>(N * VL));  // [N, VL]
  classifier_forward(local.data(), acts_->xf.data(), N);
  std::vector<dist::Range> cols;
  for (const auto& q : all_plans_) cols.push_back(q.vocab);
  Tensor full = nn::gather_columns(group_, local.data(), cols, N, V);
  (void)C;
  return std::vector<float>(full.span().begin(), full.span().end());
}

// ---- parameters ----

std::vector<Llama::Parameter> Llama::parameters() {
  ensure_grads();
  std::vector<size_t> layer_ends;
  std::map<std::string, Held> held;
  for (Held& h : held_parameters(layer_ends)) held.emplace(h.name, h);
  std::vector<Parameter> out;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const Held& h = held.at(specs_[i].name);
    out.push_back({&specs_[i], h.value, h.grad, grad_offsets_[i]});
  }
  return out;
}

void Llama::zero_grad() {
  ensure_grads();
  std::ranges::fill(grad_buffer_, 0.0f);
}

TensorWeights Llama::gather_weights() { return gather(false); }

TensorWeights Llama::gather_grads() { return gather(true); }

Tensor Llama::gather_parameter(const ParamSpec& spec, const float* local) {
  const int64_t rows = spec.shape[0], cols = tensor::numel(spec.shape) / rows;
  if (spec.split == Split::Replicated) return Tensor(spec.shape, std::vector<float>(local, local + rows * cols));
  std::vector<dist::Range> parts;  // [T] every device's rows or columns
  for (const auto& q : all_plans_) parts.push_back(q.range_of(spec.sharded_dim));
  if (spec.split == Split::Rows) return nn::gather_rows(group_, local, parts, rows, cols);
  return nn::gather_columns(group_, local, parts, rows, cols);
}

// Collective: full tensors from every device's shards, by the parameter table. Expert weights are
// dealt out by the MoE layer, which gathers them itself (weights only).
TensorWeights Llama::gather(bool grads) {
  require_trainable("gathering the full weights");
  TensorWeights out(config_);
  for (const Parameter& p : parameters()) {
    if (p.spec->expert) continue;
    out.set(p.spec->name, gather_parameter(*p.spec, grads ? p.grad->data() : p.value->data()));
  }
  if (grads || !config_.is_moe()) return out;
  for (auto& L : layers_)
    for (auto& [name, t] : L.trainable_ffn->gather_full()) out.set(name, std::move(t));
  return out;
}

int64_t Llama::parameter_bytes() const {
  int64_t n = embedding_.rows().weight().numel() + norm_.numel() + output_.weight().numel();
  int64_t bytes = embedding_packed_.bytes() + (config_.shared_classifier || !frozen_ ? 0 : output_packed_.bytes());
  for (const auto& L : layers_) {
    n += L.attention_norm.numel() + L.ffn_norm.numel();
    bytes += L.linears_bytes();
    bytes += L.ffn->parameter_bytes();
  }
  return bytes + n * static_cast<int64_t>(sizeof(float));
}

void Llama::set_moe_batch_fractions(const std::vector<std::vector<float>>& per_block) {
  size_t b = 0;
  for (auto& L : layers_)
    if (auto* moe = dynamic_cast<nn::MoeFeedForward*>(L.ffn.get()))
      moe->set_batch_fraction(b < per_block.size() ? per_block[b++] : std::vector<float>{});
}

std::vector<nn::MoeStats> Llama::moe_stats() const {
  std::vector<nn::MoeStats> out;
  for (const auto& L : layers_)
    if (const auto* moe = dynamic_cast<const nn::MoeFeedForward*>(L.ffn.get())) out.push_back(moe->stats());
  return out;
}

int64_t Llama::kv_cache_bytes() const {
  int64_t n = 0;
  for (const auto& L : layers_) n += static_cast<int64_t>(L.k_cache.size() + L.v_cache.size());
  return n * static_cast<int64_t>(sizeof(float));
}

}  // namespace tpcli::model
