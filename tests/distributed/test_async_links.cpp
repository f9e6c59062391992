// Started (asynchronous) collectives against the blocking forms and serial references, their
// failure handling, and the modelled links (formulas, booking, the lower bound, the trace, the
// bounds on their values, and how a stop request or a failure ends a long hold).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "distributed/collective_checks.h"
#include "distributed/collective_watch.h"
#include "distributed/expect_failure.h"
#include "distributed/links.h"
#include "distributed/runtime.h"
#include "distributed/threads/thread_backend.h"
#include "distributed/trace.h"

using namespace tpcli::dist;
using namespace tpcli::testing;
using Clock = std::chrono::steady_clock;

TEST_CASE("started collectives equal the blocking forms and the serial reference, sizes 1..4") {
  for (int S : {1, 2, 3, 4}) {
    for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{1000}, int64_t{100000}}) {  // staged and direct paths
      INFO("group size " << S << ", length " << n);
      CHECK_NOTHROW(run_on_mesh(Mesh::line(S), [&](Device& dev) { check_started_collectives(dev.world(), n, 10 * S + n); }));
    }
  }
}

TEST_CASE("started collectives along each axis of a 2x2 mesh, with the axes' links modelled") {
  RunOptions options;
  options.links = {{"data", {50, 2, Topology::Switch}}, {"model", {200, 1, Topology::Ring}}};
  for (const std::vector<std::string>& axes : std::vector<std::vector<std::string>>{{"data"}, {"model"}, {"data", "model"}}) {
    INFO(axes.size() << " axes, first " << axes[0]);
    CHECK_NOTHROW(run_on_mesh(Mesh({{"data", 2}, {"model", 2}}), [&](Device& dev) {
      const std::vector<int> members = dev.mesh().group_members(dev.rank(), axes);
      check_started_collectives(dev.axes(axes), 5000, 77 + 100 * static_cast<uint64_t>(members[0]));
    }, options));
  }
}

TEST_CASE("a device failing wakes every member waiting on a started collective with its error") {
  expect_failure(Mesh::line(3), [](Device& dev) {
    std::vector<float> in(1000, 1.0f), out(1000);
    if (dev.rank() == 2) throw std::runtime_error("boom before starting");
    Pending p = dev.world().start_ppermute(in, out, {{0, 1}, {1, 2}, {2, 0}});
    p.wait();
  }, 2, "boom before starting");
}

TEST_CASE("a device failing wakes every member waiting on a started all_to_all or broadcast with its error") {
  expect_failure(Mesh::line(3), [](Device& dev) {
    std::vector<float> in(3000, 1.0f), out(3000);
    if (dev.rank() == 1) throw std::runtime_error("boom before the all_to_all");
    Pending p = dev.world().start_all_to_all(in, out);
    p.wait();
  }, 1, "boom before the all_to_all");
  expect_failure(Mesh::line(3), [](Device& dev) {
    std::vector<float> x(3000, 1.0f);
    if (dev.rank() == 0) throw std::runtime_error("boom at the root");
    Pending p = dev.world().start_broadcast(x, 0);
    p.wait();
  }, 0, "boom at the root");
}

TEST_CASE("started all_to_all and broadcast check their arguments like the blocking forms") {
  run_on_mesh(Mesh::line(2), [](Device& dev) {
    std::vector<float> in(5), out(5), x(4);
    CHECK_THROWS_WITH(dev.world().start_all_to_all(in, out), Catch::Contains("do not split into 2 equal chunks"));
    CHECK_THROWS_WITH(dev.world().start_broadcast(x, 2), Catch::Contains("root 2 outside group of 2"));
  });
}

