// AVX2 and AVX-512 VNNI integer kernels for affine 8-bit and 4-bit weights (int8_dot.h states
// the arithmetic; these compute exactly its integers and float sequence). Built with
// -ffp-contract=off: gcc's vector intrinsics are plain vector arithmetic that it would otherwise
// fuse into FMAs the plain C++ kernel does not have.
//
// Dimension legend: K columns, GS group size, G = K / GS. A chunk is the run of columns one
// vector of codes covers: 32 columns for AVX2, 64 for AVX-512 (2 groups of 32, 1 of 64, half of 128).
// Per chunk, the products of codes and int8 activations are summed into 32-bit lanes
// (AVX-512: vpdpbusd, unsigned codes x signed activations; AVX2: pmaddubsw + pmaddwd), a group's
// chunks into one vector, and then 8 or 16 groups' vectors are reduced together by a transposing
// add tree to one vector holding a sum per group (integer adds, so the lane order is free).
// AVX2, 8-bit: pmaddubsw saturates pairs above 32767, and 2 * 255 * 127 is above. So the codes are
// offset to q - 128 (signed) and the sign trick of llama.cpp makes the pairs |q - 128| *
// (+-x), at most 2 * 128 * 127 = 32512; the 128 * sum(x) taken away is added back per group.
// 4-bit chunks: bytes split into low and high nibbles, one 16-byte run (32 codes) as [low, high];
// the activations are in the matching nibble order (int8_dot.h).
#include "tensor/int8_dot.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

// gcc 12 warns inside avx512fintrin.h's cast intrinsics (the known false positive that
// packed_kernels_x86.cpp silences too).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TPCLI_AVX2 __attribute__((target("avx2,fma")))
#define TPCLI_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")))
#define TPCLI_INLINE inline __attribute__((always_inline))
#endif

namespace tpcli::tensor::kernels {

#if defined(__x86_64__)

namespace {

// ---- shared by both sets ----

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): the order int8_dot.h fixes.
TPCLI_AVX2 TPCLI_INLINE float sum8(__m256 a) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// ---- AVX2 ----

// Per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
TPCLI_AVX2 TPCLI_INLINE __m256i sum_pairs(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
// Per 128-bit lane: the lane sums [A, B, C, D] of the four vectors that made ab and cd.
TPCLI_AVX2 TPCLI_INLINE __m256i sum_quads(__m256i ab, __m256i cd) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}
// Lane j = the sum of v[j]'s eight lanes.
TPCLI_AVX2 TPCLI_INLINE __m256i reduce8(const __m256i* v) {
  const __m256i p = sum_quads(sum_pairs(v[0], v[1]), sum_pairs(v[2], v[3]));
  const __m256i q = sum_quads(sum_pairs(v[4], v[5]), sum_pairs(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(p, q, 0x20), _mm256_permute2x128_si256(p, q, 0x31));
}

// 32 columns of one row: 8 lanes of partial dot products (8-bit: of q - 128, see above).
template <int Bits>
TPCLI_AVX2 TPCLI_INLINE __m256i chunk_dot_256(const uint8_t* q, const int8_t* xq) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  __m256i pairs;
  if constexpr (Bits == 8) {
    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
                                       _mm256_set1_epi8(static_cast<char>(0x80)));
    pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
    pairs = _mm256_maddubs_epi16(w, x);
  }
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// idot of groups [g0, g0 + count) of a row (count <= 8; lanes past it 0).
template <int Bits, int GS>
TPCLI_AVX2 TPCLI_INLINE __m256i group_dots_256(const uint8_t* row, const QuantizedInput& x, int64_t g0, int count) {
  constexpr int chunks = GS / 32, chunk_bytes = 32 * Bits / 8;
  __m256i v[8];
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm256_setzero_si256();
    if (j >= count) continue;
    for (int k = 0; k < chunks; ++k) {
      const int64_t chunk = (g0 + j) * chunks + k;
      v[j] = _mm256_add_epi32(v[j], chunk_dot_256<Bits>(row + chunk * chunk_bytes, x.xq.data() + chunk * 32));
    }
  }
  __m256i idot = reduce8(v);
  if constexpr (Bits == 8)  // add back 128 * sum(xq) (padded with zeros past G)
    idot = _mm256_add_epi32(idot, _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.xqsum.data() + g0)), 7));
  return idot;
}

