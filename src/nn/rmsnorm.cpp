#include "nn/rmsnorm.h"

#include <cmath>

namespace tpcli::nn {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float* o = out + n * C;
    // Same operation order as llama2.c's rmsnorm, so decode logits match it closely.
    float ss = 0.0f;
    for (int64_t j = 0; j < C; ++j) ss += x[j] * x[j];
    ss /= static_cast<float>(C);
    ss += eps;
    ss = 1.0f / std::sqrt(ss);
    for (int64_t j = 0; j < C; ++j) o[j] = weight[j] * (ss * x[j]);
    if (rstd) rstd[n] = ss;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    const float* g = dout + n * C;
    float* dx = dinp + n * C;
    const float r = rstd[n];
    // out_j = w_j x_j r  =>  dx_j = r w_j g_j - x_j r^3 / C * sum_i g_i w_i x_i
    float dot = 0.0f;
    for (int64_t i = 0; i < C; ++i) dot += g[i] * weight[i] * x[i];
    const float k = r * r * r * dot / static_cast<float>(C);
    for (int64_t j = 0; j < C; ++j) {
      dx[j] += r * weight[j] * g[j] - k * x[j];
      dweight[j] += g[j] * x[j] * r;
    }
  }
}

}  // namespace tpcli::nn
