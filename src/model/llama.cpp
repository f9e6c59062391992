// tpcli::model — the inference model (see llama.h).
#include "model/llama.h"


#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <variant>

#include "model/lora_adapter.h"
#include "model/packed_weights.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/quantized_lora.h"
#include "nn/quantized_linear.h"
#include "nn/rmsnorm.h"
#include "tensor/aligned_storage.h"
#include "tensor/blas.h"

namespace tpcli::model {

using tensor::Tensor;

namespace {
template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;  // clang before 17 deduces no aggregate's arguments
}  // namespace

struct Llama::Layer {
  Tensor attention_norm, ffn_norm;  // [C]
  // parts wq [QL, C], wk [KVL, C], wv [KVL, C]: f32, or in the stored format
  std::variant<nn::AllToShardedLinear, nn::QuantizedAllToShardedLinear> qkv;
  nn::QuantizedShardedToAllLinear wo;  // [C, QL] in lanes (split_invariant), f32 or stored
  QkvExtras qkv_extras;
  std::unique_ptr<nn::FeedForward> ffn;
  nn::LoraAllToSharded qkv_lora;              // LoRA on wq wk wv: parts over qkv's columns (empty: none)
  std::optional<nn::LoraShardedToAll> wo_lora;  // LoRA on wo

  void qkv_forward(float* out, const float* inp, int64_t N) const {
    std::visit([&](const auto& l) { l.forward(out, inp, N); }, qkv);
  }
  int64_t linears_bytes() const {
    return wo.bytes() + std::visit(Overloaded{[](const nn::QuantizedAllToShardedLinear& l) { return l.bytes(); },
                                              [](const nn::AllToShardedLinear& l) {
                                                int64_t n = 0;
                                                for (int i = 0; i < l.n_parts(); ++i) n += l.part(i).weight().numel();
                                                return n * static_cast<int64_t>(sizeof(float));
                                              }},
                                   qkv);
  }
};

// The token embedding and the classifier, split by vocabulary rows; a tied classifier is the
// embedding's rows (`output` then empty).
struct F32Vocab {
  nn::VocabParallelEmbedding embedding;  // [VL, C]
  nn::Linear output;                     // [VL, C]
};
struct PackedVocab {
  nn::PackedVocabParallelEmbedding embedding;  // [VL, C]
  nn::QuantizedAllToShardedLinear output;      // [VL, C]
};
struct Llama::Vocab {
  std::variant<F32Vocab, PackedVocab> weights;
  bool tied = false;

