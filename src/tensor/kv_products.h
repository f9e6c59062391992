// tpcli::tensor — the two products attention takes over a KV cache's rows, for one query row (a
// decode step) or many (a prompt's rows, a step's chunk) at once, with the same float sequence
// whatever the count, the instruction set or the element type:
//
//   dots:          scores[r, j] = (q_r . row_j) / divisor, where lane l in 0..15 sums
//                  fma(q_r[i], row_j[i], acc_l) over i = l, l + 16, l + 32, ... in order, and the
//                  lanes then add pairwise (l, l + 8), (l, l + 4), (l, l + 2), (l, l + 1);
//   weighted sums: y_r[i] = fma(a_r[j], row_j[i], y_r[i]) for j = 0..n-1 in order (each element
//                  its own chain).
//
// So a query row's scores and output depend on its own q, weights and the rows' stored bits only:
// prefilling a prompt in one call, in chunks, or token by token gives the same bits. 16-bit rows
// (bf16, f16) are widened to f32 exactly as they are read.
//
// Dimension legend: R query rows, n cache rows, L elements per row (the head size), stride:
// elements from one cache row to the next.
#pragma once

#include <cstdint>

#include "tensor/isa.h"

namespace tpcli::tensor {

enum class KvElement { F32, BF16, F16 };

// n rows of L elements of `element`, `stride` elements apart, from `data`.
struct KvRows {
  const void* data = nullptr;
  KvElement element = KvElement::F32;
  int64_t n = 0, stride = 0, len = 0;
};

// scores[r * ld + j] for r < R, j < rows.n; query row r at q + r * ldq.
void kv_dots(float* scores, int64_t ld, const float* q, int64_t ldq, int64_t R, const KvRows& rows, float divisor,
             Isa isa = detected_isa());
// y[r * ldy + i] (i < rows.len) continues its chains over rows j < rows.n, weights a[r * lda + j].
void kv_weighted_sums(float* y, int64_t ldy, const float* a, int64_t lda, int64_t R, const KvRows& rows,
                      Isa isa = detected_isa());

namespace kernels {
struct KvKernels {
  decltype(&kv_dots) dots = nullptr;  // the isa argument ignored
  decltype(&kv_weighted_sums) weighted_sums = nullptr;
};
KvKernels avx512_kv_kernels();  // empty where the build or CPU has none
KvKernels avx2_kv_kernels();
}  // namespace kernels

}  // namespace tpcli::tensor
