// AVX-512 and AVX2 KV products (tensor/kv_products.h): the same float sequence as the plain C++
// set, many (query row, cache row) pairs a step. Dots: a register tile of 4 query rows x 4 cache
// rows (one query row: 16 cache rows), each pair one 16-lane chain, the tile's sums reduced sixteen
// at a time (x86_sums.h). Weighted sums: 4 query rows x 4 chunks of 16 elements, each cache row
// chunk loaded once for the 4 rows. Lanes past the row's length are masked: loaded as zero and
// never added into a chain.
// gcc 12's false positive inside its own AVX-512 intrinsics (as in packed_kernels_x86.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>

#include "tensor/kv_products.h"
#include "tensor/x86_sums.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TPCLI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define TPCLI_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace tpcli::tensor::kernels {

#if defined(__x86_64__)

namespace {

// ---- AVX-512 ----

TPCLI_AVX512 __mmask16 lanes_below(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// Elements [at, at + 16) of a cache row widened to f32, the lanes outside m zero.
template <KvElement E>
TPCLI_AVX512 __m512 load16(const void* data, int64_t at, __mmask16 m) {
  if constexpr (E == KvElement::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(data) + at);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(data) + at);
    if constexpr (E == KvElement::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  }
}

// scores for query rows [r0, r0 + RT) x cache rows [j0, j0 + JT).
template <KvElement E, int RT, int JT>
TPCLI_AVX512 void dots_tile(float* scores, int64_t ld, const float* q, int64_t ldq, const KvRows& rows, float divisor,
                            int64_t r0, int64_t j0) {
  __m512 acc[RT * JT];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t c = 0; c < rows.len; c += 16) {
    const __mmask16 m = lanes_below(rows.len - c);
    __m512 qv[RT];
    for (int r = 0; r < RT; ++r) qv[r] = _mm512_maskz_loadu_ps(m, q + (r0 + r) * ldq + c);
    for (int j = 0; j < JT; ++j) {
      const __m512 k = load16<E>(rows.data, (j0 + j) * rows.stride + c, m);
      for (int r = 0; r < RT; ++r) acc[r * JT + j] = _mm512_mask3_fmadd_ps(qv[r], k, acc[r * JT + j], m);
    }
  }
  static_assert(RT * JT <= 16);
  __m512 all[16];
  for (int t = 0; t < 16; ++t) all[t] = t < RT * JT ? acc[t] : _mm512_setzero_ps();
  const __m512 sums = _mm512_div_ps(sums16_512(all), _mm512_set1_ps(divisor));  // lane r * JT + j
  if constexpr (JT == 16 || JT == 4) {
    // Query row r's JT scores are lanes [r * JT, r * JT + JT): one masked store each, from an address
    // r * JT floats before the row's first (still inside scores: ld >= JT).
    for (int r = 0; r < RT; ++r) _mm512_mask_storeu_ps(scores + (r0 + r) * ld + j0 - r * JT, __mmask16(((1u << JT) - 1) << (r * JT)), sums);
  } else {
    float each[16];
    _mm512_storeu_ps(each, sums);
    for (int r = 0; r < RT; ++r)
      for (int j = 0; j < JT; ++j) scores[(r0 + r) * ld + j0 + j] = each[r * JT + j];
  }
}

// Query rows [r0, r0 + RT) over every cache row: JT at a time, then one at a time.
template <KvElement E, int RT, int JT>
TPCLI_AVX512 void dots_rows(float* scores, int64_t ld, const float* q, int64_t ldq, const KvRows& rows, float divisor, int64_t r0) {
  int64_t j = 0;
  for (; j + JT <= rows.n; j += JT) dots_tile<E, RT, JT>(scores, ld, q, ldq, rows, divisor, r0, j);
  for (; j < rows.n; ++j) dots_tile<E, RT, 1>(scores, ld, q, ldq, rows, divisor, r0, j);
}

template <KvElement E>
TPCLI_AVX512 void dots_512(float* scores, int64_t ld, const float* q, int64_t ldq, int64_t R, const KvRows& rows, float divisor) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) dots_rows<E, 4, 4>(scores, ld, q, ldq, rows, divisor, r);
  for (; r < R; ++r) dots_rows<E, 1, 16>(scores, ld, q, ldq, rows, divisor, r);
}

// y rows [r0, r0 + RT), elements [c0, c0 + 16 * CT) (the lanes past len masked), over every cache row.
template <KvElement E, int RT, int CT>
TPCLI_AVX512 void sums_tile(float* y, int64_t ldy, const float* a, int64_t lda, const KvRows& rows, int64_t r0, int64_t c0) {
  __mmask16 m[CT];
  for (int c = 0; c < CT; ++c) m[c] = lanes_below(rows.len - c0 - 16 * c);
  __m512 acc[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm512_maskz_loadu_ps(m[c], y + (r0 + r) * ldy + c0 + 16 * c);
  for (int64_t j = 0; j < rows.n; ++j) {
    __m512 v[CT];
    for (int c = 0; c < CT; ++c) v[c] = load16<E>(rows.data, j * rows.stride + c0 + 16 * c, m[c]);
    for (int r = 0; r < RT; ++r) {
      const __m512 w = _mm512_set1_ps(a[(r0 + r) * lda + j]);
      for (int c = 0; c < CT; ++c) acc[r][c] = _mm512_fmadd_ps(w, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + c0 + 16 * c, m[c], acc[r][c]);
}

template <KvElement E, int RT>
TPCLI_AVX512 void sums_rows(float* y, int64_t ldy, const float* a, int64_t lda, const KvRows& rows, int64_t r0) {
  int64_t c = 0;
  for (; c + 64 <= rows.len; c += 64) sums_tile<E, RT, 4>(y, ldy, a, lda, rows, r0, c);
  for (; c < rows.len; c += 16) sums_tile<E, RT, 1>(y, ldy, a, lda, rows, r0, c);
}

template <KvElement E>
TPCLI_AVX512 void weighted_sums_512(float* y, int64_t ldy, const float* a, int64_t lda, int64_t R, const KvRows& rows) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) sums_rows<E, 4>(y, ldy, a, lda, rows, r);
  for (; r < R; ++r) sums_rows<E, 1>(y, ldy, a, lda, rows, r);
}

void kv_dots_512(float* scores, int64_t ld, const float* q, int64_t ldq, int64_t R, const KvRows& rows, float divisor, Isa) {
  switch (rows.element) {
    case KvElement::F32: return dots_512<KvElement::F32>(scores, ld, q, ldq, R, rows, divisor);
    case KvElement::BF16: return dots_512<KvElement::BF16>(scores, ld, q, ldq, R, rows, divisor);
    case KvElement::F16: return dots_512<KvElement::F16>(scores, ld, q, ldq, R, rows, divisor);
  }
}

void kv_weighted_sums_512(float* y, int64_t ldy, const float* a, int64_t lda, int64_t R, const KvRows& rows, Isa) {
  switch (rows.element) {
    case KvElement::F32: return weighted_sums_512<KvElement::F32>(y, ldy, a, lda, R, rows);
    case KvElement::BF16: return weighted_sums_512<KvElement::BF16>(y, ldy, a, lda, R, rows);
    case KvElement::F16: return weighted_sums_512<KvElement::F16>(y, ldy, a, lda, R, rows);
  }
}

}  // namespace

KvKernels avx512_kv_kernels() { return {kv_dots_512, kv_weighted_sums_512}; }

#else

KvKernels avx512_kv_kernels() { return {}; }

#endif

KvKernels avx2_kv_kernels() { return {}; }

}  // namespace tpcli::tensor::kernels