  void embed(float* x, std::span<const int> tokens) {  // x[N, C] rows of tokens[N]
    std::visit([&](auto& v) { v.embedding.forward(x, tokens); }, weights);
  }
  // logits_local[N, VL] = x[N, C] @ W_cls[VL, C]^T.
  void classify(float* logits_local, const float* x, int64_t N) {
    std::visit(Overloaded{[&](F32Vocab& v) { (tied ? v.embedding.rows() : v.output).forward(logits_local, x, N); },
                          [&](PackedVocab& v) {
                            const int64_t VL = v.embedding.local_range().count;
                            if (tied) v.embedding.rows().matmul(logits_local, x, N, 0, VL, VL);
                            else v.output.forward(logits_local, x, N);
                          }},
               weights);
  }
  int64_t bytes() const {
    return std::visit(Overloaded{[](const F32Vocab& v) {
                                   return (v.embedding.rows().weight().numel() + v.output.weight().numel()) *
                                          static_cast<int64_t>(sizeof(float));
                                 },
                                 [&](const PackedVocab& v) { return v.embedding.bytes() + (tied ? 0 : v.output.bytes()); }},
                      weights);
  }
};

namespace {

// The block table of a cache made by new_kv_cache: its one block.
constexpr int32_t FIRST_BLOCK = 0;
const std::span<const int32_t> WHOLE_CACHE(&FIRST_BLOCK, 1);

// The KV cache is sized by seq_len alone (read from a file's metadata): a seq_len within the
// limits can still ask for more memory than the machine has, and zero-filling it would end in the
// kernel's OOM killer rather than an error.
void require_memory_for_kv_cache(const LlamaConfig& c, int64_t kv_rows_local, nn::KvDtype dtype) {
  const double bytes = 2.0 * c.n_layers * static_cast<double>(c.seq_len) * static_cast<double>(kv_rows_local) * nn::kv_dtype_bytes(dtype);
  const double memory = tensor::physical_memory_bytes();
  if (memory > 0 && bytes > memory)
    throw std::runtime_error("llama: the KV cache needs " + std::to_string(static_cast<int64_t>(bytes / 1e6)) +
                             " MB per device (n_layers " + std::to_string(c.n_layers) + " x seq_len " +
                             std::to_string(c.seq_len) + "), more than this machine's " +
                             std::to_string(static_cast<int64_t>(memory / 1e6)) + " MB: lower seq_len");
}

// The MoE feed-forward of block `l` of a frozen checkpoint: the router in f32, this device's
// experts (of the expert group) with its rows of FE (of the tensor group, in whole groups:
// shard_plan.h) in their stored format. experts.w1/w3 are [E*FE, C] matrices, experts.w2 [E*C, FE].
std::unique_ptr<nn::FeedForward> make_packed_moe(const WeightSource& w, const LlamaCore& core, int l) {
  const LlamaConfig& c = core.config;
  const auto name = [l](Matrix m) { return tensor_name({l, m}); };
  const nn::MoeSizes sizes = core.moe_sizes();
  const int64_t C = sizes.dim, FE = sizes.hidden, E = sizes.n_experts;
  const dist::Range mine = nn::local_experts(c.n_experts, core.expert_group.size(), core.expert_group.rank()),
                    h = core.plan.expert_ffn;
  std::vector<nn::PackedExpert> local;
  for (int64_t e = mine.offset; e < mine.offset + mine.count; ++e)
    local.push_back({packed_rows(w, name(Matrix::ExpertsW1), E * FE, C, {e * FE + h.offset, h.count}),
                     packed_rows(w, name(Matrix::ExpertsW3), E * FE, C, {e * FE + h.offset, h.count}),
                     packed_part(w, name(Matrix::ExpertsW2), E * C, FE, {e * C, C}, h)});
  Tensor router({E, C}, checked_values(w, name(Matrix::Router), E * C));
  return std::make_unique<nn::QuantizedMoeFeedForward>(sizes, std::move(router), std::move(local), core.expert_group,
                                                       core.group);
}

// A MoE feed-forward whose experts are dealt out over an expert group that holds the same rows on
// every member (inference: one sequence, mirrored): each member routes only its share of the rows
// (all_to_all_v to the experts' owners and back, nn/moe.h), then the shares are all-gathered, so
// no expert computes a row twice. Decode's single row goes through the first member alone.
class ExpertParallelRows : public nn::FeedForward {
 public:
  ExpertParallelRows(std::unique_ptr<nn::FeedForward> moe, dist::Group experts, int64_t dim)
      : moe_(std::move(moe)), experts_(std::move(experts)), dim_(dim) {}

  void forward(float* out, const float* inp, int64_t N) override {
    const int G = experts_.size();
    const dist::Range mine = dist::even_split(N, G, experts_.rank());
    counts_.resize(static_cast<size_t>(G));  // floats of each member's rows
    for (int m = 0; m < G; ++m) counts_[static_cast<size_t>(m)] = dist::even_split(N, G, m).count * dim_;
    rows_.resize(static_cast<size_t>(mine.count * dim_));
    moe_->forward(rows_.data(), inp + mine.offset * dim_, mine.count);
    experts_.all_gather_v(rows_, std::span<float>(out, static_cast<size_t>(N * dim_)), counts_);
  }
  int64_t parameter_bytes() const override { return moe_->parameter_bytes(); }

