// Test support: the largest difference between two float arrays, relative to the reference's
// largest magnitude (how the sharded-against-serial tests compare gradients).
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

namespace tpcli::testing {

inline double rel_diff(std::span<const float> got, std::span<const float> ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace tpcli::testing
