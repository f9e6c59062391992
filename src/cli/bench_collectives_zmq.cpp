// tpcli bench collectives-zmq — the ZeroMQ (or MPI) backend next to the thread backend, in the same run.
//
// For each process count P: the thread backend with P devices in this process, then P local
// processes over ZeroMQ (started through dist::launch) or MPI (started by `mpirun -n P`, TPCLI_MPIRUN
// overrides the command); each is this binary in the hidden --worker mode, rank 0 reports. Per op and buffer size B (bytes per device, as `bench collectives`):
// median time of one call (latency for small B), algorithmic bandwidth B / time, and zmq / threads.
// The target: all_sum of 4 MB and more within 2x of the thread backend on loopback.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli/bench_collective_ops.h"
#include "cli/common_flags.h"
#include "cli/bench_collectives_zmq.h"
#include "cli/commands.h"
#include "distributed/launch/launcher.h"
#include "distributed/mpi/mpi_backend.h"
#include "distributed/runtime.h"
#include "distributed/zmq/zmq_backend.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

using Options = ZmqBenchOptions;

// Barriers for a quarter of a second, timed on member 0 and broadcast, before anything is measured:
// points measured in the first tens of milliseconds of a fresh set of processes came out several
// times slower, whatever their own warm-up.
void settle(dist::Group& world) {
  const auto until = Clock::now() + std::chrono::milliseconds(250);
  for (int32_t more = 1; more > 0;) {
    for (int i = 0; i < 100; ++i) world.barrier();
    more = world.rank() == 0 && Clock::now() < until ? 1 : 0;
    world.broadcast(std::as_writable_bytes(std::span<int32_t>(&more, 1)), 0);
  }
}

// Seconds per call of every (op, size), measured inside one run_on_mesh; device 0's medians.
using Results = std::map<std::pair<std::string, int64_t>, double>;

Results measure(const Options& o, int D, const dist::RunOptions& run_options) {
  std::vector<int64_t> sizes;
  for (const std::string& s : o.sizes) sizes.push_back(parse_bytes(s));
  std::vector<std::string> ops = o.ops;
  ops.insert(ops.begin(), "barrier");
  Results results;
  dist::run_on_mesh(
      dist::Mesh::line(D),
      [&](dist::Device& dev) {
        dist::Group& world = dev.world();
        settle(world);
        for (const std::string& op : ops) {
          for (int64_t B : op == "barrier" ? std::vector<int64_t>{4} : sizes) {
            const int64_t floats = std::max<int64_t>(D, B / 4 / D * D);
            CollectiveBuffers buf(op, floats, D);
            const int iters = op == "barrier" ? 200 : iterations_for(floats * 4);
            for (int i = 0; i < iters; ++i) run_collective(op, world, buf);  // warm-up: the rings' first pass is slow
            std::vector<double> per_call;
            for (int r = 0; r < o.reps; ++r) {
              world.barrier();
              const auto t0 = Clock::now();
              for (int i = 0; i < iters; ++i) run_collective(op, world, buf);
              world.barrier();
              per_call.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
            }
            std::sort(per_call.begin(), per_call.end());
            if (dev.rank() == 0) results[{op, floats * 4}] = per_call[per_call.size() / 2];
          }
        }
      },
      run_options);
  return results;
}

// The hidden worker: one rank of a zmq or mpi run; rank 0 prints "op bytes seconds" lines.
void run_worker(const Options& o) {
  dist::RunOptions run_options;
  int devices = 0;
  if (o.backend == "mpi") {
    devices = dist::mpi_process_count();
    dist::use_mpi_backend(run_options, devices);
  } else {
    const dist::ZmqConfig config = dist::ZmqConfig::from_env();
    dist::use_zmq_backend(run_options, config);
    devices = config.world_size * config.devices_per_process;
  }
  const Results r = measure(o, devices, run_options);
  for (const auto& [key, seconds] : r) std::printf("%s %lld %.9g\n", key.first.c_str(), static_cast<long long>(key.second), seconds);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

Results measure_zmq(const Options& o, int P) {
  dist::LaunchOptions launch;
  launch.processes = P;
  launch.transport = o.transport;
  FILE* out = std::tmpfile();
  launch.out_fd = fileno(out);
  const int code = dist::launch(launch, {"tpcli", "bench", "collectives-zmq", "--worker", "--sizes", join(o.sizes),
                                         "--ops", join(o.ops), "--reps", std::to_string(o.reps)});
  std::rewind(out);
  Results r;
  char op[64];
  long long bytes = 0;
  double seconds = 0;
  while (std::fscanf(out, "%63s %lld %lf", op, &bytes, &seconds) == 3) r[{op, bytes}] = seconds;
  std::fclose(out);
  if (code != 0) throw std::runtime_error("the zmq ranks failed (exit code " + std::to_string(code) + ")");
  return r;
}

// P processes of this binary under mpirun (as root, mpirun wants --allow-run-as-root).
Results measure_mpi(const Options& o, int P) {
  const char* launcher = std::getenv("TPCLI_MPIRUN");
  std::string command = launcher && *launcher ? launcher : "mpirun --oversubscribe";
  if (::geteuid() == 0 && !(launcher && *launcher)) command += " --allow-run-as-root";
  command += " -n " + std::to_string(P) + " '" + dist::self_executable() + "' bench collectives-zmq --worker --backend mpi" +
             " --sizes " + join(o.sizes) + " --ops " + join(o.ops) + " --reps " + std::to_string(o.reps);
  FILE* out = ::popen(command.c_str(), "r");
  if (!out) throw std::runtime_error("cannot run " + command);
  Results r;
  char op[64];
  long long bytes = 0;
  double seconds = 0;
  while (std::fscanf(out, "%63s %lld %lf", op, &bytes, &seconds) == 3) r[{op, bytes}] = seconds;
  const int status = ::pclose(out);
  if (status != 0) throw std::runtime_error("the mpi ranks failed: " + command + " (status " + std::to_string(status) + ")");
  return r;
}

}  // namespace

