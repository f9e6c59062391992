// tpcli::nn — JAX's collective matmuls: a sharded linear fused with the collective that feeds or
// follows it, done as a ring of ppermutes so each step's transfer can overlap the next product.
//
// Dimension legend: N rows (dealt out over the T members of the group by dist::even_split: member
// m holds rows chunk m, NL = its count, NP = ceil(N/T) the padded chunk), IN, OUT features;
// *_local = this device's shard.
//
//   all_gather_matmul:     out[N, OUT_local] = all_gather(inp[NL, IN]) @ W_local^T
//                          (plain form: all_gather_v, then AllToShardedLinear::forward)
//   matmul_reduce_scatter: out[NL, OUT] = chunk `rank` of sum over members of inp[N, IN_local] @ W_local^T
//                          (plain form: ShardedToAll's product, then reduce_scatter instead of all_sum)
// Ring: T steps; at step s member r multiplies the chunk of member (r - s) mod T (all-gather) or
// accumulates the partial of chunk (r - s - 1) mod T (reduce-scatter), and ppermutes r -> r + 1.
// Chunks travel padded to NP rows (ppermute moves equal sizes). With the thread backend ppermute
// is synchronous, so the overlap is in the structure only; the results equal the plain forms.
#pragma once

#include <cstdint>

#include "dist/group.h"
#include "nn/linear.h"

namespace tpcli::nn {

void all_gather_matmul(float* out, const float* inp, int64_t N, const AllToShardedLinear& layer, dist::Group& group);
void matmul_reduce_scatter(float* out, const float* inp, int64_t N, const ShardedToAllLinear& layer, dist::Group& group);

}  // namespace tpcli::nn
