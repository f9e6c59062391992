// tpcli::nn — RMSNorm (llama2.c's rmsnorm, with backward).
//
// Dimension legend: N rows, C channels.
#pragma once

#include <cstdint>

namespace tpcli::nn {

// out[N, C] = weight[C] * inp[N, C] * rstd[N], rstd = 1 / sqrt(mean(inp^2) + eps). Saves rstd[N].
// out may alias inp.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps);
// dinp[N, C] += ..., dweight[C] += ... (given the forward's inp and rstd).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C);

}  // namespace tpcli::nn
