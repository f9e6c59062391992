// Test support for the sharded-layer tests: what one device holds of a full matrix.
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/group.h"

namespace tpcli::nn::testing {

// Absolute ranges of each segment's part on device `rank` of `T` (dist::even_split per segment).
inline std::vector<dist::Range> ranges_of(const std::vector<int64_t>& segs, int T, int rank) {
  std::vector<dist::Range> out;
  int64_t start = 0;
  for (int64_t s : segs) {
    const dist::Range r = dist::even_split(s, T, rank);
    out.push_back({start + r.offset, r.count});
    start += s;
  }
  return out;
}

// The columns `ranges` of a row-major [rows, width] matrix, in range order: [rows, sum of counts].
// What a device holds of a matrix split by columns (inputs of ShardedToAll, outputs of AllToSharded).
inline std::vector<float> columns_of(const std::vector<float>& m, int64_t rows, int64_t width,
                                     const std::vector<dist::Range>& ranges) {
  std::vector<float> out;
  for (int64_t n = 0; n < rows; ++n)
    for (const dist::Range& r : ranges)
      out.insert(out.end(), m.begin() + n * width + r.offset, m.begin() + n * width + r.offset + r.count);
  return out;
}

}  // namespace tpcli::nn::testing
