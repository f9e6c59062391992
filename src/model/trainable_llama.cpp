// tpcli::model — the trainable model (see trainable_llama.h).
#include "model/trainable_llama.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/block_activations.h"
#include "model/trainable_llama_layers.h"
#include "model/packed_weights.h"
#include "nn/attention.h"
#include "nn/collective_matmul.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/gather.h"
#include "nn/rmsnorm.h"
#include "nn/sequence_parallel.h"
#include "nn/quantized_linear.h"

namespace tpcli::model {

using tensor::Tensor;

// Activations saved by the training forward for the backward.
struct TrainableLlama::Acts {
  struct PerLayer {
    // R = N rows, or this device's NL under sequence parallelism (sequence_rows).
    std::vector<float> x_in;   // [R, C] residual stream entering the block
    std::vector<float> xn1;    // [R, C] attention_norm output
    std::vector<float> rstd1;  // [R]
    std::vector<float> qk_in;  // [N, QL+KVL] q and k before their norms (q/k norms only)
    std::vector<float> qk_rstd;  // [N, NH_L+NKV_L] their 1/rms (q/k norms only)
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
void size(std::vector<float>& v, int64_t n) { v.resize(static_cast<size_t>(n)); }
}  // namespace

TrainableLlama::~TrainableLlama() = default;
TrainableLlama::TrainableLlama(TrainableLlama&&) noexcept = default;
TrainableLlama& TrainableLlama::operator=(TrainableLlama&&) noexcept = default;

TrainableLlama::TrainableLlama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group,
                               std::optional<LoraOptions> lora)
    : core_(weights.config(), std::move(tensor_group), std::move(expert_group)),
      lora_(std::move(lora)),
      head_(std::make_unique<Head>()) {
  const LlamaConfig& c = core_.config;
  const bool packed = holds_packed_weights(weights);
  if (packed && !lora_)
    throw std::invalid_argument("llama: the model's weights are " +
                                (c.quantization ? weight_format(*c.quantization).name() : std::string("16-bit")) +
                                " (frozen); full fine-tuning needs the f32 checkpoint: train LoRA adapters on this one "
                                "([train.lora]) or train the f32 checkpoint");
  if (packed && c.is_moe())
    throw std::invalid_argument("llama: QLoRA on a mixture-of-experts model is not supported yet (its experts have no "
                                "packed backward): train LoRA adapters on the f32 checkpoint");
  if (lora_) lora_specs_ = lora_parameters(c, *lora_);  // refuses what LoRA cannot take before loading
  Head& h = *head_;
  h.tied = c.shared_classifier;
  if (packed) load_packed_head(weights);
  else {
    h.embedding = nn::VocabParallelEmbedding(core_.local_slice(weights, "tok_embeddings"), core_.vocab_ranges(), core_.group);
    if (!h.tied) h.output = nn::Linear(core_.local_slice(weights, "output"));
  }
  h.norm = core_.local_slice(weights, "norm");
  h.norm_grad = Tensor({c.dim});
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    L.attention_norm = core_.block_slice(weights, {l, Matrix::AttentionNorm});
    L.attention_norm_grad = Tensor({c.dim});
    L.ffn_norm = core_.block_slice(weights, {l, Matrix::FfnNorm});
    L.ffn_norm_grad = Tensor({c.dim});
    L.qkv_extras = load_qkv_extras(weights, l);
    if (packed) {
      L.linears = PackedAttentionLinears{core_.load_packed_qkv(weights, l), core_.load_wo(weights, l)};
      std::unique_ptr<nn::QuantizedSwiGluFeedForward> ffn = core_.load_dense_ffn(weights, l);
      ffn->keep_activations(true);  // its backward needs h13 and g
      L.ffn = std::move(ffn);
    } else {
      L.linears = core_.load_f32_attention(weights, l);
      L.ffn = core_.load_f32_feed_forward(weights, l);
    }
  }
  if (lora_) {
    add_adapters(*lora_);
    bind_adapters();
  } else {
    bind_parameters();
  }
}

