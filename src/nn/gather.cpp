#include "nn/gather.h"

#include <algorithm>
#include <cstdint>

namespace tpcli::nn {

namespace {

// all_gather_v of every member's block of per_member[m] floats; returns the concatenation.
std::vector<float> gather_blocks(dist::Group& group, const float* local, const std::vector<int64_t>& per_member) {
  int64_t total = 0;
  for (int64_t c : per_member) total += c;
  std::vector<float> all(static_cast<size_t>(total));
  const int64_t mine = per_member[static_cast<size_t>(group.rank())];
  group.all_gather_v(std::span<const float>(local, static_cast<size_t>(mine)), all, per_member);
  return all;
}

}  // namespace

tensor::Tensor gather_rows(dist::Group& group, const float* local, const std::vector<dist::Range>& ranges, int64_t R,
                           int64_t K) {
  std::vector<int64_t> counts;
  for (auto r : ranges) counts.push_back(r.count * K);
  std::vector<float> all = gather_blocks(group, local, counts);
  tensor::Tensor full({R, K});
  int64_t at = 0;
  for (auto r : ranges) {
    std::copy(all.begin() + at, all.begin() + at + r.count * K, full.data() + r.offset * K);
    at += r.count * K;
  }
  return full;
}

tensor::Tensor gather_columns(dist::Group& group, const float* local, const std::vector<dist::Range>& ranges, int64_t R,
                              int64_t K) {
  std::vector<int64_t> counts;
  for (auto r : ranges) counts.push_back(r.count * R);
  std::vector<float> all = gather_blocks(group, local, counts);
  tensor::Tensor full({R, K});
  int64_t at = 0;
  for (auto r : ranges) {
    for (int64_t i = 0; i < R; ++i)
      std::copy(all.begin() + at + i * r.count, all.begin() + at + (i + 1) * r.count, full.data() + i * K + r.offset);
    at += r.count * R;
  }
  return full;
}

}  // namespace tpcli::nn
