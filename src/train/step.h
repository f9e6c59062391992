// tpcli::train — the gradient half of a training step on one device.
//
// Dimension legend: R = rows of one micro-batch on this device, K micro-batches (grad_accum),
// T tokens per row.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "train/data.h"
#include "train/param_table.h"

namespace tpcli::model {
class TrainableLlama;
}

namespace tpcli::train {

// Zeroes the gradients, then runs forward_backward on K micro-batches of step `step`: micro-batch
// k takes rows [rows.begin + k*R, rows.begin + (k+1)*R) of the sampler's batch (R = (rows.end -
// rows.begin) / K), so the K micro-batches of every data rank are exactly the rows of the K-times
// larger batch. T = batches.step_len(step). Gradients are summed (not averaged) over k. Returns
// this device's mean loss over the K micro-batches. inputs, targets: scratch, (R*T,).
// When the batches count a step's targets (batches.counted_targets: supervised fine-tuning), each
// micro-batch's loss is its sum over counted targets divided by G / (D*K), G the step's counted
// targets over all D data ranks (D = batches.batch_size() / (rows.end - rows.begin)): after the
// data-parallel mean of the K-summed gradients (a 1/(D*K) scale) every device holds the gradient
// of the mean over the G counted targets of the whole global batch, and the pmean of the returned
// loss is that mean (transformers >= 4.46, TRL), not a mean of per-micro-batch means.
// During the last micro-batch's backward, last_ready (when set) hears which gradients are final
// (model::TrainableLlama::set_gradients_ready), so their data-parallel collectives can start.
double accumulate_gradients(model::TrainableLlama& llama, const StepBatches& batches, int64_t step, RowRange rows,
                            int micro_batches, std::vector<int>& inputs, std::vector<int>& targets,
                            const std::function<void(int64_t end)>& last_ready = {});

// The reference data-parallel gradient, one collective per parameter (tests compare the bucketed
// DataParallelOptimizer against it): zero_grad, forward_backward on these rows, then every
// gradient averaged so that every device holds the gradient of the mean loss over the global batch
// (pmean over data; expert weights scaled by 1/G instead, nn/moe.h). Returns the mean loss over
// the global batch (pmean of the local mean losses).
double data_parallel_gradients(model::TrainableLlama& llama, const ParallelAxes& axes, std::span<const int> inputs,
                               std::span<const int> targets, int rows, int seq_len);

}  // namespace tpcli::train
