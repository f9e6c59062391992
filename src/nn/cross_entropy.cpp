#include "nn/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/vec_math.h"

namespace tpcli::nn {

int64_t counted_targets(const int* targets, int64_t N) {
  int64_t counted = 0;
  for (int64_t n = 0; n < N; ++n) counted += targets[n] != IGNORED_TARGET ? 1 : 0;
  return counted;
}

float cross_entropy_forward(float* losses, float* probs, const float* logits, const int* targets, int64_t v0,
                            int64_t N, int64_t VL, dist::Group& group) {
  std::vector<float> row_max(static_cast<size_t>(N), -std::numeric_limits<float>::infinity());  // [N]
  for (int64_t n = 0; n < N; ++n)
    if (VL > 0) row_max[n] = tensor::max_of(logits + n * VL, VL);
  group.all_max(row_max);
  std::vector<float> sums(static_cast<size_t>(2 * N), 0.0f);  // [2, N]: exp-sums, target logits
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = targets[n] - v0;  // read before probs (which may alias logits) is written
    if (t >= 0 && t < VL) sums[N + n] = logits[n * VL + t] - row_max[n];
    sums[n] = tensor::exp_sum(probs + n * VL, logits + n * VL, VL, 1.0f, row_max[n]);  // eight lanes at a time
  }
  group.all_sum(sums);
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float inv = 1.0f / sums[n];
    for (int64_t v = 0; v < VL; ++v) probs[n * VL + v] *= inv;
    losses[n] = targets[n] == IGNORED_TARGET ? 0.0f : logf(sums[n]) - sums[N + n];
    total += losses[n];
  }
  const int64_t counted = counted_targets(targets, N);
  return counted > 0 ? static_cast<float>(total / static_cast<double>(counted)) : 0.0f;
}

void cross_entropy_backward(float* dlogits, const float* probs, const int* targets, int64_t v0, int64_t N, int64_t VL,
                            float dloss) {
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == IGNORED_TARGET) continue;
    float* d = dlogits + n * VL;
    const float* p = probs + n * VL;
    for (int64_t v = 0; v < VL; ++v) d[v] += dloss * p[v];
    const int64_t t = targets[n] - v0;
    if (t >= 0 && t < VL) d[t] -= dloss;
  }
}

}  // namespace tpcli::nn
