// Waiting without yielding the core: the futex wait itself (wake, timeout, nothing lost between
// the check and the sleep), and the thread backend's waits built on it (a waiting device sleeps
// instead of burning CPU; a failure wakes every sleeper in every kind of collective).
#include <catch2/catch.hpp>
#include <time.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "distributed/futex.h"
#include "distributed/runtime.h"

using namespace tpcli::dist;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Blocks until `count` threads sleep on the futex (sleepers counts them inside futex_wait).
void wait_for_sleepers(const std::atomic<uint32_t>& sleepers, uint32_t count) {
  const auto t0 = Clock::now();
  while (sleepers.load() < count && seconds_since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(sleepers.load() == count);
}

}  // namespace

TEST_CASE("futex: a word that already changed returns at once, an unchanged one sleeps until the timeout") {
  std::atomic<uint32_t> word{5}, sleepers{0};
  auto t0 = Clock::now();
  CHECK(futex_wait(word, 4, sleepers, FutexScope::Process, std::chrono::seconds(10)));
  CHECK(seconds_since(t0) < 1.0);
  t0 = Clock::now();
  CHECK_FALSE(futex_wait(word, 5, sleepers, FutexScope::Process, std::chrono::milliseconds(30)));
  CHECK(seconds_since(t0) >= 0.025);
  CHECK(sleepers.load() == 0);
}

TEST_CASE("futex: one wake_all wakes every sleeper, in both scopes") {
  for (FutexScope scope : {FutexScope::Process, FutexScope::Shared}) {
    std::atomic<uint32_t> word{0}, sleepers{0};
    constexpr int SLEEPERS = 6;
    std::atomic<int> woken{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < SLEEPERS; ++i)
      threads.emplace_back([&] {
        while (word.load() == 0) futex_wait(word, 0, sleepers, scope);  // no timeout: only a wake ends it
        ++woken;
      });
    wait_for_sleepers(sleepers, SLEEPERS);
    CHECK(woken.load() == 0);
    const auto t0 = Clock::now();
    word.fetch_add(1);
    futex_wake_all(word, sleepers, scope);
    for (std::thread& t : threads) t.join();
    CHECK(woken.load() == SLEEPERS);
    CHECK(seconds_since(t0) < 5.0);
  }
}

TEST_CASE("futex: 20000 hand-offs between two threads lose no wake-up") {
  // Ping-pong on one word: each side waits for the other's value, then bumps it. A wake-up lost
  // between a side's check and its sleep would hang here (the sleep has no timeout).
  std::atomic<uint32_t> word{0}, sleepers{0};
  constexpr uint32_t ROUNDS = 20000;
  auto player = [&](uint32_t parity) {
    for (uint32_t v = parity; v < 2 * ROUNDS; v += 2) {
      for (uint32_t seen = word.load(); seen != v; seen = word.load()) futex_wait(word, seen, sleepers, FutexScope::Process);
      word.fetch_add(1);
      futex_wake_all(word, sleepers, FutexScope::Process);
    }
  };
  std::thread odd(player, 1u);
  player(0u);
  odd.join();
  CHECK(word.load() == 2 * ROUNDS);
}

TEST_CASE("thread backend: devices waiting for a late device sleep instead of burning CPU") {
  // 8 devices: 7 wait 300 ms in a barrier (then in an all_sum) for device 0. Spinning or yielding
  // in a loop would cost them CPU time close to the wait; sleeping costs almost none.
  constexpr double LATE = 0.3;
  std::vector<double> cpu(8, 0.0);
  run_on_mesh(Mesh::line(8), [&](Device& dev) {
    std::vector<float> x(100, 1.0f);
    const double cpu0 = thread_cpu_seconds();
    if (dev.rank() == 0) std::this_thread::sleep_for(std::chrono::duration<double>(LATE));
    dev.world().barrier();
    if (dev.rank() == 0) std::this_thread::sleep_for(std::chrono::duration<double>(LATE));
    dev.world().all_sum(x);
    cpu[static_cast<size_t>(dev.rank())] = thread_cpu_seconds() - cpu0;
    CHECK(x[0] == 8.0f);
  });
  for (int d = 1; d < 8; ++d) {
    INFO("device " << d << " used " << cpu[static_cast<size_t>(d)] << " s of CPU waiting " << 2 * LATE << " s");
    CHECK(cpu[static_cast<size_t>(d)] < 0.1 * 2 * LATE);
  }
}

TEST_CASE("thread backend: a failure wakes devices asleep in every kind of collective, with its message") {
  const std::vector<std::string> ops{"barrier", "all_sum", "all_gather", "reduce_scatter", "all_to_all",
                                     "ppermute", "broadcast", "large all_sum"};
  for (const std::string& op : ops) {
    INFO(op);
    const auto t0 = Clock::now();
    try {
      run_on_mesh(Mesh::line(4), [&](Device& dev) {
        Group& g = dev.world();
        if (dev.rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others are asleep by now
          throw std::runtime_error("disk full on device 2");
        }
        std::vector<float> x(op == "large all_sum" ? 1 << 16 : 16, 1.0f), out(64);  // [n], [4n]
        if (op == "barrier") g.barrier();
        if (op == "all_sum" || op == "large all_sum") g.all_sum(x);
        if (op == "all_gather") g.all_gather(x, out);
        if (op == "reduce_scatter") g.reduce_scatter(x, std::span<float>(out).first(4));
        if (op == "all_to_all") g.all_to_all(x, std::span<float>(out).first(16));
        if (op == "ppermute") g.ppermute(x, std::span<float>(out).first(16), {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
        if (op == "broadcast") g.broadcast(x, 2);
      });
      FAIL("the run returned normally");
    } catch (const DeviceError& e) {
      CHECK(e.rank() == 2);
      CHECK(std::string(e.what()).find("disk full on device 2") != std::string::npos);
    }
    CHECK(seconds_since(t0) < 5.0);
  }
}
