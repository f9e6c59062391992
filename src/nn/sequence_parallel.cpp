// tpcli::nn — the backward halves of the collective matmuls (legend: sequence_parallel.h).
#include "nn/sequence_parallel.h"

#include <algorithm>
#include <span>

namespace tpcli::nn {

namespace {

// Row counts of every member, in floats: even_split of N rows, W floats a row.
std::vector<int64_t> row_counts(int64_t N, int64_t W, int T) {
  std::vector<int64_t> counts = dist::even_split_counts(N, T);
  for (auto& c : counts) c *= W;
  return counts;
}

}  // namespace

void all_gather_rows(float* out, const float* inp, int64_t N, int64_t W, dist::Group& group) {
  const std::vector<int64_t> counts = row_counts(N, W, group.size());
  const int64_t mine = counts[static_cast<size_t>(group.rank())];
  group.all_gather_v(std::span<const float>(inp, static_cast<size_t>(mine)),
                     std::span<float>(out, static_cast<size_t>(N * W)), counts);
}

void reduce_scatter_rows(float* out, const float* inp, int64_t N, int64_t W, dist::Group& group) {
  const std::vector<int64_t> counts = row_counts(N, W, group.size());
  const int64_t mine = counts[static_cast<size_t>(group.rank())];
  group.reduce_scatter_v(std::span<const float>(inp, static_cast<size_t>(N * W)),
                         std::span<float>(out, static_cast<size_t>(mine)), counts);
}

void all_gather_matmul_backward(float* dinp, const float* dout, const float* inp, int64_t N, AllToShardedLinear& layer,
                                dist::Group& group) {
  const int T = group.size();
  const int64_t IN = layer.in_features();
  const dist::Range mine = dist::even_split(N, T, group.rank());
  std::vector<float> inp_full(static_cast<size_t>(N * IN));      // [N, IN] gathered again (not saved)
  std::vector<float> dinp_partial(static_cast<size_t>(N * IN));  // [N, IN] this member's term of the sum
  std::vector<float> mine_sum(static_cast<size_t>(mine.count * IN));  // [NL, IN]
  if (N % T == 0) {
    // Equal rows (the model's case: seq_len divides by T): the gather of the input runs while the
    // input gradient multiplies, the reduce-scatter of that gradient while the weight gradient does.
    dist::Pending gather = group.start_all_gather({inp, static_cast<size_t>(mine.count * IN)}, inp_full);
    layer.input_gradient(dinp_partial.data(), dout, N, false);
    dist::Pending scatter = group.start_reduce_scatter(dinp_partial, mine_sum);
    gather.wait();
    layer.weight_gradients(dout, inp_full.data(), N);
    scatter.wait();
  } else {
    all_gather_rows(inp_full.data(), inp, N, IN, group);
    layer.input_gradient(dinp_partial.data(), dout, N, false);
    layer.weight_gradients(dout, inp_full.data(), N);
    reduce_scatter_rows(mine_sum.data(), dinp_partial.data(), N, IN, group);
  }
  for (size_t i = 0; i < mine_sum.size(); ++i) dinp[i] += mine_sum[i];
}

void matmul_reduce_scatter_backward(float* dinp, const float* dout, const float* inp, int64_t N,
                                    ShardedToAllLinear& layer, dist::Group& group) {
  const int64_t OUT = layer.out_features();
  std::vector<float> dout_full(static_cast<size_t>(N * OUT));  // [N, OUT] mirrored
  all_gather_rows(dout_full.data(), dout, N, OUT, group);
  layer.backward(dinp, dout_full.data(), inp, N);  // local product: no communication
}

}  // namespace tpcli::nn