TEST_CASE("a device failing with a started collective unwaited, while the others block elsewhere, ends the run") {
  // Device 0 starts an all_gather and throws; devices 1, 2 are in a blocking all_sum that needs
  // device 0: the unwaited handle must fail the run rather than wait for them forever.
  expect_failure(Mesh::line(3), [](Device& dev) {
    std::vector<float> x(100000, 1.0f), gathered(300000);
    if (dev.rank() == 0) {
      Pending p = dev.world().start_all_gather(x, gathered);
      throw std::runtime_error("boom with a transfer in flight");
    }
    dev.world().all_sum(x);
  }, 0, "boom with a transfer in flight");
}

TEST_CASE("a device returning without starting the collective its peers started fails their wait") {
  expect_failure(Mesh::line(2), [](Device& dev) {
    std::vector<float> x(10, 1.0f);
    if (dev.rank() == 1) return;
    Pending p = dev.world().start_all_sum(x);
    p.wait();
  }, 0, "device 1 returned");
}

TEST_CASE("links: modelled times follow the ring and switch formulas") {
  const AxisLink ring{100, 2, Topology::Ring}, sw{100, 2, Topology::Switch};
  const uint64_t B = 8'000'000;  // bytes
  const double bw = 100e9, L = 2e-6;
  CHECK(modelled_seconds(ring, 4, CollectiveKind::AllSum, B) == Approx(2.0 * 3 / 4 * B / bw + 6 * L));
  CHECK(modelled_seconds(ring, 4, CollectiveKind::AllGather, B) == Approx(3.0 / 4 * B / bw + 3 * L));
  CHECK(modelled_seconds(ring, 4, CollectiveKind::ReduceScatter, B) == Approx(3.0 / 4 * B / bw + 3 * L));
  CHECK(modelled_seconds(ring, 4, CollectiveKind::Ppermute, B, 2) == Approx(B / bw + 2 * L));
  CHECK(modelled_seconds(ring, 4, CollectiveKind::AllToAll, B) == Approx(1.5 * B / bw + 3 * L));
  CHECK(modelled_seconds(sw, 4, CollectiveKind::AllSum, B) == Approx(2.0 * 3 / 4 * B / bw + 2 * L));
  CHECK(modelled_seconds(sw, 4, CollectiveKind::AllToAll, B) == Approx(3.0 / 4 * B / bw + L));
  CHECK(modelled_seconds(sw, 4, CollectiveKind::Ppermute, B, 2) == Approx(B / bw + L));
  CHECK(modelled_seconds(ring, 1, CollectiveKind::AllSum, B) == 0.0);
  CHECK(perm_shape({{0, 1}, {1, 2}, {2, 3}, {3, 0}}, 4).direction == RingDirection::Forward);
  CHECK(perm_shape({{0, 3}, {1, 0}, {2, 1}, {3, 2}}, 4).direction == RingDirection::Backward);
  CHECK(perm_shape({{0, 2}, {2, 0}}, 4).hops == 2);
  CHECK(perm_shape({{0, 1}, {1, 0}}, 2).direction == RingDirection::Both);
}

TEST_CASE("links: opposite ring directions carry transfers at once, one direction one at a time") {
  LinkClock clock({1, 0, Topology::Ring}, 4);  // 1 GB/s: 1e6 bytes take 1 ms
  const auto t0 = Clock::now();
  const auto ms = [&](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - t0).count(); };
  const PermShape fwd{1, RingDirection::Forward}, bwd{1, RingDirection::Backward};
  CHECK(ms(clock.book(CollectiveKind::Ppermute, 1'000'000, fwd, t0)) == Approx(1.0));
  CHECK(ms(clock.book(CollectiveKind::Ppermute, 1'000'000, bwd, t0)) == Approx(1.0));  // other direction: parallel
  CHECK(ms(clock.book(CollectiveKind::Ppermute, 1'000'000, fwd, t0)) == Approx(2.0));  // same direction: queued
  CHECK(ms(clock.book(CollectiveKind::AllSum, 1'000'000, {}, t0)) == Approx(2.0 + 1.5));  // needs both: after both
}

