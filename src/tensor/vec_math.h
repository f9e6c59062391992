// tpcli::tensor — exp and sigmoid over arrays, eight floats at a time (training's kernels).
//
// libm's expf is a call per element, so every loop around it stays scalar; a training step calls
// it ~30M times (attention softmaxes, SwiGLU forward and backward, cross-entropy). These do the
// same in AVX2 registers: Cephes' expf (range reduction by ln2 in two parts, a degree-5
// polynomial, 2^k put back in the exponent bits), within 2 ulp of expf, arguments clamped to
// [-87, 88] (no denormals, no overflow). Builds without AVX2 run the same formula one float at a
// time. SwiGLU uses them in inference too (the golden llama2.c outputs still match); the
// inference softmaxes (attention_decode, attention_cached) keep libm's expf, llama2.c's order.
#pragma once

#include <cstdint>

namespace tpcli::tensor {

// e^x of one float, the formula of the array versions.
float exp_approx(float x);

// out[i] = e^(in[i] * scale - shift), i < n; returns their sum. out may be in.
float exp_sum(float* out, const float* in, int64_t n, float scale, float shift);

// max(in[0..n)), n >= 1.
float max_of(const float* in, int64_t n);

// out[i] = 1 / (1 + e^-in[i]), i < n. out may be in.
void sigmoid(float* out, const float* in, int64_t n);

// sum of in[i]^2 in double (four lanes, then added), i < n: the gradient norm's pass over every
// parameter, which a scalar double sum leaves one element per cycle.
double sum_of_squares(const float* in, int64_t n);

}  // namespace tpcli::tensor
