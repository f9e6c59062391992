// tpcli::nn — sequence parallelism (Megatron-LM's, with JAX's collective matmuls): between the
// tensor-parallel linears the N token rows are split over the tensor group instead of mirrored.
//
// Dimension legend: N rows (B*T tokens), dealt out over the T members of the group by
// dist::even_split (member m holds rows chunk m, NL = its count); IN, OUT features;
// W rows width; *_local = this device's shard.
//
// Layout transitions (forward in nn/collective_matmul.h; backward here, each the other's transpose):
//   all_gather_matmul       split [NL, IN] -> sharded [N, OUT_local]
//     backward:             dW_local += dout^T @ all_gather(inp)   (inp gathered again, not saved)
//                           dinp[NL, IN] += reduce_scatter(dout @ W_local)   (the gather's transpose)
//   matmul_reduce_scatter   sharded [N, IN_local] -> split [NL, OUT]
//     backward:             dout_full = all_gather(dout[NL, OUT])            (the scatter's transpose)
//                           dinp[N, IN_local] += dout_full @ W_local; dW_local += dout_full^T @ inp
// all_gather_matmul's backward overlaps both of its collectives when N divides by T (the model's
// case): the gather with the input-gradient product, the reduce-scatter with the weight gradient.
// Both backwards are collectives: every member calls them, with the same N.
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/group.h"
#include "nn/linear.h"

namespace tpcli::nn {

// out[N, W] (mirrored) = every member's rows inp[NL, W] in member order (all_gather_v by rows).
void all_gather_rows(float* out, const float* inp, int64_t N, int64_t W, dist::Group& group);
// out[NL, W] = this member's rows of the sum over members of inp[N, W] (reduce_scatter_v by rows).
void reduce_scatter_rows(float* out, const float* inp, int64_t N, int64_t W, dist::Group& group);

// Backward of all_gather_matmul: dinp[NL, IN] += ..., layer's dW_local += ... (see above).
// dout: [N, OUT_local]; inp: this member's rows [NL, IN] as given to the forward.
void all_gather_matmul_backward(float* dinp, const float* dout, const float* inp, int64_t N, AllToShardedLinear& layer,
                                dist::Group& group);
// Backward of matmul_reduce_scatter: dinp[N, IN_local] += ..., layer's dW_local += ....
// dout: this member's rows [NL, OUT]; inp: [N, IN_local] as given to the forward.
void matmul_reduce_scatter_backward(float* dinp, const float* dout, const float* inp, int64_t N,
                                    ShardedToAllLinear& layer, dist::Group& group);

}  // namespace tpcli::nn
