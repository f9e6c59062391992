#include "train/memory.h"

#include <algorithm>
#include <cstdio>

#include "distributed/group.h"
#include "model/block_activations.h"
#include "model/packed_weights.h"
#include "model/shard_plan.h"
#include "nn/moe.h"

namespace tpcli::train {

namespace {

// Elements of `spec` held by the device with shard plan `plan` and local experts `experts`: the
// whole tensor when replicated, the experts' FE rows of each local expert, else the plan's range of
// the spec's sharded dimension, as rows ([range, in]) or columns ([out, range]).
int64_t local_numel(const model::ParamSpec& spec, const model::LlamaConfig& c, const model::ShardPlan& plan,
                    const dist::Range& experts) {
  const tensor::Shape& s = spec.shape;
  if (spec.split == model::Split::Replicated) return tensor::numel(s);
  if (spec.expert) return experts.count * plan.expert_ffn.count * c.dim;  // [E_L, FE_L, C] or [E_L, C, FE_L]
  const int64_t part = plan.range_of(spec.sharded_dim).count;
  return spec.split == model::Split::Rows ? part * (tensor::numel(s) / s[0]) : s[0] * part;  // 1-D: a bias
}

int64_t activation_floats(const model::LlamaConfig& c, const MemoryLayout& m, const model::ShardPlan& plan) {
  const model::BlockActivationSizes b = model::block_activation_sizes(c, plan, m.rows, m.seq_len, m.sequence_parallel);
  const model::HeadActivationSizes h = model::head_activation_sizes(c, plan, m.rows, m.seq_len, m.sequence_parallel);
  const int64_t L = c.n_layers;
  const int64_t block = b.saved() + b.ffn;
  const int64_t last = h.total() + b.tmp;  // after the blocks, and their one scratch
  if (m.recompute) return L * b.x_in + block + last;
  return L * (b.x_in + block) + last;
}

// Bytes of `spec`'s local part on a frozen base stored in `f` (QLoRA): the matrix as stored
// (model::stored_bytes; local columns that cut groups, as wo's may, hold the whole groups they
// touch), f32 when not packable.
int64_t base_bytes(const model::ParamSpec& spec, const tensor::WeightFormat& f, const model::LlamaConfig& c,
                   const model::ShardPlan& plan) {
  const int64_t F32 = sizeof(float);
  if (!model::packable(spec, f)) return local_numel(spec, c, plan, {}) * F32;
  const tensor::Shape& s = spec.shape;
  if (spec.split == model::Split::Replicated) return model::stored_bytes(f, s[0], s[1]);
  const dist::Range r = plan.range_of(spec.sharded_dim);
  if (spec.split == model::Split::Rows) return model::stored_bytes(f, r.count, s[1]);
  return model::stored_bytes(f, s[0], model::held_columns(f, r).count);
}

// The format `name` is stored in on a QLoRA base.
tensor::WeightFormat base_format(const MemoryLayout& m, const std::string& name) {
  const auto it = m.base_formats.find(name);
  return it == m.base_formats.end() ? *m.packed_base : it->second;
}

std::string megabytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

}  // namespace

DeviceBytes device_bytes(const model::LlamaConfig& config, const MemoryLayout& m, int tensor_rank, int data_rank,
                         int expert_rank) {
  const tensor::WeightFormat* packed = m.lora && m.packed_base ? &*m.packed_base : nullptr;
  model::LlamaConfig c = config;
  // The planner deals out the FFN rows in whole MLX groups (ggml blocks differ by tensor: a device's
  // part of a w2 they cut holds the whole blocks it touches, model/llama_core.h).
  if (packed && (packed->kind == tensor::WeightKind::Affine || packed->kind == tensor::WeightKind::Mxfp8))
    c.quantization = model::Quantization{packed->bits, packed->group_size,
                                         packed->kind == tensor::WeightKind::Mxfp8 ? "mxfp8" : "affine"};
  const auto plans = model::plan_all_shards(c, m.tensor);
  const model::ShardPlan& plan = plans[static_cast<size_t>(tensor_rank)];
  const dist::Range experts = c.is_moe() ? nn::local_experts(c.n_experts, m.expert_group, expert_rank) : dist::Range{};
  int64_t local = 0, trained = 0, flat = 0;  // every local element; those trained; those replicated over the data axis
  int64_t stored = 0;                         // QLoRA: the frozen base's bytes as stored
  for (const auto& spec : model::llama_parameters(c)) {
    if (packed) stored += base_bytes(spec, base_format(m, spec.name), c, plan);
    else local += local_numel(spec, c, plan, experts);
  }
  for (const auto& spec : m.lora ? model::lora_parameters(c, *m.lora) : model::llama_parameters(c)) {
    const int64_t n = local_numel(spec, c, plan, experts);
    trained += n;
    if (!(spec.expert && m.experts_on_data_axis)) flat += n;
  }
  if (m.lora) local += trained;
  int64_t moments = trained;
  if (m.shard_optimizer) {
    moments = trained - flat;
    for (int64_t o = 0; o < flat; o += m.bucket_elems)
      moments += dist::even_split(std::min(m.bucket_elems, flat - o), m.data, data_rank).count;
  }
  const int64_t f = static_cast<int64_t>(sizeof(float));
  return {stored + local * f, trained * f, 2 * moments * f, activation_floats(c, m, plan) * f};
}

int64_t data_replicated_elements(const model::LlamaConfig& c, const MemoryLayout& m, int tensor_rank) {
  const model::ShardPlan plan = model::plan_shards(c, m.tensor, tensor_rank);
  const dist::Range experts = c.is_moe() ? nn::local_experts(c.n_experts, m.expert_group, 0) : dist::Range{};
  int64_t flat = 0;
  for (const auto& spec : m.lora ? model::lora_parameters(c, *m.lora) : model::llama_parameters(c))
    if (!(spec.expert && m.experts_on_data_axis)) flat += local_numel(spec, c, plan, experts);
  return flat;
}

std::string describe(const DeviceBytes& b) {
  return "parameters " + megabytes(b.parameters) + ", gradients " + megabytes(b.gradients) + ", optimizer " +
         megabytes(b.optimizer) + ", activations " + megabytes(b.activations);
}

}  // namespace tpcli::train
