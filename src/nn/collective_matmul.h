// tpcli::nn — JAX's collective matmuls: a sharded linear fused with the collective that feeds or
// follows it, done as a ring of ppermutes so each step's transfer overlaps the step's product.
//
// Dimension legend: N rows (dealt out over the T members of the group by dist::even_split: member
// m holds rows chunk m, NL = its count, NP = ceil(N/T) the padded chunk), IN, OUT features;
// *_local = this device's shard.
//
//   all_gather_matmul:     out[N, OUT_local] = all_gather(inp[NL, IN]) @ W_local^T
//                          (plain form: all_gather_v, then AllToShardedLinear::forward)
//   all_gather_contracting_matmul (JAX's example, A[B, D@model] @ W[D, F@model]):
//                          out[N, OUT_local] = all_gather over columns of inp[N, INC] @ W_local^T,
//                          where member m holds columns chunk m of the input (INC = its count)
//   matmul_reduce_scatter: out[NL, OUT] = chunk `rank` of sum over members of inp[N, IN_local] @ W_local^T
//                          (plain form: ShardedToAll's product, then reduce_scatter instead of all_sum)
// One way (Ring::OneWay): T steps; at step s member r multiplies the chunk of member (r - s) mod T
// (all-gather) or adds the partial of chunk (r - s - 1) mod T (reduce-scatter) while the next chunk
// moves r -> r + 1 on a started (asynchronous) ppermute.
// Contracting: at step s member r holds input columns chunk (r - s) mod T and adds their product
// with the matching columns of W_local into out, while that block moves on to r + 1: each chunk's
// product packs only its own columns of W, so the chunks together cost what the one product does.
// Both ways (Ring::TwoWay, JAX's bidirectional variant): every chunk is cut into a top and a bottom
// half (NH = ceil(NP/2) rows); top halves travel r -> r + 1 and bottom halves r -> r - 1 at the
// same time, so each step moves half as much over each direction of the link.
// Chunks travel padded to NP rows (ppermute moves equal sizes). The results equal the plain forms.
#pragma once

#include <cstdint>

#include "distributed/group.h"
#include "nn/linear.h"

namespace tpcli::nn {

enum class Ring { OneWay, TwoWay };

void all_gather_matmul(float* out, const float* inp, int64_t N, const AllToShardedLinear& layer, dist::Group& group,
                       Ring ring = Ring::OneWay);
void all_gather_contracting_matmul(float* out, const float* inp, int64_t N, const AllToShardedLinear& layer,
                                   dist::Group& group);
void matmul_reduce_scatter(float* out, const float* inp, int64_t N, const ShardedToAllLinear& layer,
                           dist::Group& group, Ring ring = Ring::OneWay);

}  // namespace tpcli::nn
