// tpcli::cli — sharding plans: what `tpcli inspect --mesh ...` prints (every tensor's sharding in
// JAX notation, per-device bytes, the collectives per step or token with their modelled times and
// the compute time), and the predictions `tpcli bench train` / `bench decode` print beside their
// measured times. The collectives come from model/comm_plan.h and train/step_plan.h (tested
// against real runs); times and predictions from perf/ (cost_model.h, measure_rates.h).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "model/comm_plan.h"
#include "model/llama_config.h"
#include "perf/cost_model.h"

namespace tpcli::cli {

// "f32[32000@model, 768]": dtype, then the full shape with the tensor-split dim marked.
std::string jax_sharding(const model::ParamSpec& spec, const std::string& dtype, const std::string& tensor_axis,
                         int tensor_devices, const std::string& expert_axis = "");
// Every parameter's line; dtype_of names each tensor's stored type. A MoE's experts are dealt over
// expert_axis ("": not dealt, every device holds a slice of every expert).
void print_sharding(const model::LlamaConfig& c, const perf::PlanMesh& mesh, const std::string& expert_axis,
                    const std::function<std::string(const model::ParamSpec&)>& dtype_of, std::ostream& out);

// One line per planned collective (axis, kind, what, bytes, calls, modelled time), then the total.
void print_collectives(const std::vector<model::PlannedCollective>& plan, const perf::PlanMesh& mesh, std::ostream& out);

// One line per kind of work (items of equal `what` summed): time, GFLOP or MB, the rate.
void print_work(const std::vector<model::PlannedWork>& work, const perf::WorkRates& rates, std::ostream& out);
// "matmul 12.3 ms + timed calls 4.0 ms + memory 2.1 ms + exp 0.3 ms + collectives 1.2 ms - overlapped 0.4 ms = 19.5 ms"
std::string describe(const perf::Prediction& p);

}  // namespace tpcli::cli