// acc[j] += t[r, g0 + j] (int8_dot.h); weights' scales and biases read only for the count groups.
TPCLI_AVX2 TPCLI_INLINE __m256 add_terms_256(__m256 acc, __m256i idot, const float* scales, const float* biases,
                                            const QuantizedInput& x, int64_t g0, int count) {
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 s = _mm256_maskload_ps(scales + g0, mask), b = _mm256_maskload_ps(biases + g0, mask);
  const __m256 xs = _mm256_loadu_ps(x.xscale.data() + g0), xsum = _mm256_loadu_ps(x.xsum.data() + g0);
  const __m256 t = _mm256_fmadd_ps(s, _mm256_mul_ps(xs, _mm256_cvtepi32_ps(idot)), _mm256_mul_ps(b, xsum));
  return _mm256_add_ps(acc, t);
}

template <int Bits, int GS>
TPCLI_AVX2 void int8_rows_256(float* out, const View& w, const QuantizedInput& x, int64_t r0, int64_t r1) {
  const int64_t G = w.cols / GS;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    const float *scales = w.scales + r * G, *biases = w.biases + r * G;
    __m256 acc = _mm256_setzero_ps();
    int64_t g0 = 0;
    for (; g0 + 8 <= G; g0 += 8)
      acc = add_terms_256(acc, group_dots_256<Bits, GS>(row, x, g0, 8), scales, biases, x, g0, 8);
    if (g0 < G) {
      const int count = static_cast<int>(G - g0);
      acc = add_terms_256(acc, group_dots_256<Bits, GS>(row, x, g0, count), scales, biases, x, g0, count);
    }
    out[r - r0] = sum8(acc);
  }
}

// ---- AVX-512 VNNI ----

TPCLI_VNNI TPCLI_INLINE __m512i sum_pairs(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
TPCLI_VNNI TPCLI_INLINE __m512i sum_quads(__m512i ab, __m512i cd) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}
// 128-bit lanes [P0 + P1, P2 + P3, Q0 + Q1, Q2 + Q3].
TPCLI_VNNI TPCLI_INLINE __m512i sum_lane_pairs(__m512i p, __m512i q) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(3, 1, 3, 1)));
}
// Lanes [L0 L1 L2 L3, H0 H1 H2 H3, L4 .. L7, H4 .. H7]: Lj, Hj the sums of v[j]'s low and high 256 bits.
TPCLI_VNNI TPCLI_INLINE __m512i reduce_halves8(const __m512i* v) {
  const __m512i p = sum_quads(sum_pairs(v[0], v[1]), sum_pairs(v[2], v[3]));
  const __m512i q = sum_quads(sum_pairs(v[4], v[5]), sum_pairs(v[6], v[7]));
  return sum_lane_pairs(p, q);
}
// Lane j = the sum of v[j]'s sixteen lanes.
TPCLI_VNNI TPCLI_INLINE __m512i reduce16(const __m512i* v) {
  return sum_lane_pairs(reduce_halves8(v), reduce_halves8(v + 8));
}

// The codes of 64 columns as bytes (4-bit: [low, high] nibbles per 16-byte run); `half`: only the
// first 32 columns exist (the row's last group of 32), the rest read as 0 and never touched.
template <int Bits>
TPCLI_VNNI TPCLI_INLINE __m512i chunk_codes_512(const uint8_t* q, bool half) {
  if constexpr (Bits == 8) {
    return half ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, q) : _mm512_loadu_si512(q);
  } else {
    const __m256i b = half ? _mm256_maskz_loadu_epi8(0xFFFFu, q) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1);  // [B0 B1 H0 H1]
    return _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(15));
  }
}

TPCLI_VNNI TPCLI_INLINE __m512i chunk_input_512(const int8_t* xq, bool half) {
  return half ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xq) : _mm512_loadu_si512(xq);
}

