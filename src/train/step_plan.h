// tpcli::train — the collectives of one optimizer step on one device (the model's, per
// micro-batch, from model/comm_plan.h, times K; then the data-parallel optimizer's and the loop's),
// and its work (the model's per micro-batch, then the optimizer's). What `tpcli inspect` prints for a run config and `tpcli bench train`
// predicts from; tests compare it with what a real step records (tests/train/test_step_plan.cpp).
//
// Per step, besides the model's: all_max 1 over the world (the stop flag, train/loop.h); per
// gradient bucket (train/param_table.h) all_sum over the data axis, or with shard_optimizer a
// reduce_scatter and, after AdamW, an all_gather of the values; all_sum 1 over the data axis (the
// loss); all_sum 1 over the world (the global norm).
#pragma once

#include <vector>

#include "model/comm_plan.h"
#include "train/memory.h"

namespace tpcli::train {

// Device 0's collectives for one step of K = grad_accum micro-batches under `layout`. Sequence
// parallelism (layout.sequence_parallel, nn/sequence_parallel.h) is not planned yet: throws
// std::invalid_argument saying so.
std::vector<model::PlannedCollective> plan_step_collectives(const model::LlamaConfig& config, const MemoryLayout& layout,
                                                            int grad_accum);
// Device 0's work of one step: the model's (model/comm_plan.h plan_train_work) for each of the K
// micro-batches, then the gradients zeroed (once per step), their global norm read, and AdamW
// (reads value, gradient and both moments, writes value and moments) over the elements whose
// moments this device holds. Not counted: the clip's rescale when the norm exceeds grad_clip.
std::vector<model::PlannedWork> plan_step_work(const model::LlamaConfig& config, const MemoryLayout& layout,
                                               int grad_accum);
// Device 0's matmul FLOPs of one step (the gemms of plan_step_work).
double step_flops(const model::LlamaConfig& config, const MemoryLayout& layout, int grad_accum);

}  // namespace tpcli::train