// Block l's q/k/v biases and q/k norms (none for a Llama), with zero gradients.
TrainableQkvExtras TrainableLlama::load_qkv_extras(const WeightSource& weights, int l) const {
  TrainableQkvExtras e;
  auto load = [&](Matrix m, Tensor& value, Tensor& grad) {
    value = core_.block_slice(weights, {l, m});
    grad = Tensor(value.shape());
  };
  if (core_.config.qkv_bias) {
    load(Matrix::Bq, e.bq, e.bq_grad);
    load(Matrix::Bk, e.bk, e.bk_grad);
    load(Matrix::Bv, e.bv, e.bv_grad);
  }
  if (core_.config.qk_norm) {
    load(Matrix::QNorm, e.q_norm, e.q_norm_grad);
    load(Matrix::KNorm, e.k_norm, e.k_norm_grad);
  }
  return e;
}

// The packed checkpoint's embedding and unshared classifier, this device's vocabulary rows as stored.
void TrainableLlama::load_packed_head(const WeightSource& weights) {
  const int64_t C = core_.config.dim, V = core_.config.vocab_size;
  const dist::Range vocab = core_.plan.vocab;
  Head& h = *head_;
  h.packed_embedding.emplace(load_packed(weights, "tok_embeddings", V, C, vocab.offset, vocab.count), core_.vocab_ranges(),
                             core_.group);
  if (!h.tied) h.packed_output = packed_rows(weights, "output", V, C, vocab);
}

// In the order backward finishes them, stage by stage: the classifier and the final norm, each
// block from the last (its feed-forward, then its attention), the token embedding.
void TrainableLlama::bind_parameters() {
  Head& h = *head_;
  auto bind = [&](int stage, const std::string& name, Tensor& value, Tensor& grad) {
    binding_.bind(stage, core_.spec(name), value, grad);
  };
  if (!h.tied) bind(0, "output", h.output.weight(), h.output.grad());
  bind(0, "norm", h.norm, h.norm_grad);
  const int L = static_cast<int>(layers_.size());
  for (int l = L - 1; l >= 0; --l) {
    Layer& layer = layers_[static_cast<size_t>(l)];
    const int stage = L - l;
    const auto name = [l](Matrix m) { return tensor_name({l, m}); };
    for (const nn::ParamRef& r : layer.ffn->parameters()) bind(stage, r.name, *r.value, *r.grad);
    bind(stage, name(Matrix::FfnNorm), layer.ffn_norm, layer.ffn_norm_grad);
    F32AttentionLinears& linears = layer.f32();
    nn::Linear& wo = linears.wo.local();
    bind(stage, name(Matrix::Wo), wo.weight(), wo.grad());
    for (Matrix m : linear_parts(Matrix::Wq)) {
      nn::Linear& part = linears.qkv.part(facts(m).part);
      bind(stage, name(m), part.weight(), part.grad());
    }
    TrainableQkvExtras& e = layer.qkv_extras;
    if (e.has_bias()) {
      bind(stage, name(Matrix::Bq), e.bq, e.bq_grad);
      bind(stage, name(Matrix::Bk), e.bk, e.bk_grad);
      bind(stage, name(Matrix::Bv), e.bv, e.bv_grad);
    }
    if (e.has_norms()) {
      bind(stage, name(Matrix::QNorm), e.q_norm, e.q_norm_grad);
      bind(stage, name(Matrix::KNorm), e.k_norm, e.k_norm_grad);
    }
    bind(stage, name(Matrix::AttentionNorm), layer.attention_norm, layer.attention_norm_grad);
  }
  bind(L + 1, "tok_embeddings", h.embedding.rows().weight(), h.embedding.rows().grad());
  binding_.lay_out(core_.specs);
}

// ---- forward ----

