// tpcli::dist — SPMD runtime: one thread per local device, first error rethrown with its rank.
#include "distributed/runtime.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "distributed/backend.h"
#include "distributed/collective_watch.h"
#include "distributed/threads/thread_backend.h"
#include "tensor/blas.h"

namespace tpcli::dist {

Device::Device(int rank, Mesh mesh, Backend& backend, uint64_t seed, Trace* trace)
    : rank_(rank), mesh_(std::move(mesh)), coords_(mesh_.coords(rank)), backend_(backend), trace_(trace) {
  // Seeded from (seed, rank): devices draw different but reproducible streams.
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(rank),
                    0x7470636cu};
  rng_.seed(seq);
}

int Device::coord(std::string_view axis) const {
  return mesh_.has_axis(axis) ? coords_[static_cast<size_t>(mesh_.axis_index(axis))] : 0;
}

Group& Device::world() {
  std::vector<std::string> names;
  for (const MeshAxis& a : mesh_.axes()) names.push_back(a.name);
  return axes(names);
}

Group& Device::axis(std::string_view name) { return axes({std::string(name)}); }

Group& Device::axes(const std::vector<std::string>& names) {
  for (auto& [key, group] : groups_)
    if (key == names) return group;
  const std::vector<int> members = mesh_.group_members(rank_, names);
  std::shared_ptr<Communicator> comm;
  if (members.size() > 1) comm = wrap(backend_.communicator(rank_, members), names);
  groups_.emplace_back(names, Group(std::move(comm), &stats_, trace_, rank_));
  return groups_.back().second;
}

// The modelled link goes inside the stamps, so that a device held by it counts as waiting.
std::shared_ptr<Communicator> Device::wrap(std::shared_ptr<Communicator> comm, const std::vector<std::string>& names) {
  const AxisLink link = group_link(links_, names);
  if (link.gb_per_s > 0) comm = std::make_shared<LinkModelledCommunicator>(std::move(comm), link, watch_);
  if (watch_ && stamp_waits_) comm = std::make_shared<WatchedCommunicator>(std::move(comm), watch_, rank_);
  return comm;
}

namespace {

// The first failure of the run. A device's own error beats the CollectiveAborted it causes in the
// others, whichever thread gets here first.
class FirstError {
 public:
  void record(int rank, const std::string& message, bool is_abort) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (rank_ && !(is_abort_ && !is_abort)) return;
    rank_ = rank;
    message_ = message;
    is_abort_ = is_abort;
  }
  void rethrow() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (rank_) throw DeviceError(*rank_, message_);
  }
  // Whether the run failed only through aborts: no device failed by itself.
  bool abort_only() {
    std::lock_guard<std::mutex> lock(mutex_);
    return rank_ && is_abort_;
  }

 private:
  std::mutex mutex_;
  std::optional<int> rank_;
  std::string message_;
  bool is_abort_ = false;
};

// Polls RunOptions::stop while the devices run, and ends the run when a device is stuck in a
// collective after a stop request (distributed/collective_watch.h says when, and why).
class StopWatcher {
 public:
  using Clock = std::chrono::steady_clock;
  StopWatcher(const std::atomic<bool>* stop, CollectiveWatch& watch, Backend& backend)
      : stop_(stop), watch_(watch), backend_(backend) {
    if (stop_) thread_ = std::thread([this] { poll(); });
  }
  ~StopWatcher() { finish(); }
  StopWatcher(const StopWatcher&) = delete;
  StopWatcher& operator=(const StopWatcher&) = delete;

  // Stops polling; returns why the watcher ended the run, if it did.
  std::optional<std::string> finish() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    return why_;
  }

 private:
  // A signal handler cannot wake a condition variable, hence a poll; 50 ms is nothing next to the
  // grace and costs nothing while the run goes on.
  static constexpr std::chrono::milliseconds POLL{50};

  void poll() {
    std::optional<Clock::time_point> requested_at;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, POLL, [this] { return done_; })) {
      if (!stop_->load(std::memory_order_relaxed)) continue;
      const auto now = Clock::now();
      if (!requested_at) requested_at = now;
      if (now - *requested_at < STOP_GRACE) continue;
      const auto stuck = watch_.longest_wait(now);
      if (!stuck || stuck->waited < STOP_GRACE) continue;
      why_ = describe(*stuck, now - *requested_at);
      lock.unlock();
      watch_.end(*why_);
      backend_.abort(stuck->rank, *why_);
      return;
    }
  }

  static std::string describe(const CollectiveWatch::LongestWait& stuck, Clock::duration since_request) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "device %d had waited %.1f s in one collective when the stop request was %.1f s old", stuck.rank, std::chrono::duration<double>(stuck.waited).count(),
                  std::chrono::duration<double>(since_request).count());
    return std::string(text) + " (a modelled link or a peer too slow for the step to finish)";
  }

  const std::atomic<bool>* stop_;
  CollectiveWatch& watch_;
  Backend& backend_;
  std::mutex mutex_;  // guards done_
  std::condition_variable wake_;
  bool done_ = false;
  std::optional<std::string> why_;  // written by the thread, read after it is joined
  std::thread thread_;              // last: started once everything above exists
};

