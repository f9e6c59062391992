#include "nn/swiglu.h"

#include <algorithm>

#include "tensor/vec_math.h"

namespace tpcli::nn {

namespace {
// Sigmoids are computed a chunk at a time into a stack buffer (eight lanes at once, tensor/vec_math.h);
// the products around them are plain loops the compiler vectorizes.
constexpr int64_t CHUNK = 256;
}  // namespace

void swiglu_forward(float* out, const float* h13, int64_t N, int64_t F) {
  float sig[CHUNK];
  for (int64_t n = 0; n < N; ++n) {
    const float* h1 = h13 + n * 2 * F;
    const float* h3 = h1 + F;
    float* o = out + n * F;
    for (int64_t i0 = 0; i0 < F; i0 += CHUNK) {
      const int64_t len = std::min(CHUNK, F - i0);
      tensor::sigmoid(sig, h1 + i0, len);
      for (int64_t i = 0; i < len; ++i) o[i0 + i] = h1[i0 + i] * sig[i] * h3[i0 + i];
    }
  }
}

void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t N, int64_t F) {
  float sig[CHUNK];
  for (int64_t n = 0; n < N; ++n) {
    const float* h1 = h13 + n * 2 * F;
    const float* h3 = h1 + F;
    float* d1 = dh13 + n * 2 * F;
    float* d3 = d1 + F;
    const float* g = dout + n * F;
    for (int64_t i0 = 0; i0 < F; i0 += CHUNK) {
      const int64_t len = std::min(CHUNK, F - i0);
      tensor::sigmoid(sig, h1 + i0, len);
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = i0 + j;
        const float s = sig[j], silu = h1[i] * s;
        d3[i] = g[i] * silu;
        d1[i] = g[i] * h3[i] * s * (1.0f + h1[i] * (1.0f - s));
      }
    }
  }
}

}  // namespace tpcli::nn
