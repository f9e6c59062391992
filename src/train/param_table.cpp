#include "train/param_table.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/shard_plan.h"

namespace tpcli::train {

ParamTable::ParamTable(model::TrainableLlama& llama, const ParallelAxes& axes, int tensor_rank, int64_t bucket_elems) {
  if (bucket_elems < 1) throw std::invalid_argument("gradient buckets must hold at least 1 element");
  const auto plans = model::plan_all_shards(llama.config(), axes.tensor_size);
  const model::ShardPlan& mine = plans[static_cast<size_t>(tensor_rank)];
  for (auto& p : llama.parameters()) {
    ParamEntry e{p.spec, p.value, p.grad};
    const bool differs_over_data = p.spec->expert && axes.experts_on_data_axis;
    if (!differs_over_data) {
      e.offset = p.grad_offset;
      flat_size_ += e.numel();
    }
    e.tensor_norm_weight = p.spec->split == model::Split::Replicated ? 1.0 / axes.tensor_size : 1.0;
    if (p.spec->kv_heads && mine.kv_replicated) {
      // A KV head used by several devices' query heads is held (and its gradient summed) by each.
      for (int64_t h = mine.kv_heads.offset; h < mine.kv_heads.offset + mine.kv_heads.count; ++h) {
        int holders = 0;
        for (const auto& plan : plans) holders += plan.kv_heads.offset <= h && h < plan.kv_heads.offset + plan.kv_heads.count;
        e.row_tensor_norm_weights.push_back(1.0 / holders);
      }
    }
    entries_.push_back(std::move(e));
  }
  flat_grads_ = llama.grad_buffer().first(static_cast<size_t>(flat_size_));
  for (const ParamEntry& e : entries_)  // the model keeps the experts last: the rest is a prefix
    if (e.offset >= 0 && e.offset + e.numel() > flat_size_)
      throw std::logic_error("param table: " + e.spec->name + " lies outside the flat gradient prefix");
  buckets_ = bucket_ranges(flat_size_, bucket_elems);
}

std::vector<dist::Range> bucket_ranges(int64_t flat, int64_t bucket_elems) {
  std::vector<dist::Range> buckets;
  for (int64_t o = 0; o < flat; o += bucket_elems) buckets.push_back({o, std::min(bucket_elems, flat - o)});
  return buckets;
}

std::vector<tensor::Tensor*> ParamTable::values() const {
  std::vector<tensor::Tensor*> out;
  for (const auto& e : entries_) out.push_back(e.value);
  return out;
}

std::vector<tensor::Tensor*> ParamTable::grads() const {
  std::vector<tensor::Tensor*> out;
  for (const auto& e : entries_) out.push_back(e.grad);
  return out;
}

template <class Fn>
void ParamTable::for_each_piece(dist::Range r, Fn&& fn) const {
  const int64_t end = r.offset + r.count;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const ParamEntry& e = entries_[i];
    if (e.offset < 0 || e.offset >= end || e.offset + e.numel() <= r.offset) continue;
    const int64_t first = std::max(r.offset, e.offset), last = std::min(end, e.offset + e.numel());
    fn(i, first - e.offset, first - r.offset, last - first);
  }
}

void ParamTable::gather(dist::Range r, std::span<tensor::Tensor* const> tensors, float* out) const {
  for_each_piece(r, [&](size_t i, int64_t at, int64_t pos, int64_t n) {
    std::memcpy(out + pos, tensors[i]->data() + at, static_cast<size_t>(n) * sizeof(float));
  });
}

void ParamTable::scatter(dist::Range r, const float* in, std::span<tensor::Tensor* const> tensors) const {
  for_each_piece(r, [&](size_t i, int64_t at, int64_t pos, int64_t n) {
    std::memcpy(tensors[i]->data() + at, in + pos, static_cast<size_t>(n) * sizeof(float));
  });
}

}  // namespace tpcli::train
