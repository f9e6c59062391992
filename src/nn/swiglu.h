// tpcli::nn — the SwiGLU gate: g = silu(h1) * h3.
//
// Dimension legend: N rows, F hidden features (this device's). h13[N, 2F] holds per row h1 | h3
// (the fused w1|w3 projection output).
#pragma once

#include <cstdint>

namespace tpcli::nn {

// out[N, F] = silu(h1) * h3, silu(x) = x / (1 + exp(-x)) (llama2.c's formula).
void swiglu_forward(float* out, const float* h13, int64_t N, int64_t F);
// dh13[N, 2F] = the gradient of out with respect to h13 (overwritten: no zero-fill needed)
void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t N, int64_t F);

}  // namespace tpcli::nn
