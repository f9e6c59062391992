// tpcli::dist — optional Chrome-trace recorder (Perfetto / chrome://tracing open the JSON).
//
// One track per device (tid = mesh rank). Compute spans come from an RAII TraceSpan placed around
// the work; collective spans are recorded by Group automatically when the device has a trace.
// A null Trace* turns every span into a no-op, so call sites need no `if`.
//
//   dist::TraceSpan span(dev.trace(), dev.rank(), "attention");
//
// Thread-safe: every device thread records into the same Trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tpcli::dist {

class Trace {
 public:
  struct Event {
    int track = 0;             // device rank
    std::string name;          // "all_sum", "attention", ...
    std::string category;      // "compute" | "collective"
    int64_t start_ns = 0;      // since the Trace was made
    int64_t duration_ns = 0;
    int64_t bytes = -1;        // collective payload (bytes this device sent + received); -1: none
    int64_t modelled_ns = -1;  // collective's modelled link time (distributed/links.h); -1: links not modelled
    int64_t payload = -1;      // blocking collective: the array it is about (distributed/links.h's B); -1: none
  };

  // Started collectives of device r are drawn on track ASYNC_TRACK_BASE + r, beside its compute.
  static constexpr int ASYNC_TRACK_BASE = 1000;

  Trace();
  int64_t now_ns() const;  // monotonic, since construction
  int64_t ns_of(std::chrono::steady_clock::time_point t) const;  // the same clock
  void record(Event event);
  std::vector<Event> events() const;  // a copy, in recording order
  // Chrome trace JSON ("traceEvents", complete events "ph":"X", one thread name per track).
  std::string to_json() const;
  void write(const std::string& path) const;  // throws naming the path on failure

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;  // guarded by mutex_
};

// Records [construction, destruction) as one span on `track`. No-op when trace is null.
class TraceSpan {
 public:
  TraceSpan(Trace* trace, int track, const char* name, const char* category = "compute", int64_t bytes = -1);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Trace* trace_;
  int track_;
  const char* name_;
  const char* category_;
  int64_t bytes_;
  int64_t start_ns_ = 0;
};

}  // namespace tpcli::dist
