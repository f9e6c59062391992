#include "train/data_parallel_optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tpcli::train {

namespace {

// A whole local parameter as an optimizer slot; data_copies: data ranks holding the same gradient.
Slot whole_slot(const ParamEntry& e, double data_copies) {
  Slot s;
  s.value = e.value->span();
  s.grad = e.grad->span();
  s.decay = e.spec->weight_decay;
  s.norm_weight = e.tensor_norm_weight / data_copies;
  for (double w : e.row_tensor_norm_weights) s.row_norm_weights.push_back(w / data_copies);
  return s;
}

std::vector<int64_t> slot_sizes(const std::vector<Slot>& slots) {
  std::vector<int64_t> sizes;
  for (const Slot& s : slots) sizes.push_back(static_cast<int64_t>(s.value.size()));
  return sizes;
}

}  // namespace

std::vector<Slot> make_slots(model::TrainableLlama& llama, const model::LlamaConfig&, const ParallelAxes& axes, int tensor_rank) {
  ParamTable table(llama, axes, tensor_rank, int64_t{1} << 40);
  std::vector<Slot> slots;
  for (const ParamEntry& e : table.entries()) slots.push_back(whole_slot(e, e.offset < 0 ? 1.0 : axes.data_size));
  return slots;
}

DataParallelOptimizer::DataParallelOptimizer(model::TrainableLlama& llama, const ParallelAxes& axes, int tensor_rank,
                                             const AdamWOptions& adamw, bool shard, int64_t bucket_elems)
    : table_(llama, axes, tensor_rank, bucket_elems),
      axes_(axes),
      shard_(shard),
      local_adam_(adamw, {}),
      shard_adam_(adamw, {}) {
  build_local_slots(!shard);
  local_adam_ = AdamW(adamw, slot_sizes(local_slots_));
  if (shard) {
    build_shard_slots();
    shard_adam_ = AdamW(adamw, slot_sizes(shard_slots_));
  }
  int64_t largest = 0;
  for (const auto& b : table_.buckets()) largest = std::max(largest, b.count);
  bucket_.resize(static_cast<size_t>(largest));
}

void DataParallelOptimizer::build_local_slots(bool all) {
  const auto& entries = table_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const bool in_flat = entries[i].offset >= 0;
    if (in_flat && !all) continue;
    local_entries_.push_back(i);
    local_slots_.push_back(whole_slot(entries[i], in_flat ? axes_.data_size : 1.0));
  }
}

// Each bucket's chunk of this rank, cut at parameter boundaries (and at KV head rows, whose norm
// weights differ) into slots over shard_values_ / shard_grads_. No data rank shares an element.
void DataParallelOptimizer::build_shard_slots() {
  const int D = axes_.data_size, d = axes_.data->rank();
  int64_t S = 0;
  for (const auto& b : table_.buckets()) {
    const dist::Range mine = dist::even_split(b.count, D, d);
    chunks_.push_back({{b.offset + mine.offset, mine.count}, S, dist::even_split_counts(b.count, D)});
    S += mine.count;
  }
  shard_values_.resize(static_cast<size_t>(S));
  shard_grads_.resize(static_cast<size_t>(S));
  const auto values = table_.values();
  for (const Chunk& c : chunks_) table_.gather(c.flat, values, shard_values_.data() + c.shard_offset);
  // Slots in flat order (the entries are in llama_parameters order, the flat buffer in backward
  // order): shard_moments() concatenates the slots' moments as the (S,) positions run.
  std::vector<const ParamEntry*> by_offset;
  for (const ParamEntry& e : table_.entries()) by_offset.push_back(&e);
  std::ranges::sort(by_offset, {}, [](const ParamEntry* e) { return e->offset; });
  for (const Chunk& c : chunks_) {
    const int64_t end = c.flat.offset + c.flat.count;
    for (const ParamEntry* entry : by_offset) {
      const ParamEntry& e = *entry;
      if (e.offset < 0 || e.offset >= end || e.offset + e.numel() <= c.flat.offset) continue;
      const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(e.row_tensor_norm_weights.size()));
      const int64_t row_len = e.numel() / rows;
      int64_t at = std::max(c.flat.offset, e.offset) - e.offset;
      const int64_t last = std::min(end, e.offset + e.numel()) - e.offset;
      while (at < last) {
        const int64_t row = at / row_len, stop = std::min(last, (row + 1) * row_len);
        const size_t pos = static_cast<size_t>(c.shard_offset + e.offset + at - c.flat.offset);
        Slot s;
        s.value = std::span<float>(shard_values_).subspan(pos, static_cast<size_t>(stop - at));
        s.grad = std::span<float>(shard_grads_).subspan(pos, static_cast<size_t>(stop - at));
        s.decay = e.spec->weight_decay;
        s.norm_weight = e.row_tensor_norm_weights.empty() ? e.tensor_norm_weight
                                                          : e.row_tensor_norm_weights[static_cast<size_t>(row)];
        shard_slots_.push_back(std::move(s));
        at = stop;
      }
    }
  }
}