TEST_CASE("links: --link values parse, and bad ones are one-line errors naming the value") {
  const auto [axis, link] = parse_link_flag("data=12.5,30,switch");
  CHECK(axis == "data");
  CHECK(link.gb_per_s == 12.5);
  CHECK(link.latency_us == 30);
  CHECK(link.topology == Topology::Switch);
  CHECK(parse_link_flag("model=100,1").second.topology == Topology::Ring);
  for (const char* bad : {"model", "=1,2", "model=1", "model=x,1", "model=0,1", "model=1,-1", "model=1,1,torus", "model=1,2,3,4"}) {
    INFO(bad);
    try {
      parse_link_flag(bad);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(std::string("--link ") + bad) == 0);
    }
  }
}

TEST_CASE("links: a collective completes no earlier than its modelled time, and the trace shows that time") {
  Trace trace;
  RunOptions options;
  options.trace = &trace;
  options.links = {{"model", {1, 50, Topology::Ring}}};  // 1 GB/s, 50 us
  const int64_t n = 250'000;                               // 1 MB: all_sum modelled 1 ms + 100 us
  const double modelled = modelled_seconds(options.links["model"], 2, CollectiveKind::AllSum, n * 4);
  std::vector<double> took(2);
  run_on_mesh(Mesh::line(2), [&](Device& dev) {
    std::vector<float> x(n, 1.0f);
    dev.axis("model").barrier();
    const auto t0 = Clock::now();
    dev.axis("model").all_sum(x);
    took[static_cast<size_t>(dev.rank())] = seconds_since(t0);
    CHECK(x[0] == 2.0f);
  }, options);
  for (double t : took) CHECK(t >= modelled);
  int sums = 0;
  for (const Trace::Event& e : trace.events()) {
    if (e.name != "all_sum") continue;
    ++sums;
    CHECK(e.modelled_ns == Approx(modelled * 1e9).epsilon(1e-3));
    CHECK(e.duration_ns >= e.modelled_ns);
  }
  CHECK(sums == 2);
  CHECK(trace.to_json().find("\"modelled_us\":1100.000") != std::string::npos);
}

TEST_CASE("links: the link model wraps a backend's communicator by hand, outside run_on_mesh, blocking and started") {
  const AxisLink link{1, 50, Topology::Ring};  // 1 GB/s, 50 us
  const int64_t n = 250'000;                  // 1 MB: all_sum modelled 1 ms + 100 us
  const double modelled = modelled_seconds(link, 2, CollectiveKind::AllSum, n * 4);
  ThreadBackend backend(2);
  Trace trace;
  std::vector<CommStats> stats(2);
  std::vector<double> took(2), started_took(2);
  std::vector<float> sums(4);
  std::vector<std::thread> devices;
  for (int r = 0; r < 2; ++r)
    devices.emplace_back([&, r] {
      auto comm = std::make_shared<LinkModelledCommunicator>(backend.communicator(r, {0, 1}), link, nullptr);
      Group group(comm, &stats[static_cast<size_t>(r)], &trace, r);
      std::vector<float> x(n, static_cast<float>(r + 1)), y(n, static_cast<float>(10 * (r + 1)));
      group.barrier();
      auto t0 = Clock::now();
      group.all_sum(x);
      took[static_cast<size_t>(r)] = seconds_since(t0);
      t0 = Clock::now();
      Pending p = group.start_all_sum(y);
      p.wait();
      started_took[static_cast<size_t>(r)] = seconds_since(t0);
      sums[static_cast<size_t>(2 * r)] = x[0];
      sums[static_cast<size_t>(2 * r + 1)] = y[n - 1];
    });
  for (std::thread& t : devices) t.join();
  CHECK(sums == std::vector<float>{3, 30, 3, 30});  // 1 + 2, 10 + 20
  for (double t : took) CHECK(t >= modelled);
  for (double t : started_took) CHECK(t >= modelled);
  // The wrapper counts nothing of its own: each all_sum moves 2(S-1)/S of 1 MB each way.
  for (const CommStats& s : stats) {
    CHECK(s.calls == 3);
    CHECK(s.bytes_sent == 2 * 1'000'000);
    CHECK(s.bytes_received == 2 * 1'000'000);
  }
  int blocking_sums = 0;
  for (const Trace::Event& e : trace.events())
    if (e.name == "all_sum" && e.track < Trace::ASYNC_TRACK_BASE) {
      ++blocking_sums;
      CHECK(e.modelled_ns == Approx(modelled * 1e9).epsilon(1e-3));
    }
  CHECK(blocking_sums == 2);
}

