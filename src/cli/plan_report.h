// tpcli::cli — sharding plans: what `tpcli inspect --mesh ...` prints (every tensor's sharding in
// JAX notation, per-device bytes, the collectives per step or token with their modelled times and
// the compute time), and the predictions `tpcli bench train` / `bench decode` print beside their
// measured times. The collectives come from model/comm_plan.h and train/step_plan.h (tested
// against real runs); times from distributed/links.h and a matmul rate measured here.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "distributed/links.h"
#include "model/comm_plan.h"
#include "model/llama_config.h"
#include "model/weights.h"

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
std::array<int64_t, 6> call_key(const model::PlannedWork& w);  // {op, B, T, heads, kv_heads, HS}
int64_t working_set_class(int64_t bytes);  // the power of two >= bytes, within [16 KB, 64 MB]
std::string collective_key(const model::PlannedCollective& p);  // "tensor all_sum 4096"
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
// One line per kind of work (items of equal `what` summed): time, GFLOP or MB, the rate.
void print_work(const std::vector<model::PlannedWork>& work, const WorkRates& rates, std::ostream& out);
// "matmul 12.3 ms + timed calls 4.0 ms + memory 2.1 ms + exp 0.3 ms + collectives 1.2 ms - overlapped 0.4 ms = 19.5 ms"
std::string describe(const Prediction& p);

}  // namespace tpcli::cli