 private:
  std::unique_ptr<nn::FeedForward> moe_;
  dist::Group experts_;
  int64_t dim_;
  std::vector<float> rows_;      // [rows, C] this member's share
  std::vector<int64_t> counts_;  // [G] kept between calls: no allocation per block per token
};

}  // namespace

bool split_invariant(const WeightSource& weights, int tensor_devices, int expert_devices) {
  return split_invariant(weights, plan_all_shards(weights.config(), tensor_devices), expert_devices);
}

bool split_invariant(const WeightSource& weights, const std::vector<ShardPlan>& plans, int expert_devices) {
  const LlamaConfig& c = weights.config();
  const int tensor_devices = static_cast<int>(plans.size());
  if (tensor_devices == 1 && expert_devices == 1) return true;
  if ((tensor_devices & (tensor_devices - 1)) != 0 || expert_devices > 1) return false;
  for (int l = 0; l < c.n_layers; ++l)
    if (c.is_moe_layer(l)) return false;  // the experts' sums are not in lanes
  const int64_t wo = lane_width(c.q_dim(), lane_unit(weights, tensor_name({0, Matrix::Wo}), c.head_size())),
                w2 = lane_width(c.hidden_dim, lane_unit(weights, tensor_name({0, Matrix::W2}), 1));
  return std::ranges::all_of(plans,
                             [&](const ShardPlan& q) { return whole_subtree(q.q_rows(), wo) && whole_subtree(q.ffn, w2); });
}

Llama::~Llama() = default;
Llama::Llama(Llama&&) noexcept = default;
Llama& Llama::operator=(Llama&&) noexcept = default;

Llama Llama::on_huge_pages(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group, nn::KvDtype kv_dtype) {
  const tensor::HugePageArena weights_on_huge_pages;
  return Llama(weights, std::move(tensor_group), std::move(expert_group), kv_dtype);
}

Llama Llama::on_huge_pages(const WeightSource& weights, const Placement& placement, dist::Device& dev, nn::KvDtype kv_dtype) {
  const tensor::HugePageArena weights_on_huge_pages;
  return Llama(weights, placement, dev, kv_dtype);
}

Llama::Llama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group, nn::KvDtype kv_dtype)
    : Llama(weights, std::move(tensor_group), std::move(expert_group), kv_dtype, nullptr) {}

Llama::Llama(const WeightSource& weights, const Placement& placement, dist::Device& dev, nn::KvDtype kv_dtype)
    : Llama(weights, placement.tensor_group(dev), placement.expert_group(dev), kv_dtype, &placement) {}

Llama::Llama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group, nn::KvDtype kv_dtype,
             const Placement* placement)
    : core_(weights.config(), std::move(tensor_group), std::move(expert_group),
            placement ? placement->plans() : std::vector<ShardPlan>{}),
      kv_dtype_(kv_dtype),
      vocab_(std::make_unique<Vocab>()) {
  const LlamaConfig& c = core_.config;
  const ShardPlan& plan = core_.plan;
  vocab_->tied = c.shared_classifier;
  norm_ = core_.local_slice(weights, "norm");
  require_memory_for_kv_cache(c, plan.kv_rows().count, kv_dtype_);  // before any weight is copied (made at first use)
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    L.attention_norm = core_.block_slice(weights, {l, Matrix::AttentionNorm});
    L.ffn_norm = core_.block_slice(weights, {l, Matrix::FfnNorm});
    L.qkv_extras = core_.load_qkv_extras(weights, l);
  }
  if (holds_packed_weights(weights)) load_packed_layers(weights);
  else load_f32_layers(weights);
  if (const LoraAdapterSet* set = weights.adapter()) attach_lora(*set);
  split_invariant_ = placement ? placement->split_invariant()
                               : model::split_invariant(weights, core_.all_plans, core_.expert_group.size());
  if (core_.expert_group.size() > 1)
    for (int l = 0; l < c.n_layers; ++l)
      if (c.is_moe_layer(l)) {
        Layer& L = layers_[static_cast<size_t>(l)];
        L.ffn = std::make_unique<ExpertParallelRows>(std::move(L.ffn), core_.expert_group, c.dim);
      }
  logits_local_.resize(static_cast<size_t>(plan.vocab.count));
  logits_.resize(static_cast<size_t>(c.vocab_size));
  for (const auto& q : core_.all_plans) vocab_counts_.push_back(q.vocab.count);
}