TEST_CASE("links: a started ppermute's transfer is drawn on its own track with its modelled length, and without links nothing is modelled") {
  Trace trace;
  RunOptions options;
  options.trace = &trace;
  options.links = {{"model", {1, 0, Topology::Ring}}};
  const int64_t n = 500'000;  // 2 MB: 2 ms one hop
  run_on_mesh(Mesh::line(2), [&](Device& dev) {
    std::vector<float> in(n, static_cast<float>(dev.rank())), out(n);
    Pending p = dev.axis("model").start_ppermute(in, out, {{0, 1}, {1, 0}});
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // "compute" longer than the transfer
    p.wait();
    CHECK(out[0] == static_cast<float>(1 - dev.rank()));
  }, options);
  int transfers = 0;
  for (const Trace::Event& e : trace.events())
    if (e.track >= Trace::ASYNC_TRACK_BASE && e.name == "ppermute") {
      ++transfers;
      CHECK(e.duration_ns >= 2'000'000);
    }
  CHECK(transfers == 2);
  Trace plain;
  RunOptions none;
  none.trace = &plain;
  run_on_mesh(Mesh::line(2), [&](Device& dev) {
    std::vector<float> x(10, 1.0f);
    dev.world().all_sum(x);
  }, none);
  for (const Trace::Event& e : plain.events()) CHECK(e.modelled_ns == -1);
}

TEST_CASE("links: absurd --link values (1e12, 1e-12, inf, nan, -1, 0) are refused naming the flag and the bound") {
  struct Case {
    std::string flag, reason;
  };
  const std::vector<Case> cases = {
      {"model=1,1e12", "latency 1e+12 us is beyond 1e+06 us"},
      {"model=1e-12,1", "bandwidth 1e-12 GB/s is below 0.001 GB/s"},
      {"model=1e12,1", "bandwidth 1e+12 GB/s is beyond 10000 GB/s"},
      {"model=inf,1", "bandwidth inf GB/s is not a finite number > 0"},
      {"model=1,inf", "latency inf us is not a finite number >= 0"},
      {"model=nan,1", "bandwidth nan GB/s is not a finite number > 0"},
      {"model=1,nan", "latency nan us is not a finite number >= 0"},
      {"model=-1,1", "bandwidth -1 GB/s is not a finite number > 0"},
      {"model=1,-1", "latency -1 us is not a finite number >= 0"},
      {"model=0,1", "bandwidth 0 GB/s is not a finite number > 0"},
  };
  for (const Case& c : cases) {
    INFO(c.flag);
    try {
      parse_link_flag(c.flag);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).rfind("--link " + c.flag + ": " + c.reason, 0) == 0);
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
  // The bounds themselves, and a latency of 0 (bandwidth alone), are links.
  CHECK_NOTHROW(parse_link_flag("model=0.001,1000000"));
  CHECK_NOTHROW(parse_link_flag("model=10000,0"));
  // run_on_mesh refuses them too, whoever built the spec.
  RunOptions options;
  options.links = {{"model", {1e-12, 1, Topology::Ring}}};
  CHECK_THROWS_WITH(run_on_mesh(Mesh::line(2), [](Device&) {}, options),
                    Catch::Contains("run_on_mesh: links.model: bandwidth 1e-12 GB/s is below"));
}