void check_links(const LinkSpec& links) {
  for (const auto& [axis, link] : links)
    if (const std::string problem = link_problem(link); !problem.empty())
      throw std::invalid_argument("run_on_mesh: links." + axis + ": " + problem);
}

}  // namespace

void run_on_mesh(const Mesh& mesh, const std::function<void(Device&)>& body, const RunOptions& options) {
  std::unique_ptr<Backend> backend =
      options.make_backend ? options.make_backend(mesh) : std::make_unique<ThreadBackend>(mesh.size());
  if (!backend) throw std::invalid_argument("run_on_mesh: make_backend returned no backend");

  std::vector<int> ranks = options.local_ranks;
  if (ranks.empty())
    for (int r = 0; r < mesh.size(); ++r) ranks.push_back(r);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= mesh.size())
      throw std::invalid_argument("run_on_mesh: local rank " + std::to_string(ranks[i]) + " outside mesh " +
                                  mesh.to_string());
    if (std::find(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(i), ranks[i]) !=
        ranks.begin() + static_cast<std::ptrdiff_t>(i))
      throw std::invalid_argument("run_on_mesh: local rank " + std::to_string(ranks[i]) + " listed twice");
  }
  if (options.blas_threads < 0)
    throw std::invalid_argument("run_on_mesh: blas_threads " + std::to_string(options.blas_threads) + " < 0");
  const int blas_threads = options.blas_threads > 0
                               ? options.blas_threads
                               : std::max(1, tensor::available_cores() / static_cast<int>(ranks.size()));

  check_links(options.links);

  if (options.watch && options.watch->devices() < mesh.size())
    throw std::invalid_argument("run_on_mesh: a watch of " + std::to_string(options.watch->devices()) + " devices for mesh " +
                                mesh.to_string());
  CollectiveWatch own_watch(options.watch ? 0 : mesh.size());
  CollectiveWatch& watch = options.watch ? *options.watch : own_watch;
  std::vector<std::unique_ptr<Device>> devices;
  for (int r : ranks) {
    devices.push_back(std::make_unique<Device>(r, mesh, *backend, options.seed, options.trace));
    devices.back()->model_links(options.links);
    devices.back()->watch_collectives(&watch, options.stop != nullptr || options.watch != nullptr);
  }

  FirstError first;
  // The transport's waits and the modelled-link holds, which only sleep, both end at once.
  auto fail_run = [&](int rank, const std::string& what) {
    backend->abort(rank, what);
    watch.end("device " + std::to_string(rank) + " failed: " + what);
  };
  auto run_device = [&](Device& dev) {
    try {
      tensor::set_blas_threads(blas_threads);
      body(dev);
      backend->device_finished(dev.rank());
      return;
    } catch (const CollectiveAborted& e) {
      first.record(dev.rank(), e.what(), true);
      fail_run(dev.rank(), e.what());
    } catch (const std::exception& e) {
      first.record(dev.rank(), e.what(), false);
      fail_run(dev.rank(), e.what());
    } catch (...) {
      first.record(dev.rank(), "unknown exception", false);
      fail_run(dev.rank(), "unknown exception");
    }
  };

  StopWatcher stop_watcher(options.stop, watch, *backend);
  std::vector<std::thread> threads;
  threads.reserve(devices.size());
  try {
    for (auto& dev : devices) threads.emplace_back(run_device, std::ref(*dev));
  } catch (const std::exception& e) {  // could not start a thread: stop the ones that run
    fail_run(-1, std::string("run_on_mesh: cannot start device thread: ") + e.what());
    for (std::thread& t : threads) t.join();
    throw;
  }
  for (std::thread& t : threads) t.join();
  // Only this process's watcher says "stopped": an abort from elsewhere (a peer process that died,
  // or whose own watcher fired first) keeps its own message, even with a stop pending here.
  const std::optional<std::string> stopped = stop_watcher.finish();
  if (stopped && first.abort_only()) throw RunStopped(*stopped);
  first.rethrow();
}

}  // namespace tpcli::dist