float TrainableLlama::train_forward(std::span<const int> tokens, std::span<const int> targets, int B, int T) {
  const LlamaConfig& c = core_.config;
  const int64_t N = int64_t(B) * T, C = c.dim, V = c.vocab_size, VL = core_.plan.vocab.count;
  if (B < 1 || T < 1 || T > c.seq_len)
    throw std::invalid_argument("llama: batch " + std::to_string(B) + " x " + std::to_string(T) +
                                " needs B >= 1 and 1 <= T <= seq_len = " + std::to_string(c.seq_len));
  if (static_cast<int64_t>(tokens.size()) != N || static_cast<int64_t>(targets.size()) != N)
    throw std::invalid_argument("llama: tokens/targets must hold B*T = " + std::to_string(N) + " ids");
  for (int t : targets)
    if ((t < 0 && t != nn::IGNORED_TARGET) || t >= V)
      throw std::out_of_range("llama: target " + std::to_string(t) + " outside the vocabulary");
  if (!acts_) acts_ = std::make_unique<Acts>();
  Acts& A = *acts_;
  // Recompute: every block writes its activations into the one scratch entry (layers[L]).
  A.layers.resize(layers_.size() + (recompute_ ? 1 : 0));

  const dist::Range rows = sequence_rows(N);
  const int64_t R = rows.count;
  const bool split = rows_split();  // the same on every device (R may not be: uneven rows)
  std::vector<float> x(static_cast<size_t>(N * C));  // [N, C], then [R, C]: the residual stream
  head_->embed(x.data(), tokens);  // all_gather_v of the rows from their owners
  if (split) x = std::vector<float>(x.begin() + rows.offset * C, x.begin() + (rows.offset + R) * C);
  for (size_t l = 0; l < layers_.size(); ++l) {
    A.layers[l].x_in = x;
    block_forward(l, A.layers[l].x_in.data(), x.data(), B, T);
    if (recompute_) layers_[l].ffn->release_activations();
  }
  A.x_final = std::move(x);
  const HeadActivationSizes sizes = head_activation_sizes(c, core_.plan, B, T, split);
  size(A.xf, sizes.xf); size(A.rstdf, sizes.rstdf); size(A.probs, sizes.probs); size(A.losses, sizes.losses);
  size(A.tmp, block_activation_sizes(c, core_.plan, B, T, split).tmp);
  float* xf_rows = split ? A.tmp.data() : A.xf.data();  // [R, C]
  nn::rmsnorm_forward(xf_rows, A.rstdf.data(), A.x_final.data(), head_->norm.data(), R, C, c.norm_eps);
  if (split) nn::all_gather_rows(A.xf.data(), xf_rows, N, C, core_.group);  // split -> mirrored
  head_->classify(A.probs.data(), A.xf.data(), N);  // logits, turned into probabilities in place
  float loss = nn::cross_entropy_forward(A.losses.data(), A.probs.data(), A.probs.data(), targets.data(),
                                         core_.plan.vocab.offset, N, VL, core_.group);
  if (loss_divisor_)  // the sum over the counted targets, over the caller's divisor
    loss = static_cast<float>(loss * static_cast<double>(nn::counted_targets(targets.data(), N)) / *loss_divisor_);
  for (const auto& L : layers_) loss += L.ffn->aux_loss();
  note_activation_bytes();
  return loss;
}

