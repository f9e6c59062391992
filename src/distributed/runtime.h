// tpcli::dist — the SPMD runtime: one device per mesh position, each running the same function.
//
//   run_on_mesh(mesh, [&](Device& dev) { ... dev.axis("model").all_sum(x); ... });
//
// A device is a thread with memory of its own (or, with the ZeroMQ backend, a process).
// Nothing is shared between devices except what collectives move. If any device throws, every
// device waiting in a collective is woken with CollectiveAborted, all threads are joined, and
// run_on_mesh rethrows the first error as DeviceError, naming the device's rank.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/group.h"
#include "distributed/links.h"
#include "distributed/mesh.h"

namespace tpcli::dist {

class Trace;  // Chrome-trace recorder (distributed/trace.h); null when tracing is off

class DeviceError : public std::runtime_error {
 public:
  DeviceError(int rank, const std::string& what)
      : std::runtime_error("device " + std::to_string(rank) + ": " + what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// run_on_mesh's error when RunOptions::stop ended the run while a device waited in a collective.
class RunStopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Backend;          // creates the communicators of a run (distributed/backend.h)
class CollectiveWatch;  // distributed/collective_watch.h

class Device {
 public:
  int rank() const { return rank_; }
  const Mesh& mesh() const { return mesh_; }
  const std::vector<int>& coords() const { return coords_; }
  int coord(std::string_view axis) const;  // 0 if the mesh has no such axis

  Group& world();                                  // every device of the mesh
  Group& axis(std::string_view name);              // along one axis (size 1 if the mesh lacks it)
  Group& axes(const std::vector<std::string>& names);  // along several axes (created on first use;
                                                       // every member must ask in the same order)
  std::mt19937& rng() { return rng_; }             // seeded from (seed, rank)
  CommStats& stats() { return stats_; }
  Trace* trace() { return trace_; }

  Device(int rank, Mesh mesh, Backend& backend, uint64_t seed, Trace* trace);
  // Groups made from now on along a listed axis complete no earlier than their modelled link time.
  void model_links(LinkSpec links) { links_ = std::move(links); }
  // Groups made from now on end their holds when `watch` ends the run, and stamp their waits in
  // it when `stamp_waits` (only a run that can be asked to stop reads the stamps).
  void watch_collectives(CollectiveWatch* watch, bool stamp_waits) {
    watch_ = watch;
    stamp_waits_ = stamp_waits;
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

 private:
  // A group's communicator wrapped in what this run adds around each collective: the modelled
  // link of the group's axes, the stop watch's stamps.
  std::shared_ptr<Communicator> wrap(std::shared_ptr<Communicator> comm, const std::vector<std::string>& names);

  int rank_;
  Mesh mesh_;
  std::vector<int> coords_;
  Backend& backend_;
  std::mt19937 rng_;
  CommStats stats_;
  Trace* trace_;
  LinkSpec links_;  // empty: nothing modelled
  CollectiveWatch* watch_ = nullptr;
  bool stamp_waits_ = false;
  // Cache keyed by axis list; a deque so references handed out by axis()/axes() stay valid.
  std::deque<std::pair<std::vector<std::string>, Group>> groups_;
};

struct RunOptions {
  uint64_t seed = 0;
  // The transport. Null: the thread backend (every device a thread of this process).
  // The ZeroMQ backend (devices in several processes) is made by distributed/zmq_backend.h.
  std::function<std::unique_ptr<Backend>(const Mesh&)> make_backend;
  // Mesh ranks this process runs as threads. Empty: all of them (the thread backend).
  std::vector<int> local_ranks;
  Trace* trace = nullptr;
  // BLIS threads per device; 0 = automatic (cores / devices, at least 1).
  int blas_threads = 0;
  // Modelled links by axis (distributed/links.h); empty: collectives run at the transport's own speed.
  LinkSpec links;
  // Set from outside (a signal handler) to ask the run to stop. The body is expected to notice it
  // between its own steps; a device still waiting in one collective STOP_GRACE after the request,
  // and for STOP_GRACE, fails the run with RunStopped (distributed/collective_watch.h). Null: never.
  const std::atomic<bool>* stop = nullptr;
  // A watch of at least mesh.size() devices, made by the caller, in which the devices stamp their
  // collective waits, for another thread to read while the run goes on (a server's /health:
  // CollectiveWatch::stuck). Null: the run keeps a watch of its own.
  CollectiveWatch* watch = nullptr;
};

void run_on_mesh(const Mesh& mesh, const std::function<void(Device&)>& body, const RunOptions& options = {});

}  // namespace tpcli::dist
