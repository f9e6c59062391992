// tpcli bench collectives --backend zmq|mpi (also `tpcli bench collectives-zmq [--backend mpi]`): P
// local processes over the ZeroMQ or the MPI backend next to P thread devices, measured in the same run.
#pragma once

#include <string>
#include <vector>

namespace tpcli::cli {

struct ZmqBenchOptions {
  std::vector<int> processes{2, 4};
  std::vector<std::string> sizes{"4K", "64K", "1M", "4M", "16M", "64M"};
  std::vector<std::string> ops{"all_sum", "all_gather", "reduce_scatter", "all_to_all"};
  int reps = 5;
  std::string transport = "ipc";  // zmq only
  std::string backend = "zmq";    // zmq (started through dist::launch) or mpi (through mpirun)
  bool worker = false;  // hidden: one rank of the measurement
};

void run_bench_collectives_zmq(const ZmqBenchOptions& options);

}  // namespace tpcli::cli
