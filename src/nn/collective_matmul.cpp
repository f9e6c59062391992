#include "nn/collective_matmul.h"

#include <algorithm>
#include <vector>

namespace tpcli::nn {

namespace {

dist::Perm ring(int T) {
  dist::Perm perm;
  for (int r = 0; r < T; ++r) perm.emplace_back(r, (r + 1) % T);
  return perm;
}

}  // namespace

void all_gather_matmul(float* out, const float* inp, int64_t N, const AllToShardedLinear& layer, dist::Group& group) {
  const int T = group.size(), r = group.rank();
  const int64_t IN = layer.in_features(), OL = layer.out_features(), NP = (N + T - 1) / T;
  std::vector<float> held(static_cast<size_t>(NP * IN), 0.0f), next(held.size());  // [NP, IN] each
  const dist::Range mine = dist::even_split(N, T, r);
  std::copy(inp, inp + mine.count * IN, held.begin());
  const dist::Perm perm = ring(T);
  for (int s = 0; s < T; ++s) {
    const dist::Range chunk = dist::even_split(N, T, (r - s + T) % T);
    // (An asynchronous backend would start this ppermute before the product below.)
    if (s + 1 < T) group.ppermute(held, next, perm);
    if (chunk.count > 0) layer.forward(out + chunk.offset * OL, held.data(), chunk.count);
    if (s + 1 < T) held.swap(next);
  }
}

void matmul_reduce_scatter(float* out, const float* inp, int64_t N, const ShardedToAllLinear& layer, dist::Group& group) {
  const int T = group.size(), r = group.rank();
  const int64_t IL = layer.in_features(), OUT = layer.out_features(), NP = (N + T - 1) / T;
  std::vector<float> acc(static_cast<size_t>(NP * OUT), 0.0f), moved(acc.size()), part(acc.size());  // [NP, OUT]
  auto add_partial = [&](int c) {  // acc += inp[chunk c] @ W_local^T
    const dist::Range chunk = dist::even_split(N, T, c);
    if (chunk.count == 0) return;
    if (IL > 0) {
      layer.local().forward(part.data(), inp + chunk.offset * IL, chunk.count);
      for (int64_t i = 0; i < chunk.count * OUT; ++i) acc[static_cast<size_t>(i)] += part[static_cast<size_t>(i)];
    }
  };
  const dist::Perm perm = ring(T);
  add_partial((r - 1 + T) % T);
  for (int s = 1; s < T; ++s) {
    group.ppermute(acc, moved, perm);
    acc.swap(moved);
    add_partial((r - s - 1 + 2 * T) % T);
  }
  const dist::Range mine = dist::even_split(N, T, r);
  std::copy(acc.begin(), acc.begin() + mine.count * OUT, out);
}

}  // namespace tpcli::nn