void DataParallelOptimizer::reduce_gradients(int micro_batches) {
  GradientExchange(*this, micro_batches, false).finish();
}

GradientExchange::GradientExchange(DataParallelOptimizer& optimizer, int micro_batches, bool start_early)
    : o_(optimizer),
      micro_batches_(micro_batches),
      start_early_(start_early),
      reduce_(optimizer.shard_ || optimizer.axes_.data_size > 1 || micro_batches > 1),
      expert_scaled_(optimizer.table_.entries().size(), false) {}

// nn/moe.h: an expert's owner already sums every member's tokens; 1/G makes it the mean. Replicated
// over the data axis (in the flat buffer), before the bucket's sum; dealt out over it, also 1/K.
void GradientExchange::scale_experts(int64_t end) {
  const auto& entries = o_.table_.entries();
  const float expert_scale = 1.0f / static_cast<float>(o_.axes_.expert_group_size);
  for (size_t i = 0; i < entries.size(); ++i) {
    const ParamEntry& e = entries[i];
    if (!e.spec->expert || expert_scaled_[i] || (e.offset >= 0 && e.offset + e.numel() > end)) continue;
    if (e.offset < 0 && end < o_.table_.flat_size()) continue;  // local experts: at finish()
    float scale = expert_scale;
    if (e.offset < 0) scale /= static_cast<float>(micro_batches_);
    for (float& x : e.grad->span()) x *= scale;
    expert_scaled_[i] = true;
  }
}

void GradientExchange::gradients_ready(int64_t end) {
  if (!start_early_ || !reduce_) return;
  scale_experts(end);
  const auto& buckets = o_.table_.buckets();
  while (next_bucket_ < buckets.size() && buckets[next_bucket_].offset + buckets[next_bucket_].count <= end)
    start_bucket(next_bucket_++);
}

// Where bucket b's sum lands: this rank's chunk of the sharded gradients, or the bucket itself.
std::span<float> GradientExchange::summed(size_t b) const {
  std::span<float> grads = o_.table_.grads(o_.table_.buckets()[b]);
  if (!o_.shard_) return grads;
  const DataParallelOptimizer::Chunk& c = o_.chunks_[b];
  return std::span<float>(o_.shard_grads_).subspan(static_cast<size_t>(c.shard_offset), static_cast<size_t>(c.flat.count));
}

void GradientExchange::start_bucket(size_t b) {
  std::span<float> grads = o_.table_.grads(o_.table_.buckets()[b]);
  pending_.push_back(o_.shard_ ? o_.axes_.data->start_reduce_scatter(grads, summed(b))  // psum_scatter: this rank's chunk
                               : o_.axes_.data->start_all_sum(grads));
}

void GradientExchange::scale_bucket(size_t b) {
  const float inv = 1.0f / static_cast<float>(o_.axes_.data_size * micro_batches_);
  for (float& x : summed(b)) x *= inv;
}

void GradientExchange::finish() {
  scale_experts(o_.table_.flat_size());
  if (!reduce_) return;
  const auto& buckets = o_.table_.buckets();
  if (start_early_)
    while (next_bucket_ < buckets.size()) start_bucket(next_bucket_++);
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!start_early_) {  // blocking, in place
      std::span<float> grads = o_.table_.grads(buckets[b]);
      if (o_.shard_) {
        o_.axes_.data->reduce_scatter(grads, summed(b));
      } else {
        o_.axes_.data->all_sum(grads);
      }
    } else {
      pending_[b].wait();
    }
    scale_bucket(b);
  }
}

double DataParallelOptimizer::global_grad_norm(bool local_finite) {
  float sq = static_cast<float>(local_grad_sq(local_slots_) + local_grad_sq(shard_slots_)) + (local_finite ? 0.0f : NAN);
  axes_.world->all_sum(std::span<float>(&sq, 1));
  return std::sqrt(static_cast<double>(sq));
}

void DataParallelOptimizer::clip(double norm, double max_norm) {
  clip_grads(local_slots_, norm, max_norm);
  clip_grads(shard_slots_, norm, max_norm);
}

