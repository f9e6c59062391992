// SPMD runtime: devices, groups per axis, seeding, BLIS threads, and failures that end the run
// promptly (never a hang) with the failing device's rank and message.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "distributed/collective_checks.h"
#include "distributed/expect_failure.h"
#include "distributed/runtime.h"
#include "distributed/trace.h"
#include "tensor/blas.h"

using namespace tpcli::dist;
using namespace tpcli::testing;
using Clock = std::chrono::steady_clock;


TEST_CASE("runtime: devices know their rank, coordinates and axis groups") {
  const Mesh mesh({{"data", 2}, {"model", 4}});
  std::vector<std::vector<int>> seen(8);  // [rank] = {data coord, model coord, model rank, model size, data rank,
                                          //           data size, world rank, world size, both size}
  run_on_mesh(mesh, [&](Device& dev) {
    seen[static_cast<size_t>(dev.rank())] = {dev.coord("data"),        dev.coord("model"),      dev.axis("model").rank(),
                                             dev.axis("model").size(), dev.axis("data").rank(), dev.axis("data").size(),
                                             dev.world().rank(),       dev.world().size(),      dev.axes({"data", "model"}).size(),
                                             dev.axis("expert").size(), dev.coord("expert")};
  });
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r);
    const std::vector<int> want{r / 4, r % 4, r % 4, 4, r / 4, 2, r, 8, 8, 1, 0};
    CHECK(seen[static_cast<size_t>(r)] == want);
  }
}

TEST_CASE("runtime: collectives along each axis of a 2x4 mesh reach exactly that sub-group") {
  const Mesh mesh({{"data", 2}, {"model", 4}});
  std::vector<std::vector<float>> got(8);  // [rank] = {sum over model, sum over data, sum over both}
  run_on_mesh(mesh, [&](Device& dev) {
    float r = static_cast<float>(dev.rank());
    std::vector<float> a{r}, b{r}, c{r};
    dev.axis("model").all_sum(a);
    dev.axis("data").all_sum(b);
    dev.axes({"data", "model"}).all_sum(c);
    got[static_cast<size_t>(dev.rank())] = {a[0], b[0], c[0]};
  });
  for (int r = 0; r < 8; ++r) {
    const float model_sum = r < 4 ? 0 + 1 + 2 + 3 : 4 + 5 + 6 + 7;
    const float data_sum = static_cast<float>(r % 4 + r % 4 + 4);
    const std::vector<float> want{model_sum, data_sum, 28.0f};
    CHECK(got[static_cast<size_t>(r)] == want);
  }
}

TEST_CASE("runtime: device RNGs differ per rank and repeat per seed") {
  auto draw = [](uint64_t seed) {
    std::vector<uint32_t> first(4);
    RunOptions opt;
    opt.seed = seed;
    run_on_mesh(Mesh::line(4), [&](Device& dev) { first[static_cast<size_t>(dev.rank())] = dev.rng()(); }, opt);
    return first;
  };
  const auto a = draw(1), b = draw(1), c = draw(2);
  CHECK(a == b);
  CHECK(a != c);
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) CHECK(a[static_cast<size_t>(i)] != a[static_cast<size_t>(j)]);
}

TEST_CASE("runtime: BLIS threads per device default to cores / devices, at least 1") {
  const int cores = tpcli::tensor::available_cores();
  for (int devices : {1, 2, 8}) {
    std::vector<int> threads(static_cast<size_t>(devices));
    run_on_mesh(Mesh::line(devices),
                [&](Device& dev) { threads[static_cast<size_t>(dev.rank())] = tpcli::tensor::blas_threads(); });
    for (int t : threads) CHECK(t == std::max(1, cores / devices));
  }
  std::atomic<int> forced{0};
  RunOptions opt;
  opt.blas_threads = 3;
  run_on_mesh(Mesh::line(2), [&](Device&) { forced += tpcli::tensor::blas_threads(); }, opt);
  CHECK(forced == 6);
}

TEST_CASE("runtime: a device that throws while the others wait in all_sum ends the run promptly") {
  for (int devices : {2, 8}) {
    INFO(devices << " devices");
    expect_failure(
        Mesh::line(devices),
        [](Device& dev) {
          std::vector<float> x(1000, 1.0f);
          if (dev.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are blocked by now
            throw std::runtime_error("boom in layer 3");
          }
          dev.world().all_sum(x);
          dev.world().all_sum(x);
        },
        1, "boom in layer 3");
  }
}