bool Llama::packed() const { return std::holds_alternative<PackedVocab>(vocab_->weights); }

void Llama::load_f32_layers(const WeightSource& weights) {
  F32Vocab v{nn::VocabParallelEmbedding(core_.local_slice(weights, "tok_embeddings"), core_.vocab_ranges(), core_.group), {}};
  if (!vocab_->tied) v.output = nn::Linear(core_.local_slice(weights, "output"));
  vocab_->weights = std::move(v);
  for (int l = 0; l < core_.config.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    std::vector<nn::Linear> qkv;
    for (Matrix m : linear_parts(Matrix::Wq)) qkv.emplace_back(core_.block_slice(weights, {l, m}));
    L.qkv = nn::AllToShardedLinear(std::move(qkv), core_.group);
    L.wo = core_.load_wo(weights, l);
    L.ffn = core_.config.is_moe_layer(l) ? core_.load_f32_feed_forward(weights, l) : core_.load_dense_ffn(weights, l);
  }
}

// Frozen checkpoints: every matrix in its stored format (f32 ones as f32 PackedMatrix), this
// device's rows or whole-group columns only; the embedding by vocabulary rows, like the f32 one.
void Llama::load_packed_layers(const WeightSource& weights) {
  const LlamaConfig& c = core_.config;
  const ShardPlan& plan = core_.plan;
  const int64_t C = c.dim, V = c.vocab_size;
  PackedVocab v{nn::PackedVocabParallelEmbedding(load_packed(weights, "tok_embeddings", V, C, plan.vocab.offset, plan.vocab.count),
                                                 core_.vocab_ranges(), core_.group),
                {}};
  if (!vocab_->tied) v.output = nn::QuantizedAllToShardedLinear({packed_rows(weights, "output", V, C, plan.vocab)}, core_.group);
  vocab_->weights = std::move(v);
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    L.qkv = core_.load_packed_qkv(weights, l);
    L.wo = core_.load_wo(weights, l);
    // MoE: experts stay packed (nn/moe.h QuantizedMoeFeedForward)
    L.ffn = c.is_moe_layer(l) ? make_packed_moe(weights, core_, l) : core_.load_dense_ffn(weights, l);
  }
}

