// tpcli::perf — the rates the cost model (perf/cost_model.h) prices a step's work at, measured on
// this machine with every device of the mesh at once: gemms at their shapes, nn/ calls at theirs,
// passes over memory, exponentials, the planned collectives run for real under their modelled
// links, and decode's matvec kernels over its weights as stored.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/comm_plan.h"
#include "model/weights.h"
#include "perf/cost_model.h"

namespace tpcli::perf {

// Measures what `work` needs and runs each distinct collective of `comm` on `mesh`'s groups, under
// its links (about
// `seconds` per rate, every device at once); with given_gflops > 0 the matmuls are not measured.
WorkRates measure_work_rates(const std::vector<model::PlannedWork>& work, const std::vector<model::PlannedCollective>& comm,
                             const PlanMesh& mesh, int blas_threads, double given_gflops = 0, double seconds = 0.02);

// Bytes/s of each Weights item of `work` (keyed by its tensor) through the kernel the model runs it
// with -- a frozen model's tensor::PackedMatrix::matvec in the tensor's stored format, a trainable
// f32 model's tensor::matvec -- at the item's shape, while every device streams copies of it,
// about `stream_bytes` a pass (the device's weights: from memory, as a token's come), `threads`
// each. The median pass of the slowest device.
std::map<std::string, double> measure_weight_rates(const std::vector<model::PlannedWork>& work,
                                                   const model::WeightSource& weights, int devices, int threads,
                                                   int64_t stream_bytes);

}  // namespace tpcli::perf