void TrainableLlama::block_forward(size_t l, const float* x_in, float* x_out, int B, int T) {
  const LlamaConfig& c = core_.config;
  Acts& A = *acts_;
  const int64_t N = int64_t(B) * T, C = c.dim;
  Layer& L = layers_[l];
  auto& a = A.layers[recompute_ ? layers_.size() : l];
  const BlockActivationSizes sizes = block_activation_sizes(c, core_.plan, B, T, rows_split());
  const int64_t R = sizes.rows;  // rows of the residual stream here
  size(a.xn1, sizes.xn1); size(a.rstd1, sizes.rstd1); size(a.qkv, sizes.qkv); size(a.att, sizes.att);
  size(a.qk_in, sizes.qk_in); size(a.qk_rstd, sizes.qk_rstd);
  size(a.y, sizes.y); size(a.xm, sizes.xm); size(a.xn2, sizes.xn2); size(a.rstd2, sizes.rstd2); size(A.tmp, sizes.tmp);
  nn::rmsnorm_forward(a.xn1.data(), a.rstd1.data(), x_in, L.attention_norm.data(), R, C, c.norm_eps);
  if (rows_split())
    nn::all_gather_matmul(a.qkv.data(), a.xn1.data(), N, L.f32().qkv, core_.group);  // [R, C] split -> [N, QKV]
  else
    L.visit([&](auto& linears) { linears.qkv.forward(a.qkv.data(), a.xn1.data(), N); });
  L.qkv_extras.forward(a.qkv.data(), a.qk_in.data(), a.qk_rstd.data(), N, core_.attention_shape(), c.norm_eps);
  core_.rope_forward(a.qkv.data(), N, 0, T);
  nn::attention_forward(a.y.data(), a.att.data(), a.qkv.data(), B, T, core_.attention_shape());
  if (rows_split())
    nn::matmul_reduce_scatter(A.tmp.data(), a.y.data(), N, L.f32().wo, core_.group);  // -> [R, C] split
  else
    L.visit([&](auto& linears) { linears.wo.forward(A.tmp.data(), a.y.data(), N); });  // all_sum
  for (int64_t i = 0; i < R * C; ++i) a.xm[i] = x_in[i] + A.tmp[i];
  nn::rmsnorm_forward(a.xn2.data(), a.rstd2.data(), a.xm.data(), L.ffn_norm.data(), R, C, c.norm_eps);
  if (rows_split())
    L.ffn->forward_sequence_split(A.tmp.data(), a.xn2.data(), N);  // collective matmuls inside
  else
    L.ffn->forward(A.tmp.data(), a.xn2.data(), N);  // all_sum inside
  for (int64_t i = 0; i < R * C; ++i) x_out[i] = a.xm[i] + A.tmp[i];
}

float TrainableLlama::loss(std::span<const int> tokens, std::span<const int> targets, int B, int T,
                          std::optional<double> loss_divisor) {
  loss_divisor_ = loss_divisor;
  return train_forward(tokens, targets, B, T);
}

std::vector<float> TrainableLlama::forward_logits(std::span<const int> tokens, int B, int T) {
  std::vector<int> targets(tokens.size(), 0);
  loss_divisor_.reset();
  train_forward(tokens, targets, B, T);
  // Recompute logits from the saved final norm output (the probabilities overwrote them).
  const int64_t N = int64_t(B) * T;
  std::vector<float> local(static_cast<size_t>(N * core_.plan.vocab.count));  // [N, VL]
  head_->classify(local.data(), acts_->xf.data(), N);
  return core_.gather_vocab_columns(local.data(), N);
}

// ---- backward ----

