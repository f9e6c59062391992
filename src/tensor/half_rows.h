// tpcli::tensor — rows of 16-bit floats (bf16, f16) read as f32, one element at a time: the kernels
// behind a 16-bit KV cache (nn/attention.h), one set per instruction set.
//
// Dimension legend: N rows, L elements per row, stride: elements from one row to the next.
//
// Every set computes exactly this float sequence, so the plain C++, AVX2 and AVX-512 kernels give
// bit-identical outputs (TPCLI_ISA changes no token):
//   dots:   out[j] = sum_j / divisor, where lane l in 0..15 sums fma(x[i], row_j[i], acc_l) over
//           i = l, l + 16, l + 32, ... in order, then lanes add pairwise (l, l + 8), (l, l + 4),
//           (l, l + 2), (l, l + 1);
//   weighted_sum: y[i] = fma(a[j], row_j[i], y[i]) for j = 0..N-1 in order (each i its own chain).
// Converting bf16 or f16 to f32 is exact, so a row's result depends on its stored bits alone.
#pragma once

#include <cstdint>

#include "tensor/isa.h"

namespace tpcli::tensor {

enum class HalfKind { BF16, F16 };

struct HalfKernel {
  // out[N] = (x[L] . rows[j][L]) / divisor, the lanes as above.
  void (*dots)(float* out, const float* x, const uint16_t* rows, int64_t n, int64_t stride, int64_t len, float divisor) = nullptr;
  // y[L] += a[j] * rows[j][L] for j in 0..N-1, one fma per element, in row order.
  void (*weighted_sum)(float* y, const float* a, const uint16_t* rows, int64_t n, int64_t stride, int64_t len) = nullptr;
};

// nullptr members when the instruction set has no kernel (the caller falls back to the next one
// down); the scalar set covers both kinds.
HalfKernel scalar_half_kernel(HalfKind kind);
HalfKernel avx2_half_kernel(HalfKind kind);
HalfKernel avx512_half_kernel(HalfKind kind);
// The kernel of the highest set at or below `isa`.
HalfKernel half_kernel_for(HalfKind kind, Isa isa);
// half_kernel_for(kind, detected_isa()), chosen once.
const HalfKernel& half_kernel(HalfKind kind);

// out[n] = in[n] rounded to nearest even (tensor/quant_formats.h's f32_to_bf16 / f32_to_f16).
void f32_to_half(uint16_t* out, const float* in, int64_t n, HalfKind kind);
// out[n] = in[n] widened (exact).
void half_to_f32(float* out, const uint16_t* in, int64_t n, HalfKind kind);

}  // namespace tpcli::tensor
