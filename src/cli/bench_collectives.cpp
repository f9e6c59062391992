// tpcli bench collectives — the thread backend's collectives against the memory-bandwidth bound.
//
// For each device count D and buffer size B (bytes per device: all_sum's buffer, all_gather's
// output, reduce_scatter's and all_to_all's input) it reports the median time of one call,
// the algorithmic bandwidth B / time, and the fraction of the bound:
//   bound time = (bytes any algorithm must read + write, over all devices) / copy traffic rate,
// where the copy traffic rate (read + written bytes per second) is measured by memcpy of the same
// D x B bytes on min(D, cores) threads in the same run. Minimum traffic per op:
//   all_sum: read D*B, write D*B       all_gather: read B, write D*B
//   reduce_scatter: read D*B, write B  all_to_all: read D*B, write D*B
// A bare barrier is timed too, to compare small collectives against it.
//
// --backend zmq instead runs each device count as that many local processes over the ZeroMQ
// backend, next to the thread backend in the same run (cli/bench_collectives_zmq.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_collective_ops.h"
#include "cli/common_flags.h"
#include "cli/bench_collectives_zmq.h"
#include "cli/commands.h"
#include "distributed/runtime.h"
#include "tensor/blas.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchCollectivesOptions {
  std::vector<int> devices{2, 4, 8};
  std::vector<std::string> sizes{"4K", "64K", "1M", "4M", "16M", "64M"};
  std::vector<std::string> ops{"all_sum", "all_gather", "reduce_scatter", "all_to_all"};
  int reps = 7;  // batches; the median is reported
  std::string backend = "threads";
  std::string transport = "ipc";  // zmq only
};

std::string format_bytes(int64_t b) {
  char buf[32];
  if (b >= (1 << 20) && b % (1 << 20) == 0) std::snprintf(buf, sizeof buf, "%lld MB", static_cast<long long>(b >> 20));
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%lld KB", static_cast<long long>(b >> 10));
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Timing {
  double op_s = 0;          // median seconds per call
  double copy_rate = 0;     // median memcpy traffic rate, bytes read + written per second
};

// Times `call` (seconds per call, batches of iters calls between barriers, on device 0) and, in
// alternation with it so both see the same machine load, memcpy of copy_bytes in total split over
// the first copy_threads devices (each copying its own buffers). Medians over reps.
Timing time_collective(int devices, int reps, int iters, int64_t copy_bytes, int copy_threads,
                       const std::function<void(dist::Device&)>& setup, const std::function<void(dist::Device&)>& call) {
  std::vector<double> per_call, rates;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    setup(dev);
    dist::Group& world = dev.world();
    const bool copier = copy_bytes > 0 && dev.rank() < copy_threads;
    const size_t share = copier ? static_cast<size_t>(copy_bytes / copy_threads) : 0;
    std::vector<char> src(share, 1), dst(share, 0);  // this device's memcpy buffers
    const int copy_iters = copy_bytes > 0 ? iterations_for(std::max<int64_t>(1, copy_bytes / copy_threads)) : 0;
    call(dev);  // warm-up: first touch of the buffers, lazily made groups
    for (int r = 0; r < reps; ++r) {
      if (copy_bytes > 0) {
        world.barrier();
        const auto c0 = Clock::now();
        for (int i = 0; i < copy_iters && copier; ++i) std::memcpy(dst.data(), src.data(), share);
        world.barrier();
        const double s = std::chrono::duration<double>(Clock::now() - c0).count();
        if (dev.rank() == 0) rates.push_back(2.0 * static_cast<double>(share) * copy_threads * copy_iters / s);
      }
      world.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) call(dev);
      world.barrier();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (dev.rank() == 0) per_call.push_back(s / iters);
    }
  });
  return {median(per_call), median(rates)};
}

struct OpSpec {
  const char* name;
  // Minimum bytes read + written over all devices for buffer size B on D devices.
  double (*traffic)(double B, int D);
};

const OpSpec OPS[] = {
    {"all_sum", [](double B, int D) { return 2.0 * D * B; }},
    {"all_gather", [](double B, int D) { return B + D * B; }},
    {"reduce_scatter", [](double B, int D) { return D * B + B; }},
    {"all_to_all", [](double B, int D) { return 2.0 * D * B; }},
};