std::vector<float> TrainableLlama::head_backward(std::span<const int> targets, int B, int T) {
  Acts& A = *acts_;
  const int64_t N = int64_t(B) * T, C = core_.config.dim, VL = core_.plan.vocab.count;
  // softmax cross-entropy, mean over N
  std::vector<float> dlogits(static_cast<size_t>(N * VL), 0.0f);  // [N, VL]
  const int64_t counted = nn::counted_targets(targets.data(), N);  // N unless some are ignored
  const float dloss = loss_divisor_ ? static_cast<float>(1.0 / *loss_divisor_)
                                    : counted > 0 ? 1.0f / static_cast<float>(counted) : 0.0f;
  nn::cross_entropy_backward(dlogits.data(), A.probs.data(), targets.data(), core_.plan.vocab.offset, N, VL, dloss);
  // classifier (AllToSharded by vocab rows): dxf = all_sum(dlogits @ W_cls); dW_cls += dlogits^T xf.
  // Tied: W_cls is this device's rows of the embedding, so its gradient lands on those rows.
  std::vector<float> dxf(static_cast<size_t>(N * C), 0.0f);  // [N, C] partial
  head_->classify_backward(dxf.data(), dlogits.data(), A.xf.data(), N);
  const int64_t R = sequence_rows(N).count;
  if (rows_split()) {  // partial -> split: only this device's rows go on
    std::vector<float> mine(static_cast<size_t>(R * C));  // [R, C]
    nn::reduce_scatter_rows(mine.data(), dxf.data(), N, C, core_.group);
    dxf = std::move(mine);
  } else {
    core_.group.all_sum(dxf);  // partial -> mirrored
  }
  std::vector<float> dx(static_cast<size_t>(R * C), 0.0f);  // [R, C] gradient of the residual stream
  nn::rmsnorm_backward(dx.data(), head_->norm_grad.data(), dxf.data(), A.x_final.data(), head_->norm.data(),
                       A.rstdf.data(), R, C);
  return dx;
}

void TrainableLlama::train_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T) {
  const int64_t N = int64_t(B) * T, C = core_.config.dim;
  std::vector<float> dx = head_backward(targets, B, T);
  gradients_ready(binding_.end_of_stage(0));
  std::vector<float> scratch(recompute_ ? dx.size() : 0);  // the recomputed block's output, unused
  // LoRA: nothing below the lowest adapted block trains, so the gradient stops there.
  const size_t lowest = lora_ && lora_->last_layers > 0 ? layers_.size() - static_cast<size_t>(lora_->last_layers) : 0;
  for (size_t li = layers_.size(); li-- > lowest;) {
    if (recompute_) block_forward(li, acts_->layers[li].x_in.data(), scratch.data(), B, T);  // from its saved input
    block_backward(li, dx.data(), B, T);
    gradients_ready(binding_.end_of_stage(static_cast<int>(layers_.size() - li)));
    if (recompute_) {
      note_activation_bytes();
      layers_[li].ffn->release_activations();
    }
  }
  if (rows_split()) {  // split -> mirrored: the embedding's rows are owned by vocabulary, not by position
    std::vector<float> all(static_cast<size_t>(N * C));  // [N, C]
    nn::all_gather_rows(all.data(), dx.data(), N, C, core_.group);
    dx = std::move(all);
  }
  if (!lora_) head_->embedding.backward(dx.data(), tokens);  // dx is mirrored: each device adds to the rows it owns
  gradients_ready(binding_.end_of_stage(static_cast<int>(layers_.size()) + 1));
}

