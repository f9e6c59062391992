#include "nn/swiglu.h"

#include <cmath>

namespace tpcli::nn {

void swiglu_forward(float* out, const float* h13, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n) {
    const float* h1 = h13 + n * 2 * F;
    const float* h3 = h1 + F;
    float* o = out + n * F;
    for (int64_t i = 0; i < F; ++i) {
      float val = h1[i];
      val *= (1.0f / (1.0f + expf(-val)));
      val *= h3[i];
      o[i] = val;
    }
  }
}

void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n) {
    const float* h1 = h13 + n * 2 * F;
    const float* h3 = h1 + F;
    float* d1 = dh13 + n * 2 * F;
    float* d3 = d1 + F;
    const float* g = dout + n * F;
    for (int64_t i = 0; i < F; ++i) {
      const float sig = 1.0f / (1.0f + expf(-h1[i]));
      const float silu = h1[i] * sig;
      d3[i] += g[i] * silu;
      d1[i] += g[i] * h3[i] * sig * (1.0f + h1[i] * (1.0f - sig));
    }
  }
}

}  // namespace tpcli::nn
