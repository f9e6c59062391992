// tpcli::dist — SPMD runtime: one thread per local device, first error rethrown with its rank.
#include "dist/runtime.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "dist/backend.h"
#include "dist/threads/thread_backend.h"
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
  if (members.size() > 1) comm = backend_.communicator(rank_, members);
  Group group(std::move(comm), &stats_, trace_, rank_);
  const AxisLink link = group_link(links_, names);
  if (members.size() > 1 && link.gb_per_s > 0)
    group.model_links(std::make_shared<LinkClock>(link, static_cast<int>(members.size())));
  groups_.emplace_back(names, std::move(group));
  return groups_.back().second;
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

 private:
  std::mutex mutex_;
  std::optional<int> rank_;
  std::string message_;
  bool is_abort_ = false;
};

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

  std::vector<std::unique_ptr<Device>> devices;
  for (int r : ranks) {
    devices.push_back(std::make_unique<Device>(r, mesh, *backend, options.seed, options.trace));
    devices.back()->model_links(options.links);
  }

  FirstError first;
  auto run_device = [&](Device& dev) {
    try {
      tensor::set_blas_threads(blas_threads);
      body(dev);
      backend->device_finished(dev.rank());
      return;
    } catch (const CollectiveAborted& e) {
      first.record(dev.rank(), e.what(), true);
      backend->abort(dev.rank(), e.what());
    } catch (const std::exception& e) {
      first.record(dev.rank(), e.what(), false);
      backend->abort(dev.rank(), e.what());
    } catch (...) {
      first.record(dev.rank(), "unknown exception", false);
      backend->abort(dev.rank(), "unknown exception");
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(devices.size());
  try {
    for (auto& dev : devices) threads.emplace_back(run_device, std::ref(*dev));
  } catch (const std::exception& e) {  // could not start a thread: stop the ones that run
    backend->abort(-1, std::string("run_on_mesh: cannot start device thread: ") + e.what());
    for (std::thread& t : threads) t.join();
    throw;
  }
  for (std::thread& t : threads) t.join();
  first.rethrow();
}

}  // namespace tpcli::dist
