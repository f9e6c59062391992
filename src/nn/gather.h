// tpcli::nn — reassembling full tensors from every device's shard (for saving checkpoints).
//
// Dimension legend: R rows, K columns of the full matrix; ranges[m] = member m's rows (or
// columns). Ranges may overlap (replicated KV heads): overlapping parts are equal by invariant.
#pragma once

#include <vector>

#include "distributed/group.h"
#include "tensor/tensor.h"

namespace tpcli::nn {

// Collective: full[R, K] from each member's local rows ([ranges[rank].count, K]).
tensor::Tensor gather_rows(dist::Group& group, const float* local, const std::vector<dist::Range>& ranges, int64_t R,
                           int64_t K);
// Collective: full[R, K] from each member's local columns ([R, ranges[rank].count]).
tensor::Tensor gather_columns(dist::Group& group, const float* local, const std::vector<dist::Range>& ranges, int64_t R,
                              int64_t K);

}  // namespace tpcli::nn
