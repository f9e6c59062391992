#include "model/shard_plan.h"

#include <stdexcept>
#include <string>

namespace tpcli::model {

namespace {

void require_at_least(int64_t have, const char* what, int devices) {
  if (have < devices)
    throw std::invalid_argument("cannot split " + std::to_string(have) + " " + what + " over " +
                                std::to_string(devices) + " devices: use at most " + std::to_string(have) +
                                " tensor-parallel devices");
}

// KV heads used by query heads [first, first + count): contiguous, since head h uses h / kv_mul.
dist::Range kv_heads_for(dist::Range heads, int kv_mul) {
  int64_t first = heads.offset / kv_mul;
  int64_t last = (heads.offset + heads.count - 1) / kv_mul;
  return {first, last - first + 1};
}

// Quantized checkpoints split w2's input columns (the FFN rows) on whole groups: the unit FFN
// rows are dealt out in. 1 when w2 is not quantized (no quantization, or F not a multiple of GS).
int64_t ffn_unit(const LlamaConfig& c, int64_t hidden) {
  if (!c.quantization || hidden % c.quantization->group_size != 0) return 1;
  return c.quantization->group_size;
}
int64_t ffn_unit(const LlamaConfig& c) { return ffn_unit(c, c.hidden_dim); }
// The same for the MoE experts' w2 (columns of FE): the expert hidden rows go in whole groups too.
int64_t expert_hidden(const LlamaConfig& c) { return c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim; }
int64_t expert_ffn_unit(const LlamaConfig& c) { return ffn_unit(c, expert_hidden(c)); }

dist::Range split_in_units(int64_t n, int64_t unit, int devices, int rank) {
  const dist::Range r = dist::even_split(n / unit, devices, rank);
  return {r.offset * unit, r.count * unit};
}

}  // namespace

void check_tensor_devices(const LlamaConfig& config, int devices) {
  if (devices < 1) throw std::invalid_argument("tensor-parallel devices = " + std::to_string(devices) + " must be >= 1");
  require_at_least(config.n_heads, "heads", devices);
  require_at_least(config.hidden_dim, "ffn rows (hidden_dim)", devices);
  if (ffn_unit(config) > 1)
    require_at_least(config.hidden_dim / ffn_unit(config), "quantization groups of ffn rows", devices);
  require_at_least(config.vocab_size, "vocabulary rows", devices);
  if (config.is_moe()) {
    require_at_least(expert_hidden(config), "expert ffn rows", devices);
    if (expert_ffn_unit(config) > 1)
      require_at_least(expert_hidden(config) / expert_ffn_unit(config), "quantization groups of expert ffn rows", devices);
  }
}

std::vector<ShardPlan> plan_all_shards(const LlamaConfig& config, int devices) {
  check_tensor_devices(config, devices);
  const int kv_mul = config.n_heads / config.n_kv_heads;
  std::vector<ShardPlan> plans(static_cast<size_t>(devices));
  std::vector<int> holders(static_cast<size_t>(config.n_kv_heads), 0);
  for (int r = 0; r < devices; ++r) {
    ShardPlan& p = plans[static_cast<size_t>(r)];
    p.devices = devices;
    p.rank = r;
    p.head_size = config.head_size();
    p.heads = dist::even_split(config.n_heads, devices, r);
    p.kv_heads = kv_heads_for(p.heads, kv_mul);
    p.ffn = split_in_units(config.hidden_dim, ffn_unit(config), devices, r);
    p.expert_ffn = split_in_units(expert_hidden(config), expert_ffn_unit(config), devices, r);
    p.vocab = dist::even_split(config.vocab_size, devices, r);
    for (int64_t k = p.kv_heads.offset; k < p.kv_heads.offset + p.kv_heads.count; ++k) ++holders[static_cast<size_t>(k)];
  }
  bool replicated = false;
  for (int h : holders) replicated = replicated || h > 1;
  for (auto& p : plans) p.kv_replicated = replicated;
  return plans;
}

ShardPlan plan_shards(const LlamaConfig& config, int devices, int rank) {
  if (rank < 0 || rank >= devices)
    throw std::invalid_argument("shard plan: rank " + std::to_string(rank) + " outside [0, " + std::to_string(devices) + ")");
  return plan_all_shards(config, devices)[static_cast<size_t>(rank)];
}

dist::Range ShardPlan::range_of(ShardedDim dim) const {
  switch (dim) {
    case ShardedDim::Vocab: return vocab;
    case ShardedDim::QueryHeads: return q_rows();
    case ShardedDim::KvHeads: return kv_rows();
    case ShardedDim::Hidden: return ffn;
    case ShardedDim::None:
    case ShardedDim::Experts: break;
  }
  throw std::logic_error("shard plan: a replicated or expert parameter has no tensor-parallel range");
}

}  // namespace tpcli::model