void run_bench_collectives_zmq(const ZmqBenchOptions& o) {
  if (o.worker) return run_worker(o);
  check_collective_ops(o.ops);
  for (const std::string& size : o.sizes) parse_bytes(size);  // a bad one fails before anything runs
  if (o.reps < 1) throw UsageError("--reps must be >= 1");
  for (int P : o.processes)
    if (P < 2 || P > 16) throw UsageError(o.backend + ": " + std::to_string(P) + " processes is not in [2, 16]");
  if (o.backend == "mpi" && !dist::mpi_available())
    throw UsageError("--backend mpi: this tpcli was built without MPI (install libopenmpi-dev and rebuild with -DTPCLI_MPI=ON)");
  if (o.backend == "zmq" && !dist::zmq_available())
    throw UsageError("--backend zmq: this tpcli was built without ZeroMQ (install libzmq3-dev cppzmq-dev and rebuild with -DTPCLI_ZMQ=ON)");
  const bool mpi = o.backend == "mpi";
  const std::string name = o.backend;
  std::printf("tpcli bench collectives-zmq: %s between local processes vs threads, median of %d batches\n\n",
              mpi ? "MPI (mpirun)" : o.transport.c_str(), o.reps);
  for (int P : o.processes) {
    const Results threads = measure(o, P, {});
    const Results other = mpi ? measure_mpi(o, P) : measure_zmq(o, P);
    std::printf("P=%d  barrier: threads %.1f us, %s %.1f us\n", P, threads.at({"barrier", 4 * P}) * 1e6, name.c_str(),
                other.count({"barrier", 4 * P}) ? other.at({"barrier", 4 * P}) * 1e6 : 0.0);
    std::printf("  %-15s %10s %12s %12s %12s %12s %9s\n", "op", "bytes", "threads_us", (name + "_us").c_str(),
                "threads_GB/s", (name + "_GB/s").c_str(), (name + "/thr").c_str());
    for (const auto& [key, t] : threads) {
      if (key.first == "barrier" || !other.count(key)) continue;
      const double z = other.at(key), b = static_cast<double>(key.second);
      std::printf("  %-15s %10lld %12.1f %12.1f %12.2f %12.2f %8.2fx\n", key.first.c_str(),
                  static_cast<long long>(key.second), t * 1e6, z * 1e6, b / t / 1e9, b / z / 1e9, z / t);
    }
    std::printf("\n");
  }
}

namespace {

void setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--processes", o->processes, "process counts, e.g. 2,4")->delimiter(',')->capture_default_str();
  sub.add_option("--sizes", o->sizes, "bytes per device, e.g. 4K,4M")->delimiter(',')->capture_default_str();
  sub.add_option("--ops", o->ops, "all_sum,all_gather,reduce_scatter,all_to_all")->delimiter(',')->capture_default_str();
  sub.add_option("--reps", o->reps, "timed batches per point (median reported)")->capture_default_str();
  sub.add_option("--transport", o->transport, "ipc or tcp (127.0.0.1)")->check(CLI::IsMember({"ipc", "tcp"}))->capture_default_str();
  sub.add_option("--backend", o->backend, "zmq (tpcli's launcher) or mpi (mpirun)")->check(CLI::IsMember({"zmq", "mpi"}))->capture_default_str();
  sub.add_flag("--worker", o->worker, "internal: one rank of the measurement")->group("");
  sub.callback([o] { run_bench_collectives_zmq(*o); });
}

const bool registered = register_bench(
    {"collectives-zmq", "ZeroMQ (or MPI) backend vs thread backend: latency and bandwidth per size, P local processes", setup});

}  // namespace

}  // namespace tpcli::cli