void TrainableLlama::block_backward(size_t li, float* dx, int B, int T) {
  Acts& A = *acts_;
  const int64_t N = int64_t(B) * T, C = core_.config.dim;
  const nn::AttentionShape shape = core_.attention_shape();
  const int64_t R = sequence_rows(N).count;
  std::vector<float> dxn(static_cast<size_t>(R * C), 0.0f);                  // [R, C]
  std::vector<float> dy(static_cast<size_t>(N * shape.q_dim()), 0.0f);       // [N, QL]
  std::vector<float> dqkv(static_cast<size_t>(N * shape.qkv_dim()), 0.0f);  // [N, QL+2KVL]
  Layer& L = layers_[li];
  const auto& a = A.layers[recompute_ ? layers_.size() : li];
  const float* x_in = A.layers[li].x_in.data();
  dist::Group& group = core_.group;
  // feed-forward branch: x_out = xm + ffn(ffn_norm(xm))
  if (rows_split()) L.ffn->backward_sequence_split(dxn.data(), dx, a.xn2.data(), N);
  else L.ffn->backward(dxn.data(), dx, a.xn2.data(), N);
  nn::rmsnorm_backward(dx, L.ffn_norm_grad.data(), dxn.data(), a.xm.data(), L.ffn_norm.data(), a.rstd2.data(), R, C);
  // attention branch: xm = x_in + wo(attention(rope(qkv(attention_norm(x_in)))))
  if (rows_split()) nn::matmul_reduce_scatter_backward(dy.data(), dx, a.y.data(), N, L.f32().wo, group);  // all_gather of dx
  else L.visit([&](auto& linears) { linears.wo.backward(dy.data(), dx, a.y.data(), N); });
  nn::attention_backward(dqkv.data(), dy.data(), a.qkv.data(), a.att.data(), B, T, shape);
  core_.rope_backward(dqkv.data(), N, T);
  L.qkv_extras.backward(dqkv.data(), a.qk_in.data(), a.qk_rstd.data(), N, shape, lora_.has_value(), group);
  std::fill(dxn.begin(), dxn.end(), 0.0f);
  if (rows_split()) nn::all_gather_matmul_backward(dxn.data(), dqkv.data(), a.xn1.data(), N, L.f32().qkv, group);  // reduce_scatter
  else L.visit([&](auto& linears) { linears.qkv.backward(dxn.data(), dqkv.data(), a.xn1.data(), N); });  // all_sum (sum_gradients)
  nn::rmsnorm_backward(dx, L.attention_norm_grad.data(), dxn.data(), x_in, L.attention_norm.data(), a.rstd1.data(), R, C);
}

bool TrainableLlama::rows_split() const { return sequence_parallel_ && core_.group.size() > 1; }

dist::Range TrainableLlama::sequence_rows(int64_t N) const {
  return rows_split() ? dist::even_split(N, core_.group.size(), core_.group.rank()) : dist::Range{0, N};
}

void TrainableLlama::set_sequence_parallel(bool on) {
  if (on && lora_) throw std::invalid_argument("llama: sequence parallelism with LoRA adapters is not supported yet");
  if (on && core_.config.is_moe())
    throw std::invalid_argument("llama: sequence parallelism needs a dense model (the MoE layer takes all the rows)");
  sequence_parallel_ = on;
}

std::vector<float> TrainableLlama::norm_grads() const {
  std::vector<float> all(head_->norm_grad.span().begin(), head_->norm_grad.span().end());
  for (const auto& L : layers_)
    for (const Tensor* g : {&L.attention_norm_grad, &L.ffn_norm_grad}) all.insert(all.end(), g->span().begin(), g->span().end());
  return all;
}

void TrainableLlama::sum_norm_grads(const std::vector<float>& before) {
  std::vector<float> added = norm_grads();  // [(2L+1) * C]
  for (size_t i = 0; i < added.size(); ++i) added[i] -= before[i];
  core_.group.all_sum(added);
  size_t i = 0;
  auto put = [&](Tensor& g) {
    for (int64_t j = 0; j < g.numel(); ++j, ++i) g[j] = before[i] + added[i];
  };
  put(head_->norm_grad);
  for (auto& L : layers_) {
    put(L.attention_norm_grad);
    put(L.ffn_norm_grad);
  }
}

int64_t TrainableLlama::activation_bytes() const {
  if (!acts_) return 0;
  const Acts& A = *acts_;
  size_t n = 0;
  for (const auto& a : A.layers)
    for (const auto* v : {&a.x_in, &a.xn1, &a.rstd1, &a.qk_in, &a.qk_rstd, &a.qkv, &a.att, &a.y, &a.xm, &a.xn2, &a.rstd2}) n += v->capacity();
  for (const auto* v : {&A.x_final, &A.xf, &A.rstdf, &A.probs, &A.losses, &A.tmp}) n += v->capacity();
  int64_t bytes = static_cast<int64_t>(n * sizeof(float));
  for (const auto& L : layers_) bytes += L.ffn->activation_bytes();
  return bytes;
}

