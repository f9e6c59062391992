// perf/cost_model.h against numbers worked out here by formula: a small hand-made plan (one item
// of each kind, collectives on each role) priced at rates fixed by hand, so neither a measurement
// nor the model's own output is the reference.
#include <catch2/catch.hpp>

#include "perf/cost_model.h"

using tpcli::model::PlannedCollective;
using tpcli::model::PlannedWork;
using tpcli::model::Role;
using namespace tpcli::perf;

namespace {

using Kind = PlannedWork::Kind;

constexpr double GB = 1e9;
constexpr double LINK_GB_PER_S = 10, LINK_LATENCY_S = 5e-6;  // the model axis's link; data: unmodelled

// 2 x 2 devices; only the model axis has a modelled link (a ring).
PlanMesh two_by_two() {
  PlanMesh mesh;
  mesh.tensor = 2;
  mesh.data = 2;
  mesh.links["model"] = {LINK_GB_PER_S, LINK_LATENCY_S * 1e6, tpcli::dist::Topology::Ring};
  return mesh;
}

std::vector<PlannedWork> small_work() {
  std::vector<PlannedWork> work(6);
  work[0] = {.kind = Kind::Matmul, .what = "w1 forward", .m = 64, .n = 128, .k = 32, .calls = 3};
  work[1] = {.kind = Kind::Matmul, .what = "w1 weight gradient", .m = 32, .n = 32, .k = 32, .calls = 2,
             .backward = true, .gemm = PlannedWork::Gemm::TN};
  work[2] = {.kind = Kind::Memory, .what = "residual", .bytes = 100'000, .calls = 4};
  work[3] = {.kind = Kind::Exp, .what = "softmax", .elements = 1000, .calls = 5};
  work[4] = {.kind = Kind::Call, .what = "rmsnorm", .m = 8, .n = 16, .calls = 2, .op = PlannedWork::Op::RmsNormForward};
  work[5] = {.kind = Kind::Weights, .what = "wq", .bytes = 4096, .calls = 2, .tensor = "wq"};
  return work;
}

std::vector<PlannedCollective> small_comm() {
  using tpcli::dist::CollectiveKind;
  return {
      {Role::Tensor, "all_sum", CollectiveKind::AllSum, 1024, 4, "wo outputs"},
      {Role::Data, "all_sum", CollectiveKind::AllSum, 2048, 3, "gradient bucket"},
      {Role::World, "all_gather", CollectiveKind::AllGather, 512, 1, "logits"},
  };
}

// Fixed rates; the tensor all_sum's measured time is below its modelled one, the world
// all_gather's above, and the data buckets' not measured (priced by the memory rate).
WorkRates fixed_rates() {
  WorkRates r;
  r.gflops[{64, 128, 32, static_cast<int64_t>(PlannedWork::Gemm::NT)}] = 50;
  r.gflops[{32, 32, 32, static_cast<int64_t>(PlannedWork::Gemm::TN)}] = 25;
  r.bytes_per_s[128 << 10] = 20 * GB;  // 100'000 bytes: the 128 KB class
  r.bytes_per_s[16 << 10] = 4 * GB;    // a bucket's 2 x 8192 bytes: the 16 KB class
  r.exps_per_s = 1e9;
  r.call_s[{static_cast<int64_t>(PlannedWork::Op::RmsNormForward), 8, 16, 0, 0, 0}] = 1e-5;
  r.weight_bytes_per_s["wq"] = 8 * GB;
  r.collective_s["0 all_sum 1024"] = 5e-6;
  r.collective_s["2 all_gather 512"] = 1e-3;
  return r;
}

// Seconds of each item and collective, by the formulas of the model (distributed/links.h for a ring).
constexpr double MATMUL_FORWARD_S = 2.0 * 64 * 128 * 32 * 3 / (50 * GB);
constexpr double MATMUL_BACKWARD_S = 2.0 * 32 * 32 * 32 * 2 / (25 * GB);
constexpr double MEMORY_S = 4 * 100'000 / (20 * GB) + 2 * 4096 / (8 * GB);
constexpr double EXP_S = 5 * 1000 / 1e9;
constexpr double CALLS_S = 2 * 1e-5;
// all_sum of 4096 bytes on 2 devices: 2 (S-1)/S B / bw + 2 (S-1) latency.
constexpr double TENSOR_SUM_MODELLED_S = 2.0 * 1 / 2 * 4096 / (LINK_GB_PER_S * GB) + 2 * 1 * LINK_LATENCY_S;
// The world's group spans both axes: the model axis's link, 4 devices; (S-1)/S B / bw + (S-1) latency.
constexpr double WORLD_GATHER_MODELLED_S = 3.0 / 4 * 2048 / (LINK_GB_PER_S * GB) + 3 * LINK_LATENCY_S;
constexpr double BUCKET_S = 2.0 * 8192 / (4 * GB);  // the payload read and written once
constexpr double COLLECTIVES_S = 4 * TENSOR_SUM_MODELLED_S + 3 * BUCKET_S + 1 * 1e-3;

}  // namespace

TEST_CASE("perf: a plan's FLOPs and bytes, by formula") {
  double flops = 0;
  for (const auto& w : small_work()) flops += w.flops();
  CHECK(flops == 2.0 * 64 * 128 * 32 * 3 + 2.0 * 32 * 32 * 32 * 2);
  const auto comm = small_comm();
  CHECK(comm[0].bytes() == 4096);
  CHECK(comm[1].bytes() == 8192);
  CHECK(comm[2].bytes() == 2048);
}

TEST_CASE("perf: modelled collective times follow the ring formulas") {
  const PlanMesh mesh = two_by_two();
  const auto comm = small_comm();
  CHECK(modelled_seconds(comm[0], mesh) == Approx(TENSOR_SUM_MODELLED_S).epsilon(1e-12));
  CHECK(modelled_seconds(comm[1], mesh) == 0);  // the data axis has no link
  CHECK(modelled_seconds(comm[2], mesh) == Approx(WORLD_GATHER_MODELLED_S).epsilon(1e-12));
  CHECK(modelled_seconds(comm, mesh) ==
        Approx(4 * TENSOR_SUM_MODELLED_S + WORLD_GATHER_MODELLED_S).epsilon(1e-12));
}

TEST_CASE("perf: collective_seconds is the modelled time, but no less than the measured or memory-bound one") {
  const PlanMesh mesh = two_by_two();
  const auto comm = small_comm();
  const WorkRates rates = fixed_rates();
  CHECK(collective_seconds(comm[0], mesh, rates) == Approx(TENSOR_SUM_MODELLED_S).epsilon(1e-12));
  CHECK(collective_seconds(comm[1], mesh, rates) == Approx(BUCKET_S).epsilon(1e-12));
  CHECK(collective_seconds(comm[2], mesh, rates) == Approx(1e-3).epsilon(1e-12));
}

TEST_CASE("perf: predict prices each kind of work at the given rates") {
  const Prediction p = predict(small_work(), small_comm(), two_by_two(), fixed_rates());
  CHECK(p.matmul_s == Approx(MATMUL_FORWARD_S + MATMUL_BACKWARD_S).epsilon(1e-12));
  CHECK(p.memory_s == Approx(MEMORY_S).epsilon(1e-12));
  CHECK(p.exp_s == Approx(EXP_S).epsilon(1e-12));
  CHECK(p.calls_s == Approx(CALLS_S).epsilon(1e-12));
  CHECK(p.collectives_s == Approx(COLLECTIVES_S).epsilon(1e-12));
  CHECK(p.hidden_s == 0);
  CHECK(p.total() ==
        Approx(MATMUL_FORWARD_S + MATMUL_BACKWARD_S + MEMORY_S + EXP_S + CALLS_S + COLLECTIVES_S).epsilon(1e-12));
}

TEST_CASE("perf: predict hides all buckets but the last behind one micro-batch's backward") {
  const auto work = small_work();
  const auto comm = small_comm();
  const PlanMesh mesh = two_by_two();
  WorkRates rates = fixed_rates();
  // Grad accumulation 2: half the backward (one micro-batch's) is shorter than two buckets.
  const Prediction short_backward = predict(work, comm, mesh, rates, true, 2);
  REQUIRE(MATMUL_BACKWARD_S / 2 < 2 * BUCKET_S);
  CHECK(short_backward.hidden_s == Approx(MATMUL_BACKWARD_S / 2).epsilon(1e-12));
  // A slow backward: every bucket but the last is hidden.
  rates.gflops[{32, 32, 32, static_cast<int64_t>(PlannedWork::Gemm::TN)}] = 0.01;
  const Prediction long_backward = predict(work, comm, mesh, rates, true, 1);
  CHECK(long_backward.hidden_s == Approx(2 * BUCKET_S).epsilon(1e-12));
}

TEST_CASE("perf: a given matmul rate prices every matmul") {
  WorkRates rates = fixed_rates();
  rates.gflops.clear();
  rates.given_gflops = 100;
  const Prediction p = predict(small_work(), small_comm(), two_by_two(), rates);
  CHECK(p.matmul_s == Approx((2.0 * 64 * 128 * 32 * 3 + 2.0 * 32 * 32 * 32 * 2) / (100 * GB)).epsilon(1e-12));
}

TEST_CASE("perf: working-set classes are powers of two within [16 KB, 64 MB]") {
  CHECK(working_set_class(1) == 16 << 10);
  CHECK(working_set_class(16 << 10) == 16 << 10);
  CHECK(working_set_class((16 << 10) + 1) == 32 << 10);
  CHECK(working_set_class(100'000) == 128 << 10);
  CHECK(working_set_class(int64_t{1} << 40) == 64 << 20);
}
