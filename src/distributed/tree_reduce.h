// tpcli::dist — the order in which a backend combines the members' contributions to an all_sum
// (and all_max): a balanced binary tree over the members in rank order, the first half's result
// op the second half's, recursively (an odd count gives the extra member to the second half). A
// running sum ((s0 + s1) + s2) + s3 adds in another order than a model that sums four leaves as
// (l0 + l1) + (l2 + l3); with the tree, a sum whose leaves are split over 1, 2, 4 or 8 devices in
// whole subtrees gives the same bits on every count. Every member computes the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tpcli::dist {

namespace detail {

constexpr int64_t TREE_BLOCK = 1024;  // floats of one block of every subtree's partial result (4 KB)

// acc[0, n) = parts[lo..hi) at `at`, combined as the tree.
template <class Op>
void tree_block(float* acc, const float* const* parts, int lo, int hi, int64_t at, int64_t n, Op op) {
  if (hi - lo == 1) {
    std::memcpy(acc, parts[lo] + at, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (hi - lo == 2) {
    const float *a = parts[lo] + at, *b = parts[lo + 1] + at;
    for (int64_t i = 0; i < n; ++i) acc[i] = op(a[i], b[i]);
    return;
  }
  const int mid = lo + (hi - lo) / 2;
  alignas(64) float right[TREE_BLOCK];
  tree_block(acc, parts, lo, mid, at, n, op);
  tree_block(right, parts, mid, hi, at, n, op);
  for (int64_t i = 0; i < n; ++i) acc[i] = op(acc[i], right[i]);
}

}  // namespace detail

// out[0, n) = parts[0..S)[off + i] combined as the tree. out may be one of the parts.
template <class Op>
void tree_reduce(float* out, const float* const* parts, int S, int64_t off, int64_t n, Op op) {
  alignas(64) float acc[detail::TREE_BLOCK];
  for (int64_t b = 0; b < n; b += detail::TREE_BLOCK) {
    const int64_t len = std::min(detail::TREE_BLOCK, n - b);
    detail::tree_block(acc, parts, 0, S, off + b, len, op);
    std::memcpy(out + b, acc, static_cast<size_t>(len) * sizeof(float));
  }
}

}  // namespace tpcli::dist