// Two rows a, b, groups [g0, g0 + count) (count <= 8): lanes [a's idot | b's idot], 0 past count.
// Each activation chunk is loaded once for both rows.
template <int Bits, int GS>
TPCLI_VNNI TPCLI_INLINE __m512i group_dots_512(const uint8_t* row_a, const uint8_t* row_b, const int8_t* xq,
                                              int64_t g0, int count) {
  constexpr int64_t chunk_bytes = 64 * Bits / 8;
  if constexpr (GS >= 64) {
    constexpr int chunks = GS / 64;
    __m512i v[16];
    for (int j = 0; j < 8; ++j) {
      v[j] = v[8 + j] = _mm512_setzero_si512();
      if (j >= count) continue;
      for (int k = 0; k < chunks; ++k) {
        const int64_t chunk = (g0 + j) * chunks + k;
        const __m512i x = chunk_input_512(xq + chunk * 64, false);
        v[j] = _mm512_dpbusd_epi32(v[j], chunk_codes_512<Bits>(row_a + chunk * chunk_bytes, false), x);
        v[8 + j] = _mm512_dpbusd_epi32(v[8 + j], chunk_codes_512<Bits>(row_b + chunk * chunk_bytes, false), x);
      }
    }
    return reduce16(v);
  } else {  // GS 32: a chunk holds groups 2j and 2j + 1
    __m512i v[8];
    for (int j = 0; j < 4; ++j) {
      v[j] = v[4 + j] = _mm512_setzero_si512();
      if (2 * j >= count) continue;
      const bool half = 2 * j + 1 >= count;
      const int64_t chunk = g0 / 2 + j;
      const __m512i x = chunk_input_512(xq + chunk * 64, half);
      v[j] = _mm512_dpbusd_epi32(v[j], chunk_codes_512<Bits>(row_a + chunk * chunk_bytes, half), x);
      v[4 + j] = _mm512_dpbusd_epi32(v[4 + j], chunk_codes_512<Bits>(row_b + chunk * chunk_bytes, half), x);
    }
    // reduce_halves8 leaves groups as [0 2 4 6 1 3 5 7] per row
    const __m512i natural = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    return _mm512_permutexvar_epi32(natural, reduce_halves8(v));
  }
}

// Eight of a row's per-group floats (count of them; 0 past it).
TPCLI_VNNI TPCLI_INLINE __m256 row_floats(const float* p, int count) {
  return _mm256_maskz_loadu_ps(static_cast<__mmask8>(0xFFu >> (8 - count)), p);
}

// [acc_a | acc_b] += [t[a, g0 + j] | t[b, g0 + j]].
TPCLI_VNNI TPCLI_INLINE __m512 add_terms_512(__m512 acc, __m512i idot, const float* const* scales,
                                            const float* const* biases, const QuantizedInput& x, int64_t g0, int count) {
  const __m512 s = _mm512_insertf32x8(_mm512_castps256_ps512(row_floats(scales[0] + g0, count)),
                                      row_floats(scales[1] + g0, count), 1);
  const __m512 b = _mm512_insertf32x8(_mm512_castps256_ps512(row_floats(biases[0] + g0, count)),
                                      row_floats(biases[1] + g0, count), 1);
  const __m512 xs = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.xscale.data() + g0));
  const __m512 xsum = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.xsum.data() + g0));
  const __m512 t = _mm512_fmadd_ps(s, _mm512_mul_ps(xs, _mm512_cvtepi32_ps(idot)), _mm512_mul_ps(b, xsum));
  return _mm512_add_ps(acc, t);
}

// Rows in pairs (a lone last row is paired with itself).
template <int Bits, int GS>
TPCLI_VNNI void int8_rows_512(float* out, const View& w, const QuantizedInput& x, int64_t r0, int64_t r1) {
  const int64_t G = w.cols / GS;
  for (int64_t r = r0; r < r1; r += 2) {
    const int64_t rb = std::min(r + 1, r1 - 1);
    const uint8_t *row_a = w.data + r * w.row_bytes, *row_b = w.data + rb * w.row_bytes;
    const float* scales[2] = {w.scales + r * G, w.scales + rb * G};
    const float* biases[2] = {w.biases + r * G, w.biases + rb * G};
    __m512 acc = _mm512_setzero_ps();
    int64_t g0 = 0;
    for (; g0 + 8 <= G; g0 += 8)
      acc = add_terms_512(acc, group_dots_512<Bits, GS>(row_a, row_b, x.xq.data(), g0, 8), scales, biases, x, g0, 8);
    if (g0 < G) {
      const int count = static_cast<int>(G - g0);
      acc = add_terms_512(acc, group_dots_512<Bits, GS>(row_a, row_b, x.xq.data(), g0, count), scales, biases, x, g0,
                          count);
    }
    out[r - r0] = sum8(_mm512_castps512_ps256(acc));
    if (rb != r) out[rb - r0] = sum8(_mm512_extractf32x8_ps(acc, 1));
  }
}

