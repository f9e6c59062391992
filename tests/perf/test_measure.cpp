// perf/measure_rates.h, perf/read_bandwidth.h and perf/gemm_rate.h: what they measure cannot be checked against a
// number (it is the machine's), but they must measure every rate a plan needs, each positive, so
// predict() prices the plan; and the summaries must be what they say.
#include <catch2/catch.hpp>

#include "model/shard_plan.h"
#include "perf/gemm_rate.h"
#include "perf/measure_rates.h"
#include "perf/read_bandwidth.h"
#include "perf/stats.h"

using namespace tpcli;

TEST_CASE("perf: median of odd and even counts") {
  CHECK(perf::median({3, 1, 2}) == 2);
  CHECK(perf::median({4, 1, 3, 2}) == 2.5);
  CHECK(perf::median({7}) == 7);
}

TEST_CASE("perf: measure_read_bandwidth gives a positive median no better than the best") {
  const perf::Bandwidth b = perf::measure_read_bandwidth(1, size_t{8} << 20);
  CHECK(b.median > 0);
  CHECK(b.best >= b.median);
}

TEST_CASE("perf: measure_work_rates measures every rate a training step's plan needs") {
  const model::LlamaConfig c{.dim = 32, .hidden_dim = 64, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2,
                             .vocab_size = 50, .seq_len = 16};
  const perf::PlanMesh mesh{.tensor = 2};
  const model::ShardPlan plan = model::plan_shards(c, 2, 0);
  const auto work = model::plan_train_work(c, plan, 2, 16, false);
  const auto comm = model::plan_train_collectives(c, plan, 2, 16, false);
  const perf::WorkRates rates = perf::measure_work_rates(work, comm, mesh, 1, 0, 0.001);
  for (const auto& [key, gflops] : rates.gflops) CHECK(gflops > 0);
  for (const auto& [size, bytes_per_s] : rates.bytes_per_s) CHECK(bytes_per_s > 0);
  CHECK(rates.exps_per_s > 0);
  CHECK(rates.collective_s.size() > 0);
  const perf::Prediction p = perf::predict(work, comm, mesh, rates);  // throws if a rate is missing
  CHECK(p.matmul_s > 0);
  CHECK(p.calls_s > 0);
  CHECK(p.memory_s > 0);
  CHECK(p.collectives_s > 0);
}

TEST_CASE("perf: the gemm rates are positive") {
  CHECK(perf::sgemm_peak_gflops() > 0);
  CHECK(perf::measure_gemm_gflops(16, 32, 64, 1, 2) > 0);
}
