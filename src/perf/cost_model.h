// tpcli::perf — the cost model behind the predictions `tpcli inspect --mesh ...`, `bench train` and
// `bench decode` print: a step's (or token's) work items (model/comm_plan.h PlannedWork) priced at
// given rates, plus its collectives at their modelled times (distributed/links.h). The rates come in
// as a value (perf/measure_rates.h measures them), so the model is testable on rates fixed by hand.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "distributed/links.h"
#include "model/comm_plan.h"

namespace tpcli::perf {

struct PlanMesh {
  std::string tensor_axis = "model", data_axis = "data";
  int tensor = 1, data = 1;
  dist::LinkSpec links;  // empty: collectives unmodelled
  int devices() const { return tensor * data; }
};

// The axes of the group a collective of `role` runs on (those of size > 1: a lone axis does not
// carry the world's data).
std::vector<std::string> group_axes(model::Role role, const PlanMesh& mesh);

// The modelled seconds of one call of `p` (its group's link; 0 when that axis is not modelled).
double modelled_seconds(const model::PlannedCollective& p, const PlanMesh& mesh);
double modelled_seconds(const std::vector<model::PlannedCollective>& plan, const PlanMesh& mesh);  // every call

// The rates a prediction prices a step's work at (model/comm_plan.h PlannedWork), measured in the
// same run with every device of the mesh at once, each device on its BLIS threads: GFLOP/s of a
// gemm of each shape and layout the step uses, seconds of each Call (attention, rmsnorm, RoPE) run at its shape, bytes/s of a read-2-write-1 pass over a working set of each
// size class (a power of two: an item that stays in cache runs at cache speed), exponentials/s
// of tensor/vec_math.h's exp_sum. The slowest device's rate counts (devices wait for each other).
struct WorkRates {
  double given_gflops = 0;                         // > 0: every matmul at this rate (--matmul-gflops)
  std::map<std::array<int64_t, 4>, double> gflops;  // by gemm {m, n, k, layout (PlannedWork::Gemm)}
  std::map<int64_t, double> bytes_per_s;            // by working-set class (working_set_class)
  double exps_per_s = 0;
  std::map<std::array<int64_t, 6>, double> call_s;  // seconds of one Call, by call_key
  std::map<std::string, double> weight_bytes_per_s;  // decode's matvec kernels, by PlannedWork::tensor (measure_weight_rates)
  // Seconds of one call of each planned collective run for real on the mesh under its modelled
  // links (the backend's copies, sums, synchronisation and its wait for the modelled end), by
  // collective_key.
  std::map<std::string, double> collective_s;
  double seconds(const model::PlannedWork& w) const;  // of all of w's calls
  double memory_rate(int64_t bytes) const;             // bytes/s for a pass of `bytes`
};
std::array<int64_t, 4> gemm_key(const model::PlannedWork& w);  // {m, n, k, layout}
std::array<int64_t, 6> call_key(const model::PlannedWork& w);  // {op, B, T, heads, kv_heads, HS}
int64_t working_set_class(int64_t bytes);  // the power of two >= bytes, within [16 KB, 64 MB]
std::string collective_key(const model::PlannedCollective& p);  // "tensor all_sum 4096"

// One call of `p` on the threads backend: its modelled time on its axis's link (distributed/links.h), but
// no less than the same call measured on the mesh (WorkRates::collective_s; when not measured, the
// payload read and written once, 2 x bytes, at the measured memory rate for that size).
double collective_seconds(const model::PlannedCollective& p, const PlanMesh& mesh, const WorkRates& rates);

struct Prediction {
  double matmul_s = 0, calls_s = 0, memory_s = 0, exp_s = 0;  // the work items (calls: attention, norms, RoPE)
  double collectives_s = 0;                      // every call of every planned collective
  double hidden_s = 0;  // data-parallel buckets started during the last backward, overlapped with it
  double total() const { return matmul_s + calls_s + memory_s + exp_s + collectives_s - hidden_s; }
};
// A step (or token): work at `rates`, plus collectives; with overlap_buckets every gradient bucket
// but the last hides behind the last micro-batch's backward (train/loop.h), as far as it lasts.
Prediction predict(const std::vector<model::PlannedWork>& work, const std::vector<model::PlannedCollective>& comm,
                   const PlanMesh& mesh, const WorkRates& rates, bool overlap_buckets = false, int grad_accum = 1);

}  // namespace tpcli::perf