// ---- AVX-512 VNNI, several vectors per row ----
// A tile is one row and 2 * NP vectors: each chunk of codes is loaded (and unpacked) once and
// multiplied with every vector's activations. Vectors go in pairs, [u | v] in the two halves of
// a register where int8_rows_512 has rows [a | b], so every lane does the float work it does there.
// The groups' integer sums are reduced as soon as a pair of groups is done, not after all 8, which
// keeps 4 vectors' partial sums in registers (integer adds: the reduction order changes no bit).

// acc[n] += codes x xq[n] over one chunk (all 64 columns, or the first 32 when `half`).
template <int Bits, int NV>
TPCLI_VNNI TPCLI_INLINE void chunk_dots_batch_512(__m512i* acc, const uint8_t* row, const int8_t* const* xq, int64_t chunk,
                                                 bool half) {
  const __m512i codes = chunk_codes_512<Bits>(row + chunk * (64 * Bits / 8), half);
  for (int n = 0; n < NV; ++n) acc[n] = _mm512_dpbusd_epi32(acc[n], codes, chunk_input_512(xq[n] + chunk * 64, half));
}

// d[n] = the 16 lanes of unit j of the block at group g0, for vector n: a group when GS >= 64, a
// chunk of two groups of 32 otherwise; 0 past the block's count groups.
template <int Bits, int GS, int NV>
TPCLI_VNNI TPCLI_INLINE void unit_dots_batch_512(__m512i* d, const uint8_t* row, const int8_t* const* xq, int64_t g0,
                                                int count, int j) {
  for (int n = 0; n < NV; ++n) d[n] = _mm512_setzero_si512();
  if constexpr (GS >= 64) {
    if (j >= count) return;
    for (int k = 0; k < GS / 64; ++k) chunk_dots_batch_512<Bits, NV>(d, row, xq, (g0 + j) * (GS / 64) + k, false);
  } else {
    if (2 * j >= count) return;
    chunk_dots_batch_512<Bits, NV>(d, row, xq, g0 / 2 + j, 2 * j + 1 >= count);
  }
}

// Per vector n, the lanes reduce_halves8 leaves for its units of the block at group g0.
template <int Bits, int GS, int NV>
TPCLI_VNNI TPCLI_INLINE void group_halves_batch_512(__m512i* halves, const uint8_t* row, const int8_t* const* xq,
                                                   int64_t g0, int count) {
  constexpr int UNITS = GS >= 64 ? 8 : 4;  // per block of 8 groups
  __m512i quads[UNITS / 4][NV];
  for (int h = 0; h < UNITS / 4; ++h) {
    __m512i pairs[2][NV];
    for (int p = 0; p < 2; ++p) {
      __m512i a[NV], b[NV];
      unit_dots_batch_512<Bits, GS, NV>(a, row, xq, g0, count, 4 * h + 2 * p);
      unit_dots_batch_512<Bits, GS, NV>(b, row, xq, g0, count, 4 * h + 2 * p + 1);
      for (int n = 0; n < NV; ++n) pairs[p][n] = sum_pairs(a[n], b[n]);
    }
    for (int n = 0; n < NV; ++n) quads[h][n] = sum_quads(pairs[0][n], pairs[1][n]);
  }
  for (int n = 0; n < NV; ++n) {
    if constexpr (UNITS == 8) halves[n] = sum_lane_pairs(quads[0][n], quads[1][n]);
    else halves[n] = quads[0][n];
  }
}

// [acc_u | acc_v] += [t[r, g0 + j] for u | for v]: add_terms_512 with one row's scales and biases
// and two vectors' activations.
TPCLI_VNNI TPCLI_INLINE __m512 add_terms_pair_512(__m512 acc, __m512i idot, const float* scales, const float* biases,
                                                 const QuantizedInput& u, const QuantizedInput& v, int64_t g0, int count) {
  const __m512 s = _mm512_broadcast_f32x8(row_floats(scales + g0, count));
  const __m512 b = _mm512_broadcast_f32x8(row_floats(biases + g0, count));
  const __m512 xs = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(u.xscale.data() + g0)),
                                       _mm256_loadu_ps(v.xscale.data() + g0), 1);
  const __m512 xsum = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(u.xsum.data() + g0)),
                                         _mm256_loadu_ps(v.xsum.data() + g0), 1);
  const __m512 t = _mm512_fmadd_ps(s, _mm512_mul_ps(xs, _mm512_cvtepi32_ps(idot)), _mm512_mul_ps(b, xsum));
  return _mm512_add_ps(acc, t);
}

