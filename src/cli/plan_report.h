// tpcli::cli — sharding plans: what `tpcli inspect --mesh ...` prints (every tensor's sharding in
// JAX notation, per-device bytes, the collectives per step or token with their modelled times and
// the compute time), and the predictions `tpcli bench train` / `bench decode` print beside their
// measured times. The collectives come from model/comm_plan.h and train/step_plan.h (tested
// against real runs); times from dist/links.h and a matmul rate measured here.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "dist/links.h"
#include "model/comm_plan.h"
#include "model/llama_config.h"

namespace tpcli::cli {

struct PlanMesh {
  std::string tensor_axis = "model", data_axis = "data";
  int tensor = 1, data = 1;
  dist::LinkSpec links;  // empty: collectives unmodelled
  int devices() const { return tensor * data; }
};

// "f32[32000@model, 768]": dtype, then the full shape with the tensor-split dim marked.
std::string jax_sharding(const model::ParamSpec& spec, const std::string& dtype, const std::string& tensor_axis,
                         int tensor_devices, const std::string& expert_axis = "");
// Every parameter's line; dtype_of names each tensor's stored type.
void print_sharding(const model::LlamaConfig& c, const PlanMesh& mesh,
                    const std::function<std::string(const model::ParamSpec&)>& dtype_of, std::ostream& out);

// The modelled seconds of one call of `p` (its group's link; 0 when that axis is not modelled).
double modelled_seconds(const model::PlannedCollective& p, const PlanMesh& mesh);
double modelled_seconds(const std::vector<model::PlannedCollective>& plan, const PlanMesh& mesh);  // every call
// One line per planned collective (axis, kind, what, bytes, calls, modelled time), then the total.
void print_collectives(const std::vector<model::PlannedCollective>& plan, const PlanMesh& mesh, std::ostream& out);

// GFLOP/s one device reaches on products of the given shape while `devices` devices run at once
// (each on its share of the cores), measured for about `seconds`: [m, k] @ [k, n] (m = 1: the
// decode matvec kernel).
double measure_matmul_gflops(int devices, int64_t m, int64_t n, int64_t k, double seconds = 0.1);

// "compute 12.3 ms (4.1 GFLOP at 33.1 GFLOP/s measured), collectives 1.2 ms modelled: predicted 13.5 ms"
std::string describe_prediction(double flops, double gflops, bool rate_measured, double comm_s, bool modelled);

}  // namespace tpcli::cli