void TrainableLlama::note_activation_bytes() {
  peak_activation_bytes_ = std::max(peak_activation_bytes_, activation_bytes());
}

void TrainableLlama::gradients_ready(int64_t end, bool last) const {
  // Replicated KV heads and sequence-split norms get their sums after the whole backward.
  if (gradients_ready_ && (last || (!core_.plan.kv_replicated && !rows_split()))) gradients_ready_(end);
}

std::vector<Tensor*> TrainableLlama::kv_row_grads() {
  std::vector<Tensor*> out;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int part = 1; part <= 2; ++part) {
      if (!lora_) out.push_back(&layers_[l].f32().qkv.part(part).grad());
      else if (nn::LoraAdapter* a = layers_[l].visit([&](auto& linears) { return linears.qkv.adapter(part); }))
        out.push_back(&a->b_grad);
    }
    TrainableQkvExtras& e = layers_[l].qkv_extras;
    if (!lora_ && e.has_bias()) out.insert(out.end(), {&e.bk_grad, &e.bv_grad});
  }
  return out;
}

std::vector<Tensor> TrainableLlama::kv_grads() {
  std::vector<Tensor> out;
  for (Tensor* g : kv_row_grads()) out.push_back(*g);  // an owning copy
  return out;
}

// KV heads held by several devices: each holder's gradient of a KV row (wk, wv, or their adapters'
// B) covers only its own query heads; summing over the holders (an all_sum of the full [KV, cols]
// rows, zero where not held) gives every holder the full gradient, so the replicated rows stay
// identical after an optimizer step. One all_sum per pair of tensors (a block's wk and wv).
void TrainableLlama::sync_replicated_kv_grads(const std::vector<Tensor>& before) {
  const int64_t KV = core_.config.kv_dim();
  const dist::Range rows = core_.plan.kv_rows();
  const std::vector<Tensor*> grads = kv_row_grads();
  for (size_t first = 0; first < grads.size(); first += 2) {
    const size_t last = std::min(first + 2, grads.size());
    std::vector<int64_t> starts;  // of each tensor's full [KV, cols] in `full`
    int64_t size = 0;
    for (size_t i = first; i < last; ++i) {
      starts.push_back(size);
      size += KV * (grads[i]->numel() / rows.count);
    }
    std::vector<float> full(static_cast<size_t>(size), 0.0f);
    for (size_t i = first; i < last; ++i) {
      const Tensor& g = *grads[i];
      float* dst = full.data() + starts[i - first] + rows.offset * (g.numel() / rows.count);
      for (int64_t j = 0; j < g.numel(); ++j) dst[j] = g[j] - before[i][j];  // this call's contribution
    }
    core_.group.all_sum(full);
    for (size_t i = first; i < last; ++i) {
      Tensor& g = *grads[i];
      const float* src = full.data() + starts[i - first] + rows.offset * (g.numel() / rows.count);
      for (int64_t j = 0; j < g.numel(); ++j) g[j] = before[i][j] + src[j];
    }
  }
}

float TrainableLlama::forward_backward(std::span<const int> tokens, std::span<const int> targets, int B, int T,
                                       std::optional<double> loss_divisor) {
  loss_divisor_ = loss_divisor;
  const bool replicated_kv = core_.plan.kv_replicated;
  const std::vector<Tensor> kv_before = replicated_kv ? kv_grads() : std::vector<Tensor>{};
  const bool split_norms = rows_split();
  const std::vector<float> norms_before = split_norms ? norm_grads() : std::vector<float>{};
  peak_activation_bytes_ = 0;
  if (lora_) set_adapter_pass(dropout_pass_.first, dropout_pass_.second);  // dropout in this pass only
  float loss = train_forward(tokens, targets, B, T);
  train_backward(tokens, targets, B, T);
  if (lora_) set_adapter_pass(0, 0);
  if (split_norms) sum_norm_grads(norms_before);
  if (!recompute_) note_activation_bytes();  // the feed-forwards' backward buffers are allocated now
  if (replicated_kv) sync_replicated_kv_grads(kv_before);
  gradients_ready(static_cast<int64_t>(grad_buffer().size()), /*last=*/true);
  return loss;
}