void DataParallelOptimizer::step(double lr) {
  local_adam_.step(local_slots_, lr);
  if (!shard_) return;
  shard_adam_.step(shard_slots_, lr);
  const auto values = table_.values();
  for (size_t b = 0; b < chunks_.size(); ++b) {
    const Chunk& c = chunks_[b];
    const dist::Range bucket = table_.buckets()[b];
    std::span<float> buf(bucket_.data(), static_cast<size_t>(bucket.count));
    axes_.data->all_gather_v(std::span<const float>(shard_values_).subspan(static_cast<size_t>(c.shard_offset),
                                                                           static_cast<size_t>(c.flat.count)),
                             buf, c.counts);
    table_.scatter(bucket, buf.data(), values);
  }
}

std::vector<float> DataParallelOptimizer::shard_moments(int which) const {
  auto& adam = const_cast<AdamW&>(shard_adam_);
  const auto& m = which == 0 ? adam.exp_avg() : adam.exp_avg_sq();
  std::vector<float> flat;
  flat.reserve(shard_values_.size());
  for (const auto& t : m) flat.insert(flat.end(), t.span().begin(), t.span().end());
  return flat;
}

void DataParallelOptimizer::set_shard_moments(int which, const std::vector<float>& flat) {
  auto& m = which == 0 ? shard_adam_.exp_avg() : shard_adam_.exp_avg_sq();
  size_t pos = 0;
  for (auto& t : m) {
    std::copy(flat.begin() + static_cast<ptrdiff_t>(pos), flat.begin() + static_cast<ptrdiff_t>(pos) + t.numel(), t.data());
    pos += static_cast<size_t>(t.numel());
  }
}

std::vector<tensor::Tensor> DataParallelOptimizer::moments(int which) {
  const auto& entries = table_.entries();
  std::vector<tensor::Tensor> out;
  for (const auto& e : entries) out.emplace_back(e.value->shape());
  const auto& local = which == 0 ? local_adam_.exp_avg() : local_adam_.exp_avg_sq();
  for (size_t k = 0; k < local_entries_.size(); ++k)
    std::copy(local[k].span().begin(), local[k].span().end(), out[local_entries_[k]].data());
  if (!shard_) return out;
  std::vector<tensor::Tensor*> targets;
  for (auto& t : out) targets.push_back(&t);
  const std::vector<float> mine = shard_moments(which);
  for (size_t b = 0; b < chunks_.size(); ++b) {  // collective: every rank's chunks of each bucket
    const Chunk& c = chunks_[b];
    std::span<float> buf(bucket_.data(), static_cast<size_t>(table_.buckets()[b].count));
    axes_.data->all_gather_v(std::span<const float>(mine).subspan(static_cast<size_t>(c.shard_offset),
                                                                  static_cast<size_t>(c.flat.count)),
                             buf, c.counts);
    table_.scatter(table_.buckets()[b], buf.data(), targets);
  }
  return out;
}

void DataParallelOptimizer::set_moments(int which, const std::vector<tensor::Tensor>& full_local) {
  const auto& entries = table_.entries();
  if (full_local.size() != entries.size()) throw std::logic_error("set_moments: one tensor per parameter expected");
  auto& local = which == 0 ? local_adam_.exp_avg() : local_adam_.exp_avg_sq();
  for (size_t k = 0; k < local_entries_.size(); ++k) {
    const tensor::Tensor& src = full_local[local_entries_[k]];
    if (src.numel() != local[k].numel()) throw std::logic_error("set_moments: size mismatch for " + entries[local_entries_[k]].spec->name);
    std::copy(src.span().begin(), src.span().end(), local[k].data());
  }
  if (!shard_) return;
  std::vector<tensor::Tensor*> sources;
  for (const auto& t : full_local) sources.push_back(const_cast<tensor::Tensor*>(&t));
  std::vector<float> mine(shard_values_.size());
  for (const Chunk& c : chunks_) table_.gather(c.flat, sources, mine.data() + c.shard_offset);
  set_shard_moments(which, mine);
}

void DataParallelOptimizer::set_steps(int64_t t) {
  local_adam_.set_steps(t);
  shard_adam_.set_steps(t);
}

int64_t DataParallelOptimizer::moment_bytes() const {
  int64_t n = static_cast<int64_t>(shard_values_.size());
  for (const Slot& s : local_slots_) n += static_cast<int64_t>(s.value.size());
  return 2 * n * static_cast<int64_t>(sizeof(float));
}

}  // namespace tpcli::train