void run_bench_collectives(const BenchCollectivesOptions& o) {
  std::vector<int64_t> sizes;
  for (const std::string& s : o.sizes) sizes.push_back(parse_bytes(s));
  for (int d : o.devices)
    if (d < 1 || d > 256) throw UsageError("--devices " + std::to_string(d) + " is not in [1, 256]");
  check_collective_ops(o.ops);
  if (o.reps < 1) throw UsageError("--reps must be >= 1");
  const int cores = tensor::available_cores();
  std::printf("tpcli bench collectives: thread backend, %d cores, median of %d batches\n", cores, o.reps);
  std::printf("bound = minimum bytes read+written / memcpy traffic rate of the same bytes on min(D, cores) threads\n\n");
  for (int D : o.devices) {
    const double barrier_s =
        time_collective(D, o.reps, 400, 0, 1, [](dist::Device&) {}, [](dist::Device& dev) { dev.world().barrier(); }).op_s;
    std::printf("D=%d  barrier %.2f us\n", D, barrier_s * 1e6);
    std::printf("  %-15s %8s %12s %12s %12s %12s %9s\n", "op", "size", "median_us", "algbw_GB/s", "memcpy_GB/s",
                "bound_us", "of_bound");
    for (int64_t B : sizes) {
      const int64_t floats = std::max<int64_t>(D, B / 4 / D * D);  // a multiple of D (all_to_all, gather)
      const double bytes = static_cast<double>(floats) * 4;
      for (const OpSpec& spec : OPS) {
        if (std::find(o.ops.begin(), o.ops.end(), spec.name) == o.ops.end()) continue;
        const std::string op = spec.name;
        std::vector<std::optional<CollectiveBuffers>> bufs(static_cast<size_t>(D));  // [D], made by each device
        const Timing t = time_collective(
            D, o.reps, iterations_for(static_cast<int64_t>(bytes)), static_cast<int64_t>(bytes) * D, std::min(D, cores),
            [&](dist::Device& dev) { bufs[static_cast<size_t>(dev.rank())].emplace(op, floats, D); },
            [&](dist::Device& dev) { run_collective(op, dev.world(), *bufs[static_cast<size_t>(dev.rank())]); });
        const double s = t.op_s, copy_rate = t.copy_rate;
        const double bound = spec.traffic(bytes, D) / copy_rate;
        std::printf("  %-15s %8s %12.2f %12.2f %12.2f %12.2f %8.0f%%\n", spec.name,
                    format_bytes(static_cast<int64_t>(bytes)).c_str(), s * 1e6, bytes / s / 1e9, copy_rate / 2 / 1e9,
                    bound * 1e6, 100.0 * bound / s);
        if (op == "all_sum" && B <= 4096)
          std::printf("  %-15s %8s %12.2f x barrier (target <= 3x)\n", "", "", s / barrier_s);
      }
    }
    std::printf("\n");
  }
}

void setup_bench_collectives(CLI::App& sub) {
  auto o = std::make_shared<BenchCollectivesOptions>();
  sub.add_option("--devices", o->devices, "Device counts, e.g. 2,4,8")->delimiter(',')->capture_default_str();
  sub.add_option("--sizes", o->sizes, "Bytes per device, e.g. 4K,1M,64M")->delimiter(',')->capture_default_str();
  sub.add_option("--ops", o->ops, "all_sum,all_gather,reduce_scatter,all_to_all")->delimiter(',')->capture_default_str();
  sub.add_option("--reps", o->reps, "Timed batches per point (median reported)")->capture_default_str();
  sub.add_option("--backend", o->backend, "threads, or zmq / mpi: each device count as local processes, next to threads")
      ->check(CLI::IsMember({"threads", "zmq", "mpi"}))
      ->capture_default_str();
  sub.add_option("--transport", o->transport, "zmq only: ipc or tcp (127.0.0.1) between processes")
      ->check(CLI::IsMember({"ipc", "tcp"}))
      ->capture_default_str();
  sub.callback([o, &sub] {
    if (o->backend == "threads") return run_bench_collectives(*o);
    ZmqBenchOptions z;
    if (sub.count("--devices")) z.processes = o->devices;  // default 2,4: 8 processes on 2 cores say little
    z.sizes = o->sizes;
    z.ops = o->ops;
    z.reps = o->reps;
    z.transport = o->transport;
    z.backend = o->backend;
    run_bench_collectives_zmq(z);
  });
}

const bool registered = register_bench(
    {"collectives", "Collective time and bandwidth vs the memory-bandwidth bound (thread backend)", setup_bench_collectives});

}  // namespace

}  // namespace tpcli::cli
