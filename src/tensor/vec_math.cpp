#include "tensor/vec_math.h"

#include <algorithm>
#include <bit>
#include <cmath>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TPCLI_VEC_MATH_AVX2 1
#endif

namespace tpcli::tensor {

namespace {

constexpr float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float EXP_MIN = -87.0f, EXP_MAX = 88.0f;
constexpr float P0 = 1.9875691500e-4f, P1 = 1.3981999507e-3f, P2 = 8.3334519073e-3f, P3 = 4.1665795894e-2f,
                P4 = 1.6666665459e-1f, P5 = 5.0000001201e-1f;

#ifdef TPCLI_VEC_MATH_AVX2
// The scalar formula below, eight lanes at once. NaN lanes stay NaN (max/min return the NaN
// operand when it is the second one).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(EXP_MAX), _mm256_max_ps(_mm256_set1_ps(EXP_MIN), x));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
  __m256 p = _mm256_set1_ps(P0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float horizontal_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace

float exp_approx(float x) {
  if (x != x) return x;
  x = std::min(std::max(x, EXP_MIN), EXP_MAX);
  const float k = std::nearbyint(x * LOG2E);
  const float r = (x - k * LN2_HI) - k * LN2_LO;  // |r| <= ln2 / 2
  const float p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5;
  const float e = (p * r * r + r) + 1.0f;
  return e * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);  // 2^k, k in [-126, 127]
}

float exp_sum(float* out, const float* in, int64_t n, float scale, float shift) {
  int64_t i = 0;
  float sum = 0.0f;
#ifdef TPCLI_VEC_MATH_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(in + i), s, m));
    _mm256_storeu_ps(out + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = horizontal_sum(acc);
#endif
  for (; i < n; ++i) {
    out[i] = exp_approx(in[i] * scale - shift);
    sum += out[i];
  }
  return sum;
}

float max_of(const float* in, int64_t n) {
  int64_t i = 0;
  float best = in[0];
#ifdef TPCLI_VEC_MATH_AVX2
  if (n >= 8) {
    __m256 acc = _mm256_loadu_ps(in);
    for (i = 8; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(in + i));
    best = horizontal_max(acc);
  }
#endif
  for (; i < n; ++i) best = std::max(best, in[i]);
  return best;
}

void sigmoid(float* out, const float* in, int64_t n) {
  int64_t i = 0;
#ifdef TPCLI_VEC_MATH_AVX2
  const __m256 one = _mm256_set1_ps(1.0f), minus = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_xor_ps(_mm256_loadu_ps(in + i), minus));
    _mm256_storeu_ps(out + i, _mm256_div_ps(one, _mm256_add_ps(one, e)));
  }
#endif
  for (; i < n; ++i) out[i] = 1.0f / (1.0f + exp_approx(-in[i]));
}

double sum_of_squares(const float* in, int64_t n) {
  int64_t i = 0;
  double sum = 0.0;
#ifdef TPCLI_VEC_MATH_AVX2
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(in + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(in + i + 4));
    acc0 = _mm256_fmadd_pd(lo, lo, acc0);
    acc1 = _mm256_fmadd_pd(hi, hi, acc1);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; ++i) sum += static_cast<double>(in[i]) * in[i];
  return sum;
}

}  // namespace tpcli::tensor