TEST_CASE("links: a stop request ends a collective held by a link of hours, with RunStopped, about a second later") {
  std::atomic<bool> stop{false};
  std::atomic<int> devices_in_collective{0};
  RunOptions options;
  options.links = {{"model", {MIN_GB_PER_S, MAX_LATENCY_US, Topology::Ring}}};  // every all_sum >= 2 s
  options.stop = &stop;
  // The request comes once both devices are inside the first all_sum: a slow start (a sanitizer's)
  // must not let the body see the stop before any collective and return normally.
  Clock::time_point asked;
  std::thread requester([&] {
    while (devices_in_collective < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    asked = Clock::now();
    stop = true;
  });
  std::string error;
  try {
    run_on_mesh(Mesh::line(2), [&](Device& dev) {
      std::vector<float> x(1'000'000, 1.0f);  // 4 MB at 1 MB/s: ~8 s per all_sum
      ++devices_in_collective;
      for (int step = 0; step < 1000 && !stop; ++step) dev.axis("model").all_sum(x);
    }, options);
  } catch (const RunStopped& e) {
    error = e.what();
  }
  requester.join();
  const double took = seconds_since(asked);
  CHECK(took < 2 * std::chrono::duration<double>(STOP_GRACE).count() + 1.0);
  CHECK(error.find("in one collective when the stop request was") != std::string::npos);
}

TEST_CASE("links: a started collective's wait on a link of hours also ends on a stop request") {
  std::atomic<bool> stop{false};
  RunOptions options;
  options.links = {{"model", {MIN_GB_PER_S, MAX_LATENCY_US, Topology::Ring}}};
  options.stop = &stop;
  stop = true;  // asked before the run even started: the wait must still end
  const auto t0 = Clock::now();
  CHECK_THROWS_AS(run_on_mesh(Mesh::line(2), [&](Device& dev) {
    std::vector<float> x(1'000'000, 1.0f);
    Pending p = dev.axis("model").start_all_sum(x);
    p.wait();
  }, options), RunStopped);
  CHECK(seconds_since(t0) < 2 * std::chrono::duration<double>(STOP_GRACE).count() + 1.0);
}

TEST_CASE("links: a stop request leaves short collectives alone, so the body stops between its steps") {
  std::atomic<bool> stop{false};
  RunOptions options;
  options.links = {{"model", {100, 1, Topology::Ring}}};
  options.stop = &stop;
  std::vector<int> steps(2);
  run_on_mesh(Mesh::line(2), [&](Device& dev) {
    for (int step = 0;; ++step) {
      float asked = stop ? 1.0f : 0.0f;
      dev.axis("model").all_max(std::span<float>(&asked, 1));  // every device stops at the same step
      if (asked > 0) break;
      std::vector<float> x(1000, 1.0f);
      dev.axis("model").all_sum(x);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (dev.rank() == 0 && step == 3) stop = true;
      steps[static_cast<size_t>(dev.rank())] = step;
    }
  }, options);
  CHECK(steps[0] == steps[1]);
  CHECK(steps[0] >= 3);
}

TEST_CASE("links: a device that fails ends the holds of a link of hours elsewhere at once") {
  RunOptions options;
  options.links = {{"model", {MIN_GB_PER_S, MAX_LATENCY_US, Topology::Ring}}};  // only model groups are slow
  const auto t0 = Clock::now();
  // Devices 0 and 1 (one model group) hold ~6 s on their all_sum; device 2, of the other group, fails.
  CHECK_THROWS_WITH(run_on_mesh(Mesh({{"data", 2}, {"model", 2}}), [&](Device& dev) {
    if (dev.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      throw std::runtime_error("out of memory, say");
    }
    if (dev.rank() == 3) return;
    std::vector<float> x(1'000'000, 1.0f);
    dev.axis("model").all_sum(x);
  }, options), Catch::Contains("out of memory, say"));
  CHECK(seconds_since(t0) < 2.0);
}