TEST_CASE("runtime: failures in large collectives and sub-groups also wake everyone") {
  const Mesh mesh({{"data", 2}, {"model", 4}});
  expect_failure(
      mesh,
      [](Device& dev) {
        std::vector<float> x(1 << 16, 1.0f);  // the multi-barrier path
        if (dev.rank() == 6) throw std::runtime_error("out of memory on 6");
        for (int i = 0; i < 3; ++i) {
          dev.axis("model").all_sum(x);
          dev.axis("data").all_gather(std::span<const float>(x).first(8), std::span<float>(x).subspan(100, 16));
          dev.world().barrier();
        }
      },
      6, "out of memory on 6");
}

TEST_CASE("runtime: mismatched collectives fail with a clear error instead of hanging") {
  // Lengths differ between members.
  expect_failure(
      Mesh::line(2),
      [](Device& dev) {
        std::vector<float> x(static_cast<size_t>(10 + dev.rank()), 1.0f);
        dev.world().all_sum(x);
      },
      -1, "lengths differ: 11 vs 10 floats");
  // Different collectives in the same slot.
  expect_failure(
      Mesh::line(2),
      [](Device& dev) {
        std::vector<float> x(4, 1.0f);
        if (dev.rank() == 0) dev.world().all_sum(x);
        else dev.world().broadcast(x, 0);
      },
      -1, "member 1 called broadcast while member 0 called all_sum");
  // A device returns while another still waits for it.
  expect_failure(
      Mesh::line(3),
      [](Device& dev) {
        std::vector<float> x(4, 1.0f);
        dev.world().all_sum(x);
        if (dev.rank() != 2) dev.world().all_sum(x);
      },
      -1, "returned while device");
}

TEST_CASE("runtime: the group counts bytes into the device's stats") {
  std::vector<CommStats> stats(4);
  run_on_mesh(Mesh::line(4), [&](Device& dev) {
    std::vector<float> x(1000, 1.0f), gathered(4000);
    dev.world().all_sum(x);  // 2 (S-1)/S of 4000 bytes each way
    dev.world().all_gather(std::span<const float>(x), gathered);  // 4000 to each of 3 others; 12000 in
    dev.world().barrier();
    stats[static_cast<size_t>(dev.rank())] = dev.stats();
  });
  for (const CommStats& s : stats) {
    CHECK(s.calls == 3);
    CHECK(s.bytes_sent == 6000 + 12000);
    CHECK(s.bytes_received == 6000 + 12000);
  }
}

TEST_CASE("runtime: a trace records compute and collective spans per device as Chrome JSON") {
  Trace trace;
  RunOptions opt;
  opt.trace = &trace;
  run_on_mesh(Mesh::line(2), [&](Device& dev) {
    {
      TraceSpan span(dev.trace(), dev.rank(), "matmul");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<float> x(16, 1.0f);
    dev.world().all_sum(x);
  }, opt);
  const auto events = trace.events();
  int compute = 0, collective = 0;
  for (const auto& e : events) {
    CHECK(e.duration_ns >= 0);
    if (e.name == "matmul" && e.category == "compute") {
      ++compute;
      CHECK(e.duration_ns >= 1000000);
    }
    if (e.name == "all_sum" && e.category == "collective") ++collective;
  }
  CHECK(compute == 2);
  CHECK(collective == 2);
  const std::string json = trace.to_json();
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("\"name\":\"all_sum\"") != std::string::npos);
  CHECK(json.find("\"tid\":1") != std::string::npos);
}

TEST_CASE("runtime: a device failing at a random point of a random collective sequence never hangs the run") {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 12; ++trial) {
    const int devices = trial % 2 == 0 ? 3 : 8;
    const int failing = static_cast<int>(rng() % static_cast<uint32_t>(devices));
    const int fail_at = static_cast<int>(rng() % 60);
    const uint64_t seed = rng();
    INFO("trial " << trial << ": device " << failing << " of " << devices << " fails after " << fail_at << " ops");
    expect_failure(
        Mesh::line(devices),
        [&](Device& dev) {
          if (dev.rank() == failing) {
            tpcli::testing::check_random_sequence(dev.world(), fail_at, 20000, seed);
            throw std::runtime_error("injected failure");
          }
          tpcli::testing::check_random_sequence(dev.world(), 60, 20000, seed);
        },
        failing, "injected failure");
  }
}
