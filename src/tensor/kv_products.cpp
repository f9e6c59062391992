// The plain C++ KV products (the sequence tensor/kv_products.h defines, written out element by
// element: the reference the SIMD sets are tested against) and the choice of set.
#include "tensor/kv_products.h"

#include <cmath>
#include <cstring>

#include "tensor/quant_formats.h"

namespace tpcli::tensor {

namespace {

float element(const KvRows& rows, int64_t j, int64_t i) {
  const int64_t at = j * rows.stride + i;
  if (rows.element == KvElement::F32) return static_cast<const float*>(rows.data)[at];
  const uint16_t h = static_cast<const uint16_t*>(rows.data)[at];
  return rows.element == KvElement::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

float lane_dot(const float* q, const KvRows& rows, int64_t j) {
  float lane[16] = {};
  for (int64_t i = 0; i < rows.len; ++i) lane[i % 16] = std::fma(q[i], element(rows, j, i), lane[i % 16]);
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lane[l] += lane[l + half];
  return lane[0];
}

void scalar_dots(float* scores, int64_t ld, const float* q, int64_t ldq, int64_t R, const KvRows& rows, float divisor, Isa) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < rows.n; ++j) scores[r * ld + j] = lane_dot(q + r * ldq, rows, j) / divisor;
}

void scalar_weighted_sums(float* y, int64_t ldy, const float* a, int64_t lda, int64_t R, const KvRows& rows, Isa) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < rows.n; ++j)
      for (int64_t i = 0; i < rows.len; ++i) y[r * ldy + i] = std::fma(a[r * lda + j], element(rows, j, i), y[r * ldy + i]);
}

kernels::KvKernels kernels_for(Isa isa) {
  kernels::KvKernels k;
  if (isa == Isa::Avx512) k = kernels::avx512_kv_kernels();
  if (!k.dots && isa != Isa::Scalar) k = kernels::avx2_kv_kernels();
  if (!k.dots) k = {scalar_dots, scalar_weighted_sums};
  return k;
}

}  // namespace

void kv_dots(float* scores, int64_t ld, const float* q, int64_t ldq, int64_t R, const KvRows& rows, float divisor, Isa isa) {
  if (R > 0 && rows.n > 0) kernels_for(isa).dots(scores, ld, q, ldq, R, rows, divisor, isa);
}

void kv_weighted_sums(float* y, int64_t ldy, const float* a, int64_t lda, int64_t R, const KvRows& rows, Isa isa) {
  if (R > 0 && rows.n > 0) kernels_for(isa).weighted_sums(y, ldy, a, lda, R, rows, isa);
}

}  // namespace tpcli::tensor