// Each adapted matrix's A and B, sliced as its base: B's rows of wq wk wv w1 w3 by this device's
// rows (A whole), A's columns of wo and w2 by this device's columns (B whole), in the base's lanes.
void Llama::attach_lora(const LoraAdapterSet& set) {
  const LlamaConfig& c = core_.config;
  const ShardPlan& plan = core_.plan;
  const float scale = set.scale();
  const dist::Range q_rows = plan.q_rows(), ffn_rows = plan.ffn;
  auto a_whole = [&](const std::string& n) { return set.tensors.at(n + ".lora_a"); };
  auto b_whole = [&](const std::string& n) { return set.tensors.at(n + ".lora_b"); };
  auto b_rows = [&](const std::string& n, dist::Range rows) {  // [rows, r] of B [OUT, r]
    const Tensor& b = set.tensors.at(n + ".lora_b");
    return Tensor({rows.count, b.dim(1)}, b.rows(rows.offset, rows.count));
  };
  auto a_columns = [&](const std::string& n, dist::Range cols) {  // [r, cols] of A [r, IN]
    const Tensor& a = set.tensors.at(n + ".lora_a");
    const int64_t r = a.dim(0), IN = a.dim(1);
    std::vector<float> v(static_cast<size_t>(r * cols.count));
    for (int64_t k = 0; k < r; ++k) std::copy_n(a.data() + k * IN + cols.offset, cols.count, v.data() + k * cols.count);
    return Tensor({r, cols.count}, v);
  };
  // The parts of block l's AllToSharded linear `first` (wq|wk|wv, w1|w3), whose output columns
  // hold each part's rows of this device one after another.
  auto row_parts = [&](int l, Matrix first) {
    std::vector<nn::LoraAllToSharded::Part> parts;
    int64_t column = 0;
    for (Matrix m : linear_parts(first)) {
      const std::string name = tensor_name({l, m});
      const dist::Range rows = plan.range_of(facts(m).sharded_dim);
      if (lora_adapts(set, name)) parts.push_back({a_whole(name), b_rows(name, rows), column});
      column += rows.count;
    }
    return nn::LoraAllToSharded(std::move(parts), scale);
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string wo = tensor_name({l, Matrix::Wo}), w2_name = tensor_name({l, Matrix::W2});
    Layer& L = layers_[static_cast<size_t>(l)];
    L.qkv_lora = row_parts(l, Matrix::Wq);
    if (lora_adapts(set, wo)) {
      if (L.wo.in_features() != q_rows.count) throw std::logic_error("llama: wo's local columns are not the local heads' rows");
      L.wo_lora.emplace(a_columns(wo, q_rows), b_whole(wo), L.wo.lanes(), scale, core_.group);
    }
    if (!lora_adapts(set, tensor_name({l, Matrix::W1})) && !lora_adapts(set, tensor_name({l, Matrix::W3})) &&
        !lora_adapts(set, w2_name))
      continue;
    auto* ffn = dynamic_cast<nn::QuantizedSwiGluFeedForward*>(L.ffn.get());
    if (!ffn) throw std::invalid_argument("llama: LoRA on layer " + std::to_string(l) + "'s feed-forward, a mixture of experts");
    std::optional<nn::LoraShardedToAll> w2;
    if (lora_adapts(set, w2_name)) w2.emplace(a_columns(w2_name, ffn_rows), b_whole(w2_name), ffn->w2_lanes(), scale, core_.group);
    ffn->set_lora(row_parts(l, Matrix::W1), std::move(w2));
  }
}

Llama::KvCache Llama::new_kv_cache(int positions) const {
  const int S = core_.config.seq_len;
  if (positions < 0 || positions > S)
    throw std::invalid_argument("llama: a KV cache of " + std::to_string(positions) + " positions: seq_len is " + std::to_string(S));
  return new_kv_pool(1, positions ? positions : S, kv_dtype_);
}

Llama::KvCache Llama::new_kv_pool(int blocks, int block_size, nn::KvDtype dtype) const {
  if (blocks < 1 || block_size < 1)
    throw std::invalid_argument("llama: a KV pool of " + std::to_string(blocks) + " blocks of " + std::to_string(block_size) +
                                " positions");
  KvCache cache;
  cache.blocks_ = blocks;
  cache.block_size_ = block_size;
  cache.dtype_ = dtype;
  const size_t bytes = static_cast<size_t>(int64_t{blocks} * block_size * core_.plan.kv_rows().count * nn::kv_dtype_bytes(dtype));
  cache.k_.assign(layers_.size(), std::vector<std::byte>(bytes));
  cache.v_.assign(layers_.size(), std::vector<std::byte>(bytes));
  return cache;
}

int64_t Llama::KvCache::bytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < k_.size(); ++l) n += static_cast<int64_t>(k_[l].size() + v_[l].size());
  return n;
}

Llama::KvCache& Llama::own_cache() {
  if (own_cache_.blocks_ == 0) own_cache_ = new_kv_cache();
  return own_cache_;
}

void Llama::blocks_forward(std::span<const int> tokens, int pos) {
  const Segment whole{0, static_cast<int64_t>(tokens.size()), pos, &own_cache(), WHOLE_CACHE};
  blocks_forward(tokens, std::span<const Segment>(&whole, 1));
}

