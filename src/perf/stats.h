// tpcli::perf — summary statistics of repeated timings.
#pragma once

#include <algorithm>
#include <vector>

namespace tpcli::perf {

// The median of `v` (the mean of the middle two for an even count): what the benches and the
// rate measurements report, so a burst of other work on a shared machine moves it little.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace tpcli::perf
