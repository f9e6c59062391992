// tpcli::tensor — internal (x86-64 kernel files only): many horizontal sums at once, bit for bit
// what one _mm512_reduce_add_ps gives each.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>


namespace tpcli::tensor::kernels {

// Lane j = _mm512_reduce_add_ps(a[j]), bit for bit, sixteen reductions in 15 vector additions
// instead of 60 scalar-sized steps: _mm512_reduce_add_ps adds lane i + 8 to lane i, then j + 4 to
// j, then 2 to 0 and 3 to 1, then the two; here each level adds the same pairs of sixteen
// accumulators at once (float addition commutes, so the pairs' order within an add does not
// matter), and the last level leaves sum 4m + q in lane 4q + m, permuted back at the end.
__attribute__((target("avx512f,avx512dq"))) inline __m512 sums16_512(const __m512 (&a)[16]) {
  __m512 z[8], w4[4], u[2];
  for (int m = 0; m < 8; ++m)  // [s of a[2m] (lanes 0-7), s of a[2m+1] (8-15)], s[i] = lane i + lane i + 8
    z[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xEE), _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44));
  for (int m = 0; m < 4; ++m)  // quarter q: t of a[4m + q], t[j] = s[j] + s[j + 4]
    w4[m] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * m], z[2 * m + 1], 0xDD), _mm512_shuffle_f32x4(z[2 * m], z[2 * m + 1], 0x88));
  for (int m = 0; m < 2; ++m)  // quarter q: [u0, u1 of w4[2m]'s, u0, u1 of w4[2m+1]'s], u0 = t0 + t2, u1 = t1 + t3
    u[m] = _mm512_add_ps(_mm512_shuffle_ps(w4[2 * m], w4[2 * m + 1], 0xEE), _mm512_shuffle_ps(w4[2 * m], w4[2 * m + 1], 0x44));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0xDD), _mm512_shuffle_ps(u[0], u[1], 0x88));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, r);
}

}  // namespace tpcli::tensor::kernels

#endif
