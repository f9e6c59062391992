// AVX2 and AVX-512 kernels for rows of bf16 / f16 (half_rows.h states the float sequence; these
// compute exactly it). Lanes of `dots` are 16 consecutive elements: one zmm, or two ymm (lanes
// 0-7, 8-15); `weighted_sum` runs each element's chain in its own lane. Built with
// -ffp-contract=off: every fused multiply-add is an explicit one.
#include "tensor/half_rows.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>

#include "tensor/quant_formats.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // gcc 12's false positive in avx512fintrin.h's casts
#define TPCLI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TPCLI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define TPCLI_INLINE inline __attribute__((always_inline))
#endif

namespace tpcli::tensor {

#if defined(__x86_64__)

namespace {

constexpr int64_t LANES = 16;

template <HalfKind Kind>
float widen(uint16_t bits) {
  if constexpr (Kind == HalfKind::BF16) return bf16_to_f32(bits);
  else return f16_to_f32(bits);
}

// The scalar chains of weighted_sum for the elements [i, len) no vector covers.
template <HalfKind Kind>
void weighted_sum_tail(float* y, const float* a, const uint16_t* rows, int64_t n, int64_t stride, int64_t i, int64_t len) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t e = i; e < len; ++e) y[e] = std::fma(a[j], widen<Kind>(rows[j * stride + e]), y[e]);
}

// ---- AVX2 ----

template <HalfKind Kind>
TPCLI_AVX2 TPCLI_INLINE __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (Kind == HalfKind::BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  else return _mm256_cvtph_ps(h);
}

// Lanes 0-7 (l + l + 4, ...) of the tree in half_rows.h, given t[l] = acc[l] + acc[l + 8].
TPCLI_AVX2 TPCLI_INLINE float reduce8(__m256 t) {
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

template <HalfKind Kind>
TPCLI_AVX2 void avx2_dots(float* out, const float* x, const uint16_t* rows, int64_t n, int64_t stride, int64_t len,
                          float divisor) {
  if (len % LANES != 0) return scalar_half_kernel(Kind).dots(out, x, rows, n, stride, len, divisor);
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = rows + j * stride;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < len; i += LANES) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8<Kind>(row + i), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load8<Kind>(row + i + 8), hi);
    }
    out[j] = reduce8(_mm256_add_ps(lo, hi)) / divisor;
  }
}

template <HalfKind Kind>
TPCLI_AVX2 void avx2_weighted_sum(float* y, const float* a, const uint16_t* rows, int64_t n, int64_t stride, int64_t len) {
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {  // four vectors of y stay in registers over all the rows
    __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8), y2 = _mm256_loadu_ps(y + i + 16),
           y3 = _mm256_loadu_ps(y + i + 24);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 aj = _mm256_set1_ps(a[j]);
      const uint16_t* row = rows + j * stride + i;
      y0 = _mm256_fmadd_ps(aj, load8<Kind>(row), y0);
      y1 = _mm256_fmadd_ps(aj, load8<Kind>(row + 8), y1);
      y2 = _mm256_fmadd_ps(aj, load8<Kind>(row + 16), y2);
      y3 = _mm256_fmadd_ps(aj, load8<Kind>(row + 24), y3);
    }
    _mm256_storeu_ps(y + i, y0);
    _mm256_storeu_ps(y + i + 8, y1);
    _mm256_storeu_ps(y + i + 16, y2);
    _mm256_storeu_ps(y + i + 24, y3);
  }
  for (; i + 8 <= len; i += 8) {
    __m256 y0 = _mm256_loadu_ps(y + i);
    for (int64_t j = 0; j < n; ++j) y0 = _mm256_fmadd_ps(_mm256_set1_ps(a[j]), load8<Kind>(rows + j * stride + i), y0);
    _mm256_storeu_ps(y + i, y0);
  }
  weighted_sum_tail<Kind>(y, a, rows, n, stride, i, len);
}

// ---- AVX-512 ----

template <HalfKind Kind>
TPCLI_AVX512 TPCLI_INLINE __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (Kind == HalfKind::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  else return _mm512_cvtph_ps(h);
}

template <HalfKind Kind>
TPCLI_AVX512 void avx512_dots(float* out, const float* x, const uint16_t* rows, int64_t n, int64_t stride, int64_t len,
                              float divisor) {
  if (len % LANES != 0) return scalar_half_kernel(Kind).dots(out, x, rows, n, stride, len, divisor);
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = rows + j * stride;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < len; i += LANES) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load16<Kind>(row + i), acc);
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    out[j] = reduce8(t) / divisor;
  }
}

template <HalfKind Kind>
TPCLI_AVX512 void avx512_weighted_sum(float* y, const float* a, const uint16_t* rows, int64_t n, int64_t stride, int64_t len) {
  int64_t i = 0;
  for (; i + 64 <= len; i += 64) {  // four vectors of y stay in registers over all the rows
    __m512 y0 = _mm512_loadu_ps(y + i), y1 = _mm512_loadu_ps(y + i + 16), y2 = _mm512_loadu_ps(y + i + 32),
           y3 = _mm512_loadu_ps(y + i + 48);
    for (int64_t j = 0; j < n; ++j) {
      const __m512 aj = _mm512_set1_ps(a[j]);
      const uint16_t* row = rows + j * stride + i;
      y0 = _mm512_fmadd_ps(aj, load16<Kind>(row), y0);
      y1 = _mm512_fmadd_ps(aj, load16<Kind>(row + 16), y1);
      y2 = _mm512_fmadd_ps(aj, load16<Kind>(row + 32), y2);
      y3 = _mm512_fmadd_ps(aj, load16<Kind>(row + 48), y3);
    }
    _mm512_storeu_ps(y + i, y0);
    _mm512_storeu_ps(y + i + 16, y1);
    _mm512_storeu_ps(y + i + 32, y2);
    _mm512_storeu_ps(y + i + 48, y3);
  }
  for (; i + 16 <= len; i += 16) {
    __m512 y0 = _mm512_loadu_ps(y + i);
    for (int64_t j = 0; j < n; ++j) y0 = _mm512_fmadd_ps(_mm512_set1_ps(a[j]), load16<Kind>(rows + j * stride + i), y0);
    _mm512_storeu_ps(y + i, y0);
  }
  weighted_sum_tail<Kind>(y, a, rows, n, stride, i, len);
}

bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"); }
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"); }

}  // namespace

HalfKernel avx2_half_kernel(HalfKind kind) {
  if (!cpu_has_avx2()) return {};
  if (kind == HalfKind::BF16) return {avx2_dots<HalfKind::BF16>, avx2_weighted_sum<HalfKind::BF16>};
  return {avx2_dots<HalfKind::F16>, avx2_weighted_sum<HalfKind::F16>};
}

HalfKernel avx512_half_kernel(HalfKind kind) {
  if (!cpu_has_avx512()) return {};
  if (kind == HalfKind::BF16) return {avx512_dots<HalfKind::BF16>, avx512_weighted_sum<HalfKind::BF16>};
  return {avx512_dots<HalfKind::F16>, avx512_weighted_sum<HalfKind::F16>};
}

#else  // not x86-64: the plain C++ kernel only

HalfKernel avx2_half_kernel(HalfKind) { return {}; }
HalfKernel avx512_half_kernel(HalfKind) { return {}; }

#endif

}  // namespace tpcli::tensor