void Llama::blocks_forward(std::span<const int> tokens, std::span<const Segment> segments) {
  const tensor::DecodeRows row_by_row;  // every row's bits its own, however many run beside it (llama.h)
  const LlamaConfig& c = core_.config;
  const int64_t P = static_cast<int64_t>(tokens.size()), C = c.dim;
  for (const Segment& s : segments) {
    const int64_t positions = static_cast<int64_t>(s.blocks.size()) * s.cache->block_size_;
    if (s.count < 1 || s.pos < 0 || s.pos + s.count > positions)
      throw std::out_of_range("llama: " + std::to_string(s.count) + " token(s) at position " + std::to_string(s.pos) +
                              " outside [0, " + (s.cache == &own_cache_ ? "seq_len" : "its KV blocks' positions") +
                              " = " + std::to_string(positions) + ")");
    for (int32_t b : s.blocks)
      if (b < 0 || b >= s.cache->blocks_)
        throw std::out_of_range("llama: KV block " + std::to_string(b) + " outside a pool of " + std::to_string(s.cache->blocks_));
  }
  const nn::AttentionShape shape = core_.attention_shape();
  const int64_t QKV = shape.qkv_dim(), QL = shape.q_dim();
  auto size = [](std::vector<float>& v, int64_t n) { v.resize(static_cast<size_t>(n)); };
  Run& r = run_;
  size(r.x, P * C); size(r.xb, P * C); size(r.xb2, P * C); size(r.qkv, P * QKV); size(r.y, P * QL);
  float* x = r.x.data();
  vocab_->embed(x, tokens);  // all_gather_v of the rows from their owners
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    // attention rmsnorm, then q, k, v of the local heads (no communication)
    nn::rmsnorm_forward(r.xb.data(), nullptr, x, L.attention_norm.data(), P, C, c.norm_eps);
    L.qkv_forward(r.qkv.data(), r.xb.data(), P);
    if (!L.qkv_lora.empty()) L.qkv_lora.forward_add(r.qkv.data(), QKV, r.xb.data(), P);  // LoRA (no communication)
    core_.finish_qkv(r.qkv.data(), P, L.qkv_extras);
    // each segment: RoPE at its positions, k, v into its cache there, causal attention over the cache
    for (const Segment& s : segments) {
      float* qkv = r.qkv.data() + s.first * QKV;
      core_.rope_forward(qkv, s.count, s.pos, s.count);
      const nn::KvBlocks kv{s.cache->k_[l].data(), s.cache->v_[l].data(), s.blocks, s.cache->block_size_, s.cache->dtype_};
      nn::attention_cached(r.y.data() + s.first * QL, qkv, kv, s.pos, s.count, shape);
    }
    // wo over the local heads' columns, all_sum; residual connection back into x
    L.wo.forward(r.xb2.data(), r.y.data(), P);
    if (L.wo_lora) L.wo_lora->forward_add(r.xb2.data(), r.y.data(), P);  // LoRA: all_sum of [P, r]
    for (int64_t i = 0; i < P * C; ++i) x[i] += r.xb2[static_cast<size_t>(i)];
    // ffn rmsnorm, feed-forward (ends in an all_sum), residual
    nn::rmsnorm_forward(r.xb.data(), nullptr, x, L.ffn_norm.data(), P, C, c.norm_eps);
    L.ffn->forward(r.xb2.data(), r.xb.data(), P);
    for (int64_t i = 0; i < P * C; ++i) x[i] += r.xb2[static_cast<size_t>(i)];
  }
}

