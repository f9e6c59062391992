// tpcli::dist — the ZeroMQ backend: devices are processes (each hosting K thread devices) that
// talk over ZeroMQ. Same collectives and same results, bit for bit, as the thread backend: every
// reduction adds the members' terms in member order, x_0 + x_1 + ... + x_{S-1}.
//
// Algorithms (S members; n floats):
//   all_sum / all_max, n*4 <= 64 KB   every member sends x to every other, each reduces in member
//                                     order: one step, latency-bound sizes
//   all_sum / all_max, larger         reduce-scatter (member m receives slice m of everyone's x and
//                                     reduces it) then all-gather of the slices: each member sends
//                                     and receives 2 n (S-1)/S floats, the bandwidth bound a ring
//                                     reaches, in 2 steps instead of 2 (S-1)
//   reduce_scatter, all_gather, all_to_all(_v), ppermute   direct sends to each destination
//   broadcast                         root sends x; large x with S > 2: scatter from the root, then
//                                     all-gather of the slices
// Sends never wait for the receiver (unbounded queues, or a ring send left pending), so every
// collective posts its sends first and then receives: no ordering can deadlock. A ring send reads
// the caller's buffer until the transport's flush(), so a collective flushes before it overwrites
// anything it sent and before it returns. Messages over 1 MB travel in chunks, reduced as they
// arrive.
//
// Start-up and failure handling: distributed/zmq_transport.h. Use from a command:
//
//   dist::RunOptions options;
//   if (backend == "zmq") dist::use_zmq_backend(options, dist::ZmqConfig::from_env());
//   dist::run_on_mesh(mesh, body, options);   // runs this process's devices only
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "distributed/backend.h"
#include "distributed/mesh.h"
#include "distributed/runtime.h"
#include "distributed/zmq/zmq_config.h"

namespace tpcli::dist {

class ZmqTransport;  // distributed/zmq/zmq_transport.h

// False in a build without ZeroMQ (CMake TPCLI_ZMQ=OFF): then use_zmq_backend throws a one-line error.
bool zmq_available();

class ZmqBackend : public Backend {
 public:
  // Meets the other processes (blocks until all have joined, or throws a one-line error).
  ZmqBackend(const ZmqConfig& config, const Mesh& mesh);

  std::shared_ptr<Communicator> communicator(int rank, const std::vector<int>& members) override;
  void abort(int failed_rank, const std::string& message) override;
  void device_finished(int rank) override;

 private:
  std::shared_ptr<ZmqTransport> transport_;
  std::mutex mutex_;                                    // guards made_
  std::map<std::pair<int, std::vector<int>>, int> made_;  // communicators made per (rank, members)
};

// Makes run_on_mesh use ZeroMQ: sets options.make_backend and options.local_ranks.
void use_zmq_backend(RunOptions& options, const ZmqConfig& config);

}  // namespace tpcli::dist