// Rows [r0, r1) times the 2 * NP vectors x[0 .. 2 * NP).
template <int Bits, int GS, int NP>
TPCLI_VNNI void int8_tile_512(float* out, int64_t ld_out, const View& w, const QuantizedInput* x, int64_t r0, int64_t r1) {
  constexpr int NV = 2 * NP;
  const int64_t G = w.cols / GS;
  const int8_t* xq[NV];
  for (int n = 0; n < NV; ++n) xq[n] = x[n].xq.data();
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    const float *scales = w.scales + r * G, *biases = w.biases + r * G;
    __m512 acc[NP];
    for (int p = 0; p < NP; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
      const int count = static_cast<int>(std::min<int64_t>(8, G - g0));
      __m512i halves[NV];
      group_halves_batch_512<Bits, GS, NV>(halves, row, xq, g0, count);
      for (int p = 0; p < NP; ++p) {
        __m512i idot = sum_lane_pairs(halves[2 * p], halves[2 * p + 1]);
        if constexpr (GS == 32) {  // groups [0 2 4 6 1 3 5 7] per vector, as in group_dots_512
          const __m512i natural = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
          idot = _mm512_permutexvar_epi32(natural, idot);
        }
        acc[p] = add_terms_pair_512(acc[p], idot, scales, biases, x[2 * p], x[2 * p + 1], g0, count);
      }
    }
    for (int p = 0; p < NP; ++p) {
      out[2 * p * ld_out + r - r0] = sum8(_mm512_castps512_ps256(acc[p]));
      out[(2 * p + 1) * ld_out + r - r0] = sum8(_mm512_extractf32x8_ps(acc[p], 1));
    }
  }
}

// Tiles of 4 vectors, then 2, then a lone one through int8_rows_512.
template <int Bits, int GS>
TPCLI_VNNI void int8_rows_batch_512(float* out, int64_t ld_out, const View& w, const QuantizedInput* x, int64_t B,
                                    int64_t r0, int64_t r1) {
  int64_t v = 0;
  for (; v + 4 <= B; v += 4) int8_tile_512<Bits, GS, 2>(out + v * ld_out, ld_out, w, x + v, r0, r1);
  if (v + 2 <= B) {
    int8_tile_512<Bits, GS, 1>(out + v * ld_out, ld_out, w, x + v, r0, r1);
    v += 2;
  }
  if (v < B) int8_rows_512<Bits, GS>(out + v * ld_out, w, x[v], r0, r1);
}

template <template <int, int> class Rows>
Int8Kernel pick(const WeightFormat& f, bool nibble_order) {
  const auto by_group = [&](auto k8_32, auto k8_64, auto k8_128, auto k4_32, auto k4_64, auto k4_128) {
    const int gs = f.group_size;
    if (f.bits == 8) return gs == 32 ? k8_32 : gs == 64 ? k8_64 : k8_128;
    return gs == 32 ? k4_32 : gs == 64 ? k4_64 : k4_128;
  };
  return {nibble_order && f.bits == 4,
          by_group(Rows<8, 32>::fn, Rows<8, 64>::fn, Rows<8, 128>::fn, Rows<4, 32>::fn, Rows<4, 64>::fn, Rows<4, 128>::fn),
          by_group(Rows<8, 32>::batch, Rows<8, 64>::batch, Rows<8, 128>::batch, Rows<4, 32>::batch, Rows<4, 64>::batch,
                   Rows<4, 128>::batch)};
}

template <int Bits, int GS>
struct Rows256 {
  static constexpr auto fn = int8_rows_256<Bits, GS>;
  static constexpr decltype(Int8Kernel::rows_batch) batch = nullptr;
};
template <int Bits, int GS>
struct Rows512 {
  static constexpr auto fn = int8_rows_512<Bits, GS>;
  static constexpr auto batch = int8_rows_batch_512<Bits, GS>;
};

bool cpu_has_vnni() { return __builtin_cpu_supports("avx512vnni"); }

}  // namespace

Int8Kernel avx2_int8_kernel(const WeightFormat& f) {
  if (!int8_matvec_format(f)) return {};
  return pick<Rows256>(f, true);
}

Int8Kernel avx512_int8_kernel(const WeightFormat& f) {
  if (!int8_matvec_format(f) || !cpu_has_vnni()) return {};
  return pick<Rows512>(f, true);
}

#else  // not x86-64: the plain C++ kernel only

Int8Kernel avx2_int8_kernel(const WeightFormat&) { return {}; }
Int8Kernel avx512_int8_kernel(const WeightFormat&) { return {}; }

#endif

}  // namespace tpcli::tensor::kernels
