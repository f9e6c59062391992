// tpcli::dist — where this process stands in a `tpcli launch` run (the TPCLI_* variables), without
// ZeroMQ: the commands read it whether or not this build has the zmq backend.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tpcli::dist {

struct ZmqConfig {
  int rank = 0;                     // this process (TPCLI_RANK)
  int world_size = 1;               // processes in the run (TPCLI_WORLD_SIZE)
  std::string coordinator;          // rank 0's rendezvous, "tcp://127.0.0.1:29500" (TPCLI_COORDINATOR)
  std::string transport = "tcp";    // inbox transport: "tcp" (any host) or "ipc" (all on one host) (TPCLI_TRANSPORT)
  std::string host = "127.0.0.1";   // address this process binds its tcp inbox on (TPCLI_HOST)
  int devices_per_process = 1;      // thread devices per process (TPCLI_DEVICES_PER_PROCESS)
  double timeout_s = 30.0;          // longest wait for a peer (TPCLI_TIMEOUT)
  bool shared_memory = true;        // rings between processes of one host; TPCLI_SHM=0: sockets only
  std::string job = "-";            // the launch's random token (TPCLI_JOB): ranks of other jobs are refused
  uint64_t config_hash = 0;         // must agree on every rank: from_env() hashes the command line;
                                    // callers may mix in more (fnv1a(config_text, config_hash))

  // Reads the TPCLI_* variables; throws a one-line error naming a missing or bad variable.
  static ZmqConfig from_env();
  // True when TPCLI_RANK is set (this process was started by `tpcli launch` or alike).
  static bool in_env();
};

// A 64-bit FNV-1a hash, for config hashes and the binary hash.
uint64_t fnv1a(std::string_view bytes, uint64_t h = 14695981039346656037ull);

// Mesh ranks hosted by this process: [rank * K, rank * K + K).
std::vector<int> zmq_local_ranks(const ZmqConfig& config);

// True unless this process is a launched rank other than 0: the one process whose stdout is the
// run's output (`tpcli launch` passes rank 0's stdout through unprefixed).
bool is_primary_process();

}  // namespace tpcli::dist
