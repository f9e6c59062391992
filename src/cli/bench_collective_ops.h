// tpcli::cli — what `tpcli bench collectives` measures, shared by its thread-backend table and its
// ZeroMQ comparison (--backend zmq): sizes as written on the command line, the ops, and each
// device's buffers for an op.
//
// B = bytes per device (all_sum's buffer, all_gather's output, reduce_scatter's and all_to_all's
// input), D = devices, n = B / 4 floats (a multiple of D).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/group.h"

namespace tpcli::cli {

// UsageError naming the first op that is not all_sum, all_gather, reduce_scatter or all_to_all.
void check_collective_ops(const std::vector<std::string>& ops);

// Calls per timed batch: enough that a batch of small calls is not just timer noise.
int iterations_for(int64_t bytes);

// One device's buffers for `op` on n floats over D devices; made inside the device's thread.
struct CollectiveBuffers {
  CollectiveBuffers(const std::string& op, int64_t n, int D);
  std::vector<float> in, out;  // all_sum: [n] in place; all_gather: [n/D] -> [n];
                               // reduce_scatter: [n] -> [n/D]; all_to_all: [n] -> [n]
};

// One call of `op` ("barrier" too) on `group`.
void run_collective(const std::string& op, dist::Group& group, CollectiveBuffers& buffers);

}  // namespace tpcli::cli