int64_t Llama::step_local(std::span<const int> tokens, std::span<const SequenceRows> sequences, KvCache& pool) {
  const int64_t C = core_.config.dim, V = core_.config.vocab_size;
  std::vector<Segment> segments;
  int64_t rows = 0, wanted = 0;
  for (const SequenceRows& q : sequences) {
    segments.push_back({rows, q.count, q.pos, &pool, q.blocks});
    rows += q.count;
    if (q.logits < 0 || q.logits > q.count)
      throw std::invalid_argument("llama: the logits of " + std::to_string(q.logits) + " rows of a sequence's " + std::to_string(q.count));
    wanted += q.logits;
  }
  if (rows != static_cast<int64_t>(tokens.size()))
    throw std::invalid_argument("llama: a step of " + std::to_string(tokens.size()) + " tokens for " + std::to_string(rows) + " rows");
  blocks_forward(tokens, segments);
  if (wanted == 0) return 0;  // prompt chunks only (every device has the same sequences)
  std::vector<float> last(static_cast<size_t>(wanted * C));  // [wanted, C] the last rows of each sequence asking
  int64_t n = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t first = segments[i].first + segments[i].count - sequences[i].logits;
    std::copy_n(run_.x.data() + first * C, sequences[i].logits * C, last.data() + C * n);
    n += sequences[i].logits;
  }
  // Kept between steps: a fresh [wanted, V] per step would page-fault in megabytes of zeros.
  step_logits_.resize(static_cast<size_t>(wanted * V));
  if (core_.group.size() == 1) {
    head_local(step_logits_.data(), last.data(), wanted);  // alone: this device's rows are the vocabulary
  } else {
    step_local_.resize(static_cast<size_t>(wanted * core_.plan.vocab.count));  // [wanted, VL]
    head_local(step_local_.data(), last.data(), wanted);
  }
  return wanted;
}

std::span<float> Llama::step(std::span<const int> tokens, std::span<const SequenceRows> sequences, KvCache& pool) {
  if (step_local(tokens, sequences, pool) == 0) return {};
  return step_logits();
}

std::span<float> Llama::step_logits() {
  if (core_.group.size() > 1) {
    const int64_t wanted = static_cast<int64_t>(step_local_.size()) / core_.plan.vocab.count;
    const std::vector<float> full = core_.gather_vocab_columns(step_local_.data(), wanted);
    std::copy(full.begin(), full.end(), step_logits_.begin());
  }
  return step_logits_;
}

std::span<const int> Llama::step_greedy(std::span<const int> tokens, std::span<const SequenceRows> sequences, KvCache& pool) {
  const int64_t wanted = step_local(tokens, sequences, pool);
  step_tokens_.resize(static_cast<size_t>(wanted));
  if (wanted == 0) return {};  // prompt chunks only: nothing to gather
  argmax_rows(core_.group.size() == 1 ? step_logits_.data() : step_local_.data(), wanted, step_tokens_.data());
  return step_tokens_;
}

void Llama::logits_local(float* local, std::span<const int> tokens, int pos, int64_t rows) {
  const int64_t C = core_.config.dim;
  blocks_forward(tokens, pos);
  head_local(local, run_.x.data() + (static_cast<int64_t>(tokens.size()) - rows) * C, rows);
}

void Llama::head_local(float* local, float* x, int64_t rows) {
  const tensor::DecodeRows row_by_row;
  nn::rmsnorm_forward(x, nullptr, x, norm_.data(), rows, core_.config.dim, core_.config.norm_eps);
  vocab_->classify(local, x, rows);  // this device's vocabulary rows
}

float* Llama::last_logits_local(std::span<const int> tokens, int pos) {
  float* local = core_.group.size() == 1 ? logits_.data() : logits_local_.data();  // alone: straight into the logits
  logits_local(local, tokens, pos, 1);
  return local;
}

std::span<const float> Llama::gather_logits(const float* local) {
  if (core_.group.size() > 1)  // split -> mirrored
    core_.group.all_gather_v(std::span<const float>(local, static_cast<size_t>(core_.plan.vocab.count)), logits_, vocab_counts_);
  return logits_;
}

int Llama::argmax_over_devices(const float* local) {
  int token = -1;
  argmax_rows(local, 1, &token);
  return token;
}

