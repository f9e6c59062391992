// tpcli::train — one optimizer step's collectives and FLOPs (see step_plan.h).
#include "train/step_plan.h"

#include <stdexcept>
#include <string_view>

#include "train/param_table.h"

namespace tpcli::train {

namespace {

using dist::CollectiveKind;
using model::PlannedCollective;
using model::Role;

// Summed by size: buckets of equal length become one line with calls = their count.
void add_per_bucket(std::vector<PlannedCollective>& out, const char* name, CollectiveKind kind, int64_t flat,
                    int64_t bucket_elems, const char* what) {
  for (const dist::Range& b : bucket_ranges(flat, bucket_elems)) {
    if (!out.empty() && std::string_view(out.back().name) == name && out.back().floats == b.count && out.back().role == Role::Data) {
      ++out.back().calls;
      continue;
    }
    out.push_back({Role::Data, name, kind, b.count, 1, what});
  }
}

}  // namespace

std::vector<PlannedCollective> plan_step_collectives(const model::LlamaConfig& c, const MemoryLayout& m, int grad_accum) {
  if (m.sequence_parallel && m.tensor > 1)
    throw std::invalid_argument("communication plan: sequence_parallel (collective matmuls over ppermutes) is not planned yet");
  const model::ShardPlan plan = model::plan_shards(c, m.tensor, 0);
  std::vector<PlannedCollective> out;
  if (m.data * m.tensor > 1) out.push_back({Role::World, "all_max", CollectiveKind::AllSum, 1, 1, "stop flag"});
  for (PlannedCollective p : model::plan_train_collectives(c, plan, m.rows, m.seq_len, m.recompute)) {
    p.calls *= grad_accum;
    out.push_back(p);
  }
  if (m.data > 1) {
    const int64_t flat = data_replicated_elements(c, m, 0);
    if (m.shard_optimizer) {
      add_per_bucket(out, "reduce_scatter", CollectiveKind::ReduceScatter, flat, m.bucket_elems, "gradient bucket");
    } else {
      add_per_bucket(out, "all_sum", CollectiveKind::AllSum, flat, m.bucket_elems, "gradient bucket");
    }
    out.push_back({Role::Data, "all_sum", CollectiveKind::AllSum, 1, 1, "loss (mean)"});
  }
  if (m.data * m.tensor > 1) out.push_back({Role::World, "all_sum", CollectiveKind::AllSum, 1, 1, "global gradient norm"});
  if (m.data > 1 && m.shard_optimizer)
    add_per_bucket(out, "all_gather", CollectiveKind::AllGather, data_replicated_elements(c, m, 0), m.bucket_elems,
                   "updated values");
  return out;
}

std::vector<model::PlannedWork> plan_step_work(const model::LlamaConfig& c, const MemoryLayout& m, int grad_accum) {
  const model::ShardPlan plan = model::plan_shards(c, m.tensor, 0);
  std::vector<model::PlannedWork> out = model::plan_train_work(c, plan, m.rows, m.seq_len, m.recompute);
  for (model::PlannedWork& w : out) w.calls *= grad_accum;
  const DeviceBytes bytes = device_bytes(c, m);
  const auto memory = [&](const char* what, int64_t b) {
    out.push_back({model::PlannedWork::Kind::Memory, what, 0, 0, 0, b, 0, 1});
  };
  memory("zero gradients", bytes.gradients);
  memory("gradient norm", bytes.gradients);
  memory("AdamW", bytes.optimizer / 2 * 7);  // optimizer = 2 moments; 4 arrays read, 3 written
  return out;
}

double step_flops(const model::LlamaConfig& c, const MemoryLayout& m, int grad_accum) {
  return model::total_flops(plan_step_work(c, m, grad_accum));
}

}  // namespace tpcli::train
