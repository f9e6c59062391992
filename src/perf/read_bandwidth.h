// tpcli::perf — read bandwidth measured as STREAM does: large buffers (far beyond the caches),
// several streams read at once by every thread (SIMD loads, independent accumulators), one thread
// per core in use; the median and best of several passes. `tpcli bench decode`'s roofline.
#pragma once

#include <cstddef>

namespace tpcli::perf {

constexpr int STREAMS = 4;  // buffers each thread reads at once

struct Bandwidth {
  double median = 0, best = 0;  // bytes/s
};

// Read bandwidth of `threads` threads, each streaming STREAMS buffers of its own (first touched by
// itself, 64-byte aligned, huge pages as the weights), over passes started together. Median and best are both reported, and compared with the median
// and best decode step: like with like, so the ratio stays fair on a machine shared with other work.
Bandwidth measure_read_bandwidth(int threads, size_t total_bytes);

}  // namespace tpcli::perf