void Llama::argmax_rows(const float* local, int64_t rows, int* tokens) {
  dist::Group& group = core_.group;
  const int64_t VL = core_.plan.vocab.count, TP = group.size();
  // Gather (logit, token) records instead of the logits: 8 bytes per row and device; a device with
  // a non-finite logit in a row sends NaN for it, so every device returns -1 there.
  struct Candidate {
    float logit;
    int32_t token;
  };
  std::vector<Candidate> mine(static_cast<size_t>(rows));  // [rows]
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = local + r * VL;
    const int64_t best = std::max_element(row, row + VL) - row;  // first maximum, as llama2.c
    const bool finite = std::all_of(row, row + VL, [](float v) { return std::isfinite(v); });
    mine[static_cast<size_t>(r)] = {finite ? row[best] : NAN, static_cast<int32_t>(core_.plan.vocab.offset + best)};
  }
  std::vector<Candidate> all = mine;  // [TP, rows]
  if (TP > 1) {
    all.resize(static_cast<size_t>(TP * rows));
    group.all_gather(std::as_bytes(std::span<const Candidate>(mine)), std::as_writable_bytes(std::span<Candidate>(all)));
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t winner = r;  // devices hold ascending vocabulary ranges: strict > keeps the lowest token on ties
    tokens[r] = -1;
    bool finite = true;
    for (int64_t d = 0; d < TP && finite; ++d) {
      const Candidate& c = all[static_cast<size_t>(d * rows + r)];
      finite = !std::isnan(c.logit);
      if (finite && c.logit > all[static_cast<size_t>(winner)].logit) winner = d * rows + r;
    }
    if (finite) tokens[r] = all[static_cast<size_t>(winner)].token;
  }
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
  const int64_t P = static_cast<int64_t>(tokens.size());
  std::vector<float> local(static_cast<size_t>(P * core_.plan.vocab.count));  // [P, VL]
  logits_local(local.data(), tokens, pos, P);
  return core_.gather_vocab_columns(local.data(), P);  // [P, V]
}

std::vector<float> Llama::prefill_losses(std::span<const int> tokens, std::span<const int> targets, int64_t windows) {
  const int64_t N = static_cast<int64_t>(tokens.size()), V = core_.config.vocab_size, VL = core_.plan.vocab.count;
  if (windows < 1 || N % windows != 0 || static_cast<int64_t>(targets.size()) != N)
    throw std::invalid_argument("llama: prefill_losses needs windows of equal length and a target per token");
  for (int t : targets)
    if (t < 0 || t >= V) throw std::out_of_range("llama: target " + std::to_string(t) + " outside the vocabulary");
  const int64_t S = N / windows;
  if (S > core_.config.seq_len)
    throw std::out_of_range("llama: a window of " + std::to_string(S) + " tokens exceeds seq_len = " + std::to_string(core_.config.seq_len));
  std::vector<KvCache> caches;  // each window attends over its own positions
  std::vector<Segment> segments;
  for (int64_t w = 0; w < windows; ++w) caches.push_back(new_kv_cache(static_cast<int>(S)));
  for (int64_t w = 0; w < windows; ++w) segments.push_back({w * S, S, 0, &caches[static_cast<size_t>(w)], WHOLE_CACHE});
  blocks_forward(tokens, segments);
  std::vector<float> probs(static_cast<size_t>(N * VL)), losses(static_cast<size_t>(S));  // [N, VL], [S]
  head_local(probs.data(), run_.x.data(), N);
  std::vector<float> means;
  for (int64_t w = 0; w < windows; ++w) {
    float* window = probs.data() + w * S * VL;
    means.push_back(nn::cross_entropy_forward(losses.data(), window, window, targets.data() + w * S, core_.plan.vocab.offset, S,
                                              VL, core_.group));
  }
  return means;
}

int64_t Llama::parameter_bytes() const {
  int64_t n = norm_.numel();
  int64_t bytes = vocab_->bytes();
  for (const auto& L : layers_) {
    const QkvExtras& e = L.qkv_extras;
    n += L.attention_norm.numel() + L.ffn_norm.numel() + e.bias.numel() + e.q_norm.numel() + e.k_norm.numel();
    bytes += L.linears_bytes() + L.ffn->parameter_bytes() + L.qkv_lora.bytes() + (L.wo_lora ? L.wo_lora->bytes() : 0);
  }
  return bytes + n * static_cast<int64_t>(sizeof(float));
}

int64_t Llama::kv_cache_bytes() const {
  return 2 * core_.config.n_layers * int64_t{core_.config.seq_len} * core_.plan.kv_rows().count * nn::kv_dtype_bytes(kv_dtype_);
}

}  // namespace tpcli::model