// ---- parameters ----

void TrainableLlama::zero_grad() { std::ranges::fill(binding_.buffer(), 0.0f); }

TensorWeights TrainableLlama::gather_weights() { return gather(false); }

TensorWeights TrainableLlama::gather_grads() { return gather(true); }

Tensor TrainableLlama::gather_parameter(const ParamSpec& spec, const float* local) {
  const int64_t rows = spec.shape[0], cols = tensor::numel(spec.shape) / rows;
  if (spec.split == Split::Replicated) return Tensor(spec.shape, std::vector<float>(local, local + rows * cols));
  std::vector<dist::Range> parts;  // [TP] every device's rows or columns
  for (const auto& q : core_.all_plans) parts.push_back(q.range_of(spec.sharded_dim));
  if (spec.split == Split::Rows) return nn::gather_rows(core_.group, local, parts, rows, cols);
  return nn::gather_columns(core_.group, local, parts, rows, cols);
}

// Collective: full tensors from every device's shards, by the parameter table. Expert weights are
// dealt out by the MoE layer, which gathers them itself (weights only).
TensorWeights TrainableLlama::gather(bool grads) {
  TensorWeights out(core_.config);
  for (const Parameter& p : parameters()) {
    if (p.spec->expert) continue;
    out.set(p.spec->name, gather_parameter(*p.spec, grads ? p.grad->data() : p.value->data()));
  }
  if (grads || lora_ || !core_.config.is_moe()) return out;  // with LoRA, the adapters alone
  for (auto& L : layers_)
    for (auto& [name, t] : L.ffn->gather_full()) out.set(name, std::move(t));
  return out;
}

int64_t TrainableLlama::parameter_bytes() const {
  int64_t n = 0;
  for (const Parameter& p : parameters()) n += p.value->numel();
  return n * static_cast<int64_t>(sizeof(float));
}

int64_t TrainableLlama::frozen_bytes() const {
  if (!lora_) return 0;
  constexpr int64_t F32 = sizeof(float);
  const Head& h = *head_;
  int64_t n = h.norm.numel() * F32;
  if (h.packed_embedding) n += h.packed_embedding->bytes() + (h.tied ? 0 : h.packed_output.bytes());
  else n += (h.embedding.rows().weight().numel() + h.output.weight().numel()) * F32;
  for (const Layer& L : layers_) {
    n += (L.attention_norm.numel() + L.ffn_norm.numel()) * F32 + L.qkv_extras.bytes() + L.ffn->parameter_bytes();
    if (const auto* p = std::get_if<PackedAttentionLinears>(&L.linears)) {
      n += p->qkv.bytes() + p->wo.bytes();
    } else {
      const F32AttentionLinears& f = std::get<F32AttentionLinears>(L.linears);
      n += f.wo.local().weight().numel() * F32;
      for (int i = 0; i < f.qkv.n_parts(); ++i) n += f.qkv.part(i).weight().numel() * F32;
    }
  }
  return n;
}

void TrainableLlama::set_moe_batch_fractions(const std::vector<std::vector<float>>& per_block) {
  size_t b = 0;
  for (auto& L : layers_)
    if (auto* moe = dynamic_cast<nn::MoeFeedForward*>(L.ffn.get()))
      moe->set_batch_fraction(b < per_block.size() ? per_block[b++] : std::vector<float>{});
}

std::vector<nn::MoeStats> TrainableLlama::moe_stats() const {
  std::vector<nn::MoeStats> out;
  for (const auto& L : layers_)
    if (const auto* moe = dynamic_cast<const nn::MoeFeedForward*>(L.ffn.get())) out.push_back(moe->stats());
  return out;
}

}  // namespace tpcli::model
