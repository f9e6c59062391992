// AVX2 and AVX-512 matrix-vector kernels for PackedMatrix and the f32 decode matvec (tensor/blas.h).
// Each function carries its own target attribute, so the rest of the build does not depend on
// -march; a set is picked at run time (tensor/isa.h), and the tests run every set this CPU has
// against the plain C++ one (tests/tensor, and whole models under TPCLI_ISA in tests/cli).
//
// Dimension legend: K columns, GS group size (a multiple of 32), G = K / GS.
// 4-bit rows hold element 2j in the low nibble of byte j and 2j+1 in the high one: widening the
// bytes to lanes gives the even elements (& 15) and the odd ones (>> 4) of a chunk, so `prepare`
// stores x chunk by chunk as [even elements, odd elements] (32-element chunks for AVX-512, 16 for
// AVX2) and the inner loop needs no shuffles.
// 4-bit groups of 64 or 128 on CPUs with AVX512_BF16 take a bf16 path instead (affine4_bf16_rows_512).
// Scalar steps (bias sums, tails) are written as std::fma, not `s += a * b`: whether gcc fuses the
// latter depends on what it vectorizes around it (the bf16 kernel's two rows' bias sums side by
// side became a separate multiply and add, a single row's one fma), and a row's bits should not
// depend on which rows or vectors are computed beside it.
// E4M3 bytes become f16 bit patterns with the exponent 8 too small ((b & 0x80) << 8 | (b & 0x7F)
// << 7, subnormals included); the missing 2^8 is folded into the group's scale.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/packed_kernels.h"
#include "tensor/x86_bf16_codes.h"
#include "tensor/x86_tiles.h"
#include "tensor/x86_sums.h"

#if defined(__x86_64__)
#include <immintrin.h>
// gcc 12 warns inside avx512fintrin.h's _mm512_reduce_add_ps (a known false positive: its
// _mm256_undefined_pd), as "may be" or, once inlined into the batch kernels' finish, "is" uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define TPCLI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TPCLI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define TPCLI_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#endif

namespace tpcli::tensor::kernels {

#if defined(__x86_64__)

namespace {

float scale_of_e8m0(uint8_t s) {  // 2^(s - 127), times the 2^8 the f16 trick leaves out
  uint32_t bits = 0;
  const int e = static_cast<int>(s) - 127 + 8;
  if (s == 255) bits = 0x7F800000u;
  else if (e >= -126) bits = static_cast<uint32_t>(e + 127) << 23;
  else bits = 1u << (e + 149);  // subnormal
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// s + w[p, k) . x[p, k), one element at a time: the f32 kernels' tail after their vector loop.
TPCLI_AVX2 float f32_tail(float s, const float* w, const float* x, int64_t p, int64_t k) {
  for (; p < k; ++p) s = std::fma(w[p], x[p], s);
  return s;
}

// ---- AVX-512 ----


// f32: four rows a pass, one from each quarter of the range, so the weights are read as four
// sequential streams far apart (rows are contiguous), which read decode's matrices faster than
// four neighbouring rows side by side (streams a row apart) or one row after another
// (BENCHMARKS.md, Kernel design notes, compares the three). Each row is one FMA chain over 16
// lanes whatever the row order, so the order changes no result: rows of the first 4 * (n / 4)
// end with a masked vector, the last (fewer than four) with a scalar tail.
TPCLI_AVX512 float f32_dot_512(const float* w, const float* x, int64_t k) {
  __m512 a = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 16 <= k; p += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(w + p), _mm512_loadu_ps(x + p), a);
  return f32_tail(_mm512_reduce_add_ps(a), w, x, p, k);
}

TPCLI_AVX512 void f32_rows_512(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  const int64_t k = w.cols, q = (r1 - r0) / 4;  // q rows in each quarter
  const auto* base = reinterpret_cast<const float*>(w.data) + r0 * k;
  for (int64_t i = 0; i < q; ++i) {
    const float* w0 = base + i * k;
    const float *w1 = w0 + q * k, *w2 = w1 + q * k, *w3 = w2 + q * k;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 16 <= k; p += 16) {
      const __m512 xv = _mm512_loadu_ps(x + p);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + p), xv, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + p), xv, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + p), xv, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + p), xv, a3);
    }
    if (p < k) {
      const __mmask16 mk = static_cast<__mmask16>((1u << (k - p)) - 1);
      const __m512 xv = _mm512_maskz_loadu_ps(mk, x + p);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w0 + p), xv, a0);
      a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w1 + p), xv, a1);
      a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w2 + p), xv, a2);
      a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w3 + p), xv, a3);
    }
    out[i] = _mm512_reduce_add_ps(a0);
    out[i + q] = _mm512_reduce_add_ps(a1);
    out[i + 2 * q] = _mm512_reduce_add_ps(a2);
    out[i + 3 * q] = _mm512_reduce_add_ps(a3);
  }
  for (int64_t i = 4 * q; i < r1 - r0; ++i) out[i] = f32_dot_512(base + i * k, x, k);
}

// f32_rows_512 for several vectors, one kind of its rows: the first 4 * (n / 4) (MaskedTail: the
// 16-lane chain ends in a masked vector) or the last n % 4 (f32_dot_512: the sum, then a scalar tail).
// It prefetches the next rows' block as it goes: rows read a column block at a time are 16 short
// streams the hardware prefetchers do not follow (4096 x 4096 from memory, 4 and 16 vectors: 27-45
// GF/s without, 49-51 with).
template <bool MaskedTail>
struct F32Tile512 {
  static constexpr int MAX_V = 6, ROWS = 4;  // 24 running sums, 4 weight vectors and an x vector: 29 of 32 registers
  struct State {
    __m512 a;
  };
  static int64_t unit(const View&) { return 16; }
  static int64_t body(const View& w) { return w.cols / 16 * 16; }

  template <int RT, int V>
  TPCLI_AVX512 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const float* row[RT];
    __m512 a[RT][V];
    for (int i = 0; i < RT; ++i) {
      row[i] = reinterpret_cast<const float*>(w.data) + (r + i) * w.cols;
      for (int v = 0; v < V; ++v) a[i][v] = s[i][v].a;
    }
    const int64_t ahead = RT * w.cols;  // the rows read next: this block of the next RT rows
    for (int64_t p = c0; p < c1; p += 16) {
      __m512 u[RT];
      for (int i = 0; i < RT; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(row[i] + ahead + p), _MM_HINT_T0);
        u[i] = _mm512_loadu_ps(row[i] + p);
      }
      for (int v = 0; v < V; ++v) {
        const __m512 xv = _mm512_loadu_ps(in.x[v] + p);
        for (int i = 0; i < RT; ++i) a[i][v] = _mm512_fmadd_ps(u[i], xv, a[i][v]);
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) s[i][v].a = a[i][v];
  }

  // finish for rn <= 16 rows at once (tile_rows calls it when FINISHES_ROWS is declared): the
  // masked tails, then per vector the rows' sixteen reductions together (sums16_512), whose lanes
  // are the vector's consecutive outputs, then any scalar tails.
  static constexpr bool FINISHES_ROWS = true;
  template <int V>
  TPCLI_AVX512 static void finish_rows(float* out, int64_t ld_out, State (*s)[V], int64_t rn, const View& w, int64_t r,
                                       const Vectors& vs) {
    static_assert(STATE_ROWS == 16);
    const TileInputs<V> in(vs);
    const int64_t k = w.cols, p = body(w);
    const auto* rows = reinterpret_cast<const float*>(w.data) + r * k;
    const __mmask16 filled = static_cast<__mmask16>((1u << rn) - 1);
    for (int v = 0; v < V; ++v) {
      __m512 a[16];
      for (int64_t i = 0; i < 16; ++i) a[i] = i < rn ? s[i][v].a : _mm512_setzero_ps();
      if (MaskedTail && p < k) {
        const __mmask16 mk = static_cast<__mmask16>((1u << (k - p)) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(mk, in.x[v] + p);
        for (int64_t i = 0; i < rn; ++i) a[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, rows + i * k + p), xv, a[i]);
      }
      const __m512 sums = sums16_512(a);
      if (MaskedTail || p == k) {
        _mm512_mask_storeu_ps(out + v * ld_out, filled, sums);
        continue;
      }
      float each[16];
      _mm512_storeu_ps(each, sums);
      for (int64_t i = 0; i < rn; ++i) out[v * ld_out + i] = f32_tail(each[i], rows + i * k, in.x[v], p, k);
    }
  }
};

void f32_rows_batch_512(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r0, int64_t r1) {
  const int64_t masked = r0 + 4 * ((r1 - r0) / 4);  // f32_rows_512's rows that end in a masked vector
  in_vector_tiles<F32Tile512<true>>(out, ld_out, w, x, r0, masked);
  in_vector_tiles<F32Tile512<false>>(out + masked - r0, ld_out, w, x, masked, r1);
}

TPCLI_AVX512 void prepare4_512(float* xp, const float* x, int64_t cols) {
  for (int64_t c = 0; c < cols; c += 32)
    for (int j = 0; j < 16; ++j) {
      xp[c + j] = x[c + 2 * j];
      xp[c + 16 + j] = x[c + 2 * j + 1];
    }
}

TPCLI_AVX512 void affine_rows_512(float* out, const View& w, const float* x, const float* xsum, int64_t r0, int64_t r1) {
  const int bits = w.format.bits, GS = w.format.group_size;
  const int64_t G = w.cols / GS;
  const __m512i low4 = _mm512_set1_epi32(15);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.data + r * w.row_bytes;
    const float* scales = w.scales + r * G;
    const float* biases = w.biases + r * G;
    __m512 acc = _mm512_setzero_ps();
    float bias_part = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      __m512 ga = _mm512_setzero_ps(), gb = _mm512_setzero_ps();
      const int64_t c0 = g * GS;
      if (bits == 8) {
        for (int64_t c = c0; c < c0 + GS; c += 32) {
          // Without it the row stalls on its loads, below the memory rate and this kernel's
          // compute rate alike (PREFETCH_BYTES).
          _mm_prefetch(reinterpret_cast<const char*>(q + c + PREFETCH_BYTES), _MM_HINT_T0);
          const __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c))));
          const __m512 v1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c + 16))));
          ga = _mm512_fmadd_ps(v0, _mm512_loadu_ps(x + c), ga);
          gb = _mm512_fmadd_ps(v1, _mm512_loadu_ps(x + c + 16), gb);
        }
      } else {  // 4 bits
        for (int64_t c = c0; c < c0 + GS; c += 32) {
          const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2)));
          ga = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, low4)), _mm512_loadu_ps(x + c), ga);
          gb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), _mm512_loadu_ps(x + c + 16), gb);
        }
      }
      acc = _mm512_fmadd_ps(_mm512_add_ps(ga, gb), _mm512_set1_ps(scales[g]), acc);
      bias_part = std::fma(biases[g], xsum[g], bias_part);
    }
    out[r - r0] = _mm512_reduce_add_ps(acc) + bias_part;
  }
}

// affine_rows_512 for several rows and vectors: a register tile of ROWS rows x V vectors. A
// group's codes are widened once for ROWS rows and stay in registers while each vector in turn
// runs its ga/gb chains over them, so only one vector's chains are live at a time (the registers
// hold acc per (row, vector), the widened group, and one vector's chains); each x vector is loaded
// once for the rows. Per (row, vector) the chains, group sum, scale FMA, bias sum and reduction of
// affine_rows_512. The bias sums, which need no weights, run after the groups (still in g order).
// Bits and GS are compile-time (no branch per chunk, the group's chunks unrolled).
template <int Bits, int GS>
struct AffineTile512 {
  static constexpr int ROWS = 2, MAX_V = GS == 128 ? 3 : 6;  // acc and the widened group fill the registers
  struct State {
    __m512 acc;
    float bias;
  };
  static int64_t unit(const View&) { return GS; }
  static int64_t body(const View& w) { return w.cols; }

  template <int RT, int V>
  TPCLI_AVX512 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    constexpr int H = GS / 16;  // 16-column halves of the group's chunks: even ones feed ga, odd ones gb
    const TileInputs<V> in(vs);
    const int64_t G = w.cols / GS;
    const __m512i low4 = _mm512_set1_epi32(15);
    const uint8_t* q[RT];
    __m512 acc[RT][V];
    for (int i = 0; i < RT; ++i) {
      q[i] = w.data + (r + i) * w.row_bytes;
      for (int v = 0; v < V; ++v) acc[i][v] = s[i][v].acc;
    }
    for (int64_t g = c0 / GS; g < c1 / GS; ++g) {
      const int64_t c = g * GS;
      __m512 u[RT][H], scale[RT];
      for (int i = 0; i < RT; ++i) {
        for (int k = 0; k < H; k += 2) {
          if constexpr (Bits == 8) {
            _mm_prefetch(reinterpret_cast<const char*>(q[i] + c + 16 * k + PREFETCH_BYTES), _MM_HINT_T0);
            u[i][k] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[i] + c + 16 * k))));
            u[i][k + 1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[i] + c + 16 * k + 16))));
          } else {  // 4 bits
            const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[i] + (c + 16 * k) / 2)));
            u[i][k] = _mm512_cvtepi32_ps(_mm512_and_si512(b, low4));
            u[i][k + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
          }
        }
        scale[i] = _mm512_set1_ps(w.scales[(r + i) * G + g]);
      }
      for (int v = 0; v < V; ++v) {
        __m512 ga[RT], gb[RT];
        for (int i = 0; i < RT; ++i) ga[i] = gb[i] = _mm512_setzero_ps();
        for (int k = 0; k < H; k += 2) {
          const __m512 x0 = in_register(_mm512_loadu_ps(in.x[v] + c + 16 * k));
          for (int i = 0; i < RT; ++i) ga[i] = _mm512_fmadd_ps(u[i][k], x0, ga[i]);
          const __m512 x1 = in_register(_mm512_loadu_ps(in.x[v] + c + 16 * k + 16));
          for (int i = 0; i < RT; ++i) gb[i] = _mm512_fmadd_ps(u[i][k + 1], x1, gb[i]);
        }
        for (int i = 0; i < RT; ++i) acc[i][v] = _mm512_fmadd_ps(_mm512_add_ps(ga[i], gb[i]), scale[i], acc[i][v]);
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) {
        s[i][v].acc = acc[i][v];
        for (int64_t g = c0 / GS; g < c1 / GS; ++g) s[i][v].bias = std::fma(w.biases[(r + i) * G + g], in.sum[v][g], s[i][v].bias);
      }
  }

  template <int V>
  TPCLI_AVX512 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v) out[v * ld_out] = _mm512_reduce_add_ps(s[v].acc) + s[v].bias;
  }
};

using RowsBatch = decltype(MatvecKernel::rows_batch);

template <int Bits>
RowsBatch affine_batch_512(int group_size) {  // group_size: 32, 64 or 128 (check_format)
  if (group_size == 32) return in_vector_tiles<AffineTile512<Bits, 32>>;
  if (group_size == 64) return in_vector_tiles<AffineTile512<Bits, 64>>;
  return in_vector_tiles<AffineTile512<Bits, 128>>;
}

TPCLI_AVX512 __m512 e4m3x16_512(const uint8_t* q) {
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
  const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7);
  return _mm512_cvtph_ps(_mm256_or_si256(sign, mag));
}

TPCLI_AVX512 void mxfp8_rows_512(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  const int64_t G = w.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.data + r * w.row_bytes;
    const uint8_t* s = w.scale_bytes + r * G;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const int64_t c = g * 32;
      __m512 ga = _mm512_mul_ps(e4m3x16_512(q + c), _mm512_loadu_ps(x + c));
      ga = _mm512_fmadd_ps(e4m3x16_512(q + c + 16), _mm512_loadu_ps(x + c + 16), ga);
      acc = _mm512_fmadd_ps(ga, _mm512_set1_ps(scale_of_e8m0(s[g])), acc);
    }
    out[r - r0] = _mm512_reduce_add_ps(acc);
  }
}

// mxfp8_rows_512 for several rows and vectors: a register tile of ROWS rows x V vectors, a group's
// 32 codes converted once for the V vectors and each x vector loaded once for the rows.
struct Mxfp8Tile512 {
  static constexpr int MAX_V = 6, ROWS = 3;  // 18 running sums, 6 converted halves, 3 scales, x and a group sum
  struct State {
    __m512 acc;
  };
  static int64_t unit(const View&) { return 32; }
  static int64_t body(const View& w) { return w.cols; }

  template <int RT, int V>
  TPCLI_AVX512 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const int64_t G = w.cols / 32;
    const uint8_t* q[RT];
    const uint8_t* scales[RT];
    __m512 acc[RT][V];
    for (int i = 0; i < RT; ++i) {
      q[i] = w.data + (r + i) * w.row_bytes, scales[i] = w.scale_bytes + (r + i) * G;
      for (int v = 0; v < V; ++v) acc[i][v] = s[i][v].acc;
    }
    for (int64_t c = c0; c < c1; c += 32) {
      __m512 e0[RT], e1[RT], scale[RT];
      for (int i = 0; i < RT; ++i) {
        // The next tile's block, as F32Tile512 (without it the rows, read a column block at a
        // time, are short streams the hardware prefetchers do not follow).
        _mm_prefetch(reinterpret_cast<const char*>(q[i] + RT * w.row_bytes + c), _MM_HINT_T0);
        e0[i] = e4m3x16_512(q[i] + c), e1[i] = e4m3x16_512(q[i] + c + 16);
        scale[i] = _mm512_set1_ps(scale_of_e8m0(scales[i][c / 32]));
      }
      for (int v = 0; v < V; ++v) {
        const __m512 x0 = in_register(_mm512_loadu_ps(in.x[v] + c)), x1 = in_register(_mm512_loadu_ps(in.x[v] + c + 16));
        for (int i = 0; i < RT; ++i) {
          const __m512 ga = _mm512_fmadd_ps(e1[i], x1, _mm512_mul_ps(e0[i], x0));
          acc[i][v] = _mm512_fmadd_ps(ga, scale[i], acc[i][v]);
        }
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) s[i][v].acc = acc[i][v];
  }

  template <int V>
  TPCLI_AVX512 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v) out[v * ld_out] = _mm512_reduce_add_ps(s[v].acc);
  }
};

// s + h[c, k) . x[c, k), one element at a time: the half kernels' tail after their vector loop, one
// function so the single-vector and batch kernels of both sets round it alike.
template <bool Bf16>
TPCLI_AVX2 float half_tail(float s, const uint16_t* h, const float* x, int64_t c, int64_t k) {
  for (; c < k; ++c) {
    float v;
    if constexpr (Bf16) {
      const uint32_t bits = static_cast<uint32_t>(h[c]) << 16;
      std::memcpy(&v, &bits, 4);
    } else {
      v = _cvtsh_ss(h[c]);
    }
    s = std::fma(v, x[c], s);
  }
  return s;
}

template <bool Bf16>
TPCLI_AVX512 __m512 halfx16_512(const uint16_t* h) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h));
  if constexpr (Bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  else return _mm512_cvtph_ps(v);
}

template <bool Bf16>
TPCLI_AVX512 void half_rows_512(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto* h = reinterpret_cast<const uint16_t*>(w.data + r * w.row_bytes);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= w.cols; c += 32) {
      a0 = _mm512_fmadd_ps(halfx16_512<Bf16>(h + c), _mm512_loadu_ps(x + c), a0);
      a1 = _mm512_fmadd_ps(halfx16_512<Bf16>(h + c + 16), _mm512_loadu_ps(x + c + 16), a1);
    }
    out[r - r0] = half_tail<Bf16>(_mm512_reduce_add_ps(_mm512_add_ps(a0, a1)), h, x, c, w.cols);
  }
}

// half_rows_512 for several rows and vectors: a register tile of ROWS rows x V vectors, 32 weights
// converted once a step for the V vectors and each x vector loaded once for the rows.
template <bool Bf16>
struct HalfTile512 {
  static constexpr int MAX_V = 6, ROWS = 2;  // a0, a1 per (row, vector): 24, 4 converted halves and an x vector
  struct State {
    __m512 a0, a1;
  };
  static int64_t unit(const View&) { return 32; }
  static int64_t body(const View& w) { return w.cols / 32 * 32; }

  static const uint16_t* row(const View& w, int64_t r) { return reinterpret_cast<const uint16_t*>(w.data + r * w.row_bytes); }

  template <int RT, int V>
  TPCLI_AVX512 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const uint16_t* h[RT];
    __m512 a0[RT][V], a1[RT][V];
    for (int i = 0; i < RT; ++i) {
      h[i] = row(w, r + i);
      for (int v = 0; v < V; ++v) a0[i][v] = s[i][v].a0, a1[i][v] = s[i][v].a1;
    }
    for (int64_t c = c0; c < c1; c += 32) {
      __m512 h0[RT], h1[RT];
      for (int i = 0; i < RT; ++i) h0[i] = halfx16_512<Bf16>(h[i] + c), h1[i] = halfx16_512<Bf16>(h[i] + c + 16);
      for (int v = 0; v < V; ++v) {
        const __m512 x0 = in_register(_mm512_loadu_ps(in.x[v] + c));
        for (int i = 0; i < RT; ++i) a0[i][v] = _mm512_fmadd_ps(h0[i], x0, a0[i][v]);
        const __m512 x1 = in_register(_mm512_loadu_ps(in.x[v] + c + 16));
        for (int i = 0; i < RT; ++i) a1[i][v] = _mm512_fmadd_ps(h1[i], x1, a1[i][v]);
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) s[i][v].a0 = a0[i][v], s[i][v].a1 = a1[i][v];
  }

  template <int V>
  TPCLI_AVX512 static void finish(float* out, int64_t ld_out, State (&s)[V], const View& w, int64_t r, const Vectors& vs) {
    const TileInputs<V> in(vs);
    for (int v = 0; v < V; ++v)
      out[v * ld_out] = half_tail<Bf16>(_mm512_reduce_add_ps(_mm512_add_ps(s[v].a0, s[v].a1)), row(w, r), in.x[v], body(w), w.cols);
  }
};

// ---- AVX-512 BF16: affine 4-bit, group size a multiple of 64 ----
//
// Why: at one thread the f32 kernel above is compute-bound (per 32 weights a widening, an and, a
// shift, two int->float conversions and two FMAs). Here a code 0..15 becomes its bf16 value by a
// table lookup (vpermw), and vdpbf16ps does 32 products per instruction. x is split into
// hi = bf16(x) and lo = bf16(x - hi); every product of a code (4 significant bits) with hi or lo
// (8 bits) is exact in f32, so the only error beyond f32 rounding is |x - (hi + lo)| <= 2^-16 |x|
// (and x below 2^-126 counts as 0: vdpbf16ps and the conversion flush denormals).
//
// Prepared x, per 64-element chunk, as 128 bf16 words: [hi of the 32 even elements, hi of the
// odd ones, lo of the even, lo of the odd]. Byte j of a chunk's 32 weight bytes holds elements
// 2j (low nibble) and 2j+1 (high nibble), so widening the bytes to words lines them up with
// x's even and odd halves: word pair (2i, 2i+1) of both operands feeds f32 lane i.

constexpr int64_t BF16_CHUNK = 64;  // weights per step; xp words per chunk: 2 * BF16_CHUNK

TPCLI_AVX512BF16 void prepare4_bf16_512(float* xp, const float* x, int64_t cols) {
  auto* out = reinterpret_cast<uint16_t*>(xp);  // [cols / 64][128] words: the same bytes as x
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t c = 0; c < cols; c += BF16_CHUNK) {
    __m512 parts[4];  // even 0..15, even 16..31, odd 0..15, odd 16..31 of the chunk
    for (int h = 0; h < 2; ++h) {
      const __m512 a = _mm512_loadu_ps(x + c + 32 * h), b = _mm512_loadu_ps(x + c + 32 * h + 16);
      parts[h] = _mm512_permutex2var_ps(a, even, b);
      parts[2 + h] = _mm512_permutex2var_ps(a, odd, b);
    }
    for (int k = 0; k < 2; ++k) {  // k = 0 even, 1 odd
      const __m512i hi = bf16_halves(parts[2 * k], parts[2 * k + 1]);
      const __m512 r0 = _mm512_sub_ps(parts[2 * k], bf16_to_f32_16(_mm512_castsi512_si256(hi)));
      const __m512 r1 = _mm512_sub_ps(parts[2 * k + 1], bf16_to_f32_16(_mm512_extracti64x4_epi64(hi, 1)));
      _mm512_storeu_si512(out + 2 * c + 32 * k, hi);
      _mm512_storeu_si512(out + 2 * c + 64 + 32 * k, bf16_halves(r0, r1));
    }
  }
}

// One row's running sum over a group: `a` += the chunk's codes times prepared x. Pairs of rows and
// single rows call this, and the batch kernel takes its four steps in the same order, so a row's
// value depends on neither its neighbours nor the other vectors.
TPCLI_AVX512BF16 __m512 codes_dot_bf16(__m512 a, const CodesBf16& codes, const uint16_t* xc) {
  a = _mm512_dpbf16_ps(a, codes.even, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xc)));
  a = _mm512_dpbf16_ps(a, codes.odd, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xc + 32)));
  a = _mm512_dpbf16_ps(a, codes.even, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xc + 64)));
  return _mm512_dpbf16_ps(a, codes.odd, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xc + 96)));
}

TPCLI_AVX512BF16 __m512 chunk_dot_bf16(__m512 a, const uint8_t* q, const uint16_t* xc, __m512i table) {
  return codes_dot_bf16(a, chunk_codes_bf16(q, table), xc);
}

TPCLI_AVX512BF16 void affine4_bf16_rows_512(float* out, const View& w, const float* xp, const float* xsum, int64_t r0,
                                            int64_t r1) {
  const int64_t GS = w.format.group_size, G = w.cols / GS;
  const auto* x = reinterpret_cast<const uint16_t*>(xp);
  const __m512i table = code_table_bf16();
  int64_t r = r0;
  // Two rows per pass: each x load serves both, and the two rows' chains overlap.
  for (; r + 2 <= r1; r += 2) {
    const uint8_t* q0 = w.data + r * w.row_bytes;
    const uint8_t* q1 = q0 + w.row_bytes;
    const float *s0 = w.scales + r * G, *s1 = s0 + G, *b0 = w.biases + r * G, *b1 = b0 + G;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float bias0 = 0.0f, bias1 = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      for (int64_t c = g * GS; c < (g + 1) * GS; c += BF16_CHUNK) {
        _mm_prefetch(reinterpret_cast<const char*>(q0 + c / 2 + PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(q1 + c / 2 + PREFETCH_BYTES), _MM_HINT_T0);
        a0 = chunk_dot_bf16(a0, q0 + c / 2, x + 2 * c, table);
        a1 = chunk_dot_bf16(a1, q1 + c / 2, x + 2 * c, table);
      }
      acc0 = _mm512_fmadd_ps(a0, _mm512_set1_ps(s0[g]), acc0);
      acc1 = _mm512_fmadd_ps(a1, _mm512_set1_ps(s1[g]), acc1);
      bias0 = std::fma(b0[g], xsum[g], bias0);
      bias1 = std::fma(b1[g], xsum[g], bias1);
    }
    out[r - r0] = _mm512_reduce_add_ps(acc0) + bias0;
    out[r - r0 + 1] = _mm512_reduce_add_ps(acc1) + bias1;
  }
  for (; r < r1; ++r) {
    const uint8_t* q = w.data + r * w.row_bytes;
    const float *s = w.scales + r * G, *b = w.biases + r * G;
    __m512 acc = _mm512_setzero_ps();
    float bias = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      __m512 a = _mm512_setzero_ps();
      for (int64_t c = g * GS; c < (g + 1) * GS; c += BF16_CHUNK) a = chunk_dot_bf16(a, q + c / 2, x + 2 * c, table);
      acc = _mm512_fmadd_ps(a, _mm512_set1_ps(s[g]), acc);
      bias = std::fma(b[g], xsum[g], bias);
    }
    out[r - r0] = _mm512_reduce_add_ps(acc) + bias;
  }
}

// affine4_bf16_rows_512 for several rows and vectors: a register tile of ROWS rows x V vectors, a
// chunk's codes looked up once for the V vectors and each prepared x vector loaded once for the
// rows. acc and the bias sum stay in State (memory), touched once a group, as AffineTile512.
struct Affine4Bf16Tile512 {
  static constexpr int MAX_V = 6, ROWS = 2;  // 12 group sums, 4 code vectors, an x vector and the table
  struct State {
    __m512 acc;
    float bias;
  };
  static int64_t unit(const View& w) { return w.format.group_size; }
  static int64_t body(const View& w) { return w.cols; }

  template <int RT, int V>
  TPCLI_AVX512BF16 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const int64_t GS = w.format.group_size, G = w.cols / GS;
    const __m512i table = code_table_bf16();
    const uint8_t* q[RT];
    for (int i = 0; i < RT; ++i) q[i] = w.data + (r + i) * w.row_bytes;
    const uint16_t* xv[V];  // prepared x: bf16 words (prepare4_bf16_512)
    for (int v = 0; v < V; ++v) xv[v] = reinterpret_cast<const uint16_t*>(in.x[v]);
    for (int64_t g = c0 / GS; g < c1 / GS; ++g) {
      __m512 a[RT][V];
      for (int i = 0; i < RT; ++i)
        for (int v = 0; v < V; ++v) a[i][v] = _mm512_setzero_ps();
      for (int64_t c = g * GS; c < (g + 1) * GS; c += BF16_CHUNK) {
        CodesBf16 codes[RT];
        for (int i = 0; i < RT; ++i) {
          _mm_prefetch(reinterpret_cast<const char*>(q[i] + c / 2 + PREFETCH_BYTES), _MM_HINT_T0);
          codes[i] = chunk_codes_bf16(q[i] + c / 2, table);
        }
        // codes_dot_bf16's four steps, each x vector shared by the rows.
        for (int v = 0; v < V; ++v)
          for (int k = 0; k < 4; ++k) {
            const __m512bh xk = reinterpret_cast<__m512bh>(in_register(_mm512_loadu_si512(xv[v] + 2 * c + 32 * k)));
            for (int i = 0; i < RT; ++i) a[i][v] = _mm512_dpbf16_ps(a[i][v], k % 2 ? codes[i].odd : codes[i].even, xk);
          }
      }
      for (int i = 0; i < RT; ++i) {
        const __m512 scale = _mm512_set1_ps(w.scales[(r + i) * G + g]);
        const float bias = w.biases[(r + i) * G + g];
        for (int v = 0; v < V; ++v) {
          s[i][v].acc = _mm512_fmadd_ps(a[i][v], scale, s[i][v].acc);
          s[i][v].bias = std::fma(bias, in.sum[v][g], s[i][v].bias);
        }
      }
    }
  }

  template <int V>
  TPCLI_AVX512BF16 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v) out[v * ld_out] = _mm512_reduce_add_ps(s[v].acc) + s[v].bias;
  }
};

// ---- AVX2 ----

TPCLI_AVX2 float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

TPCLI_AVX2 void f32_rows_256(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  const int64_t k = w.cols;
  const auto* base = reinterpret_cast<const float*>(w.data);
  int64_t i = r0;
  for (; i + 4 <= r1; i += 4) {
    const float* wr[4] = {base + i * k, base + (i + 1) * k, base + (i + 2) * k, base + (i + 3) * k};
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t p = 0;
    for (; p + 8 <= k; p += 8) {
      const __m256 xv = _mm256_loadu_ps(x + p);
      for (int j = 0; j < 4; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(wr[j] + p), xv, a[j]);
    }
    for (int j = 0; j < 4; ++j) out[i - r0 + j] = f32_tail(hsum256(a[j]), wr[j], x, p, k);
  }
  for (; i < r1; ++i) {
    const float* row = base + i * k;
    __m256 a = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= k; p += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(row + p), _mm256_loadu_ps(x + p), a);
    out[i - r0] = f32_tail(hsum256(a), row, x, p, k);
  }
}

// f32_rows_256 for several vectors (every row there is one 8-lane chain, its sum and a scalar
// tail, in the 4-row passes and after them alike): a weight vector loaded once for all of them.
struct F32Tile256 {
  static constexpr int MAX_V = 4, ROWS = 3;  // 12 running sums, 3 weight vectors and an x vector: the 16 registers
  struct State {
    __m256 a;
  };
  static int64_t unit(const View&) { return 8; }
  static int64_t body(const View& w) { return w.cols / 8 * 8; }

  template <int RT, int V>
  TPCLI_AVX2 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const float* row[RT];
    __m256 a[RT][V];
    for (int i = 0; i < RT; ++i) {
      row[i] = reinterpret_cast<const float*>(w.data) + (r + i) * w.cols;
      for (int v = 0; v < V; ++v) a[i][v] = s[i][v].a;
    }
    for (int64_t p = c0; p < c1; p += 8) {
      __m256 u[RT];
      for (int i = 0; i < RT; ++i) u[i] = _mm256_loadu_ps(row[i] + p);
      for (int v = 0; v < V; ++v) {
        const __m256 xv = _mm256_loadu_ps(in.x[v] + p);
        for (int i = 0; i < RT; ++i) a[i][v] = _mm256_fmadd_ps(u[i], xv, a[i][v]);
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) s[i][v].a = a[i][v];
  }

  template <int V>
  TPCLI_AVX2 static void finish(float* out, int64_t ld_out, State (&s)[V], const View& w, int64_t r, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const auto* row = reinterpret_cast<const float*>(w.data) + r * w.cols;
    for (int v = 0; v < V; ++v) out[v * ld_out] = f32_tail(hsum256(s[v].a), row, in.x[v], body(w), w.cols);
  }
};

TPCLI_AVX2 void prepare4_256(float* xp, const float* x, int64_t cols) {
  for (int64_t c = 0; c < cols; c += 16)
    for (int j = 0; j < 8; ++j) {
      xp[c + j] = x[c + 2 * j];
      xp[c + 8 + j] = x[c + 2 * j + 1];
    }
}

TPCLI_AVX2 __m256i bytes8_256(const uint8_t* q) {
  int64_t v;
  std::memcpy(&v, q, 8);
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v));
}

TPCLI_AVX2 void affine_rows_256(float* out, const View& w, const float* x, const float* xsum, int64_t r0, int64_t r1) {
  const int bits = w.format.bits, GS = w.format.group_size;
  const int64_t G = w.cols / GS;
  const __m256i low4 = _mm256_set1_epi32(15);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.data + r * w.row_bytes;
    __m256 acc = _mm256_setzero_ps();
    float bias_part = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      __m256 ga = _mm256_setzero_ps(), gb = _mm256_setzero_ps();
      const int64_t c0 = g * GS;
      if (bits == 8) {
        for (int64_t c = c0; c < c0 + GS; c += 16) {
          ga = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bytes8_256(q + c)), _mm256_loadu_ps(x + c), ga);
          gb = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bytes8_256(q + c + 8)), _mm256_loadu_ps(x + c + 8), gb);
        }
      } else {
        for (int64_t c = c0; c < c0 + GS; c += 16) {
          const __m256i v = bytes8_256(q + c / 2);
          ga = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, low4)), _mm256_loadu_ps(x + c), ga);
          gb = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), _mm256_loadu_ps(x + c + 8), gb);
        }
      }
      acc = _mm256_fmadd_ps(_mm256_add_ps(ga, gb), _mm256_set1_ps(w.scales[r * G + g]), acc);
      bias_part = std::fma(w.biases[r * G + g], xsum[g], bias_part);
    }
    out[r - r0] = hsum256(acc) + bias_part;
  }
}

// affine_rows_256 for several rows and vectors: a register tile of ROWS rows x V vectors, 16 codes
// widened once a step for the V vectors and each x vector loaded once for the rows. acc and the
// bias sum stay in State (memory), touched once a group, as AffineTile512: the ga/gb chains alone
// fill the registers.
struct AffineTile256 {
  static constexpr int MAX_V = 2, ROWS = 2;  // 8 ga/gb chains, 4 widened halves, an x vector, the nibble mask
  struct State {
    __m256 acc;
    float bias;
  };
  static int64_t unit(const View& w) { return w.format.group_size; }
  static int64_t body(const View& w) { return w.cols; }

  template <int RT, int V>
  TPCLI_AVX2 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const int bits = w.format.bits, GS = w.format.group_size;
    const int64_t G = w.cols / GS;
    const __m256i low4 = _mm256_set1_epi32(15);
    const uint8_t* q[RT];
    for (int i = 0; i < RT; ++i) q[i] = w.data + (r + i) * w.row_bytes;
    for (int64_t g = c0 / GS; g < c1 / GS; ++g) {
      __m256 ga[RT][V], gb[RT][V];
      for (int i = 0; i < RT; ++i)
        for (int v = 0; v < V; ++v) ga[i][v] = gb[i][v] = _mm256_setzero_ps();
      for (int64_t c = g * GS; c < (g + 1) * GS; c += 16) {
        __m256 u0[RT], u1[RT];
        for (int i = 0; i < RT; ++i) {
          if (bits == 8) {
            u0[i] = _mm256_cvtepi32_ps(bytes8_256(q[i] + c));
            u1[i] = _mm256_cvtepi32_ps(bytes8_256(q[i] + c + 8));
          } else {  // 4 bits
            const __m256i b = bytes8_256(q[i] + c / 2);
            u0[i] = _mm256_cvtepi32_ps(_mm256_and_si256(b, low4));
            u1[i] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
          }
        }
        for (int v = 0; v < V; ++v) {
          const __m256 x0 = in_register(_mm256_loadu_ps(in.x[v] + c));
          for (int i = 0; i < RT; ++i) ga[i][v] = _mm256_fmadd_ps(u0[i], x0, ga[i][v]);
          const __m256 x1 = in_register(_mm256_loadu_ps(in.x[v] + c + 8));
          for (int i = 0; i < RT; ++i) gb[i][v] = _mm256_fmadd_ps(u1[i], x1, gb[i][v]);
        }
      }
      for (int i = 0; i < RT; ++i) {
        const __m256 scale = _mm256_set1_ps(w.scales[(r + i) * G + g]);
        const float bias = w.biases[(r + i) * G + g];
        for (int v = 0; v < V; ++v) {
          s[i][v].acc = _mm256_fmadd_ps(_mm256_add_ps(ga[i][v], gb[i][v]), scale, s[i][v].acc);
          s[i][v].bias = std::fma(bias, in.sum[v][g], s[i][v].bias);
        }
      }
    }
  }

  template <int V>
  TPCLI_AVX2 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v) out[v * ld_out] = hsum256(s[v].acc) + s[v].bias;
  }
};

TPCLI_AVX2 __m256 e4m3x8_256(const uint8_t* q) {
  int64_t raw;
  std::memcpy(&raw, q, 8);
  const __m128i b = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(raw));
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
  const __m128i mag = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7);
  return _mm256_cvtph_ps(_mm_or_si128(sign, mag));
}

TPCLI_AVX2 void mxfp8_rows_256(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  const int64_t G = w.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.data + r * w.row_bytes;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      __m256 ga = _mm256_setzero_ps(), gb = _mm256_setzero_ps();
      for (int64_t c = g * 32; c < g * 32 + 32; c += 16) {
        ga = _mm256_fmadd_ps(e4m3x8_256(q + c), _mm256_loadu_ps(x + c), ga);
        gb = _mm256_fmadd_ps(e4m3x8_256(q + c + 8), _mm256_loadu_ps(x + c + 8), gb);
      }
      acc = _mm256_fmadd_ps(_mm256_add_ps(ga, gb), _mm256_set1_ps(scale_of_e8m0(w.scale_bytes[r * G + g])), acc);
    }
    out[r - r0] = hsum256(acc);
  }
}

// mxfp8_rows_256 for several vectors: 16 codes converted once a step for all of them. One row a
// step: a tile of two rows x two vectors (ga, gb per pair, acc in State) measured slower.
struct Mxfp8Tile256 {
  static constexpr int MAX_V = 4;
  struct State {
    __m256 acc;
  };
  static int64_t unit(const View&) { return 32; }
  static int64_t body(const View& w) { return w.cols; }

  template <int V>
  TPCLI_AVX2 static void columns(State (&s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const int64_t G = w.cols / 32;
    const uint8_t* q = w.data + r * w.row_bytes;
    __m256 acc[V];
    for (int v = 0; v < V; ++v) acc[v] = s[v].acc;
    for (int64_t g = c0 / 32; g < c1 / 32; ++g) {
      __m256 ga[V], gb[V];
      for (int v = 0; v < V; ++v) ga[v] = gb[v] = _mm256_setzero_ps();
      for (int64_t c = g * 32; c < g * 32 + 32; c += 16) {
        const __m256 e0 = e4m3x8_256(q + c), e1 = e4m3x8_256(q + c + 8);
        for (int v = 0; v < V; ++v) {
          ga[v] = _mm256_fmadd_ps(e0, _mm256_loadu_ps(in.x[v] + c), ga[v]);
          gb[v] = _mm256_fmadd_ps(e1, _mm256_loadu_ps(in.x[v] + c + 8), gb[v]);
        }
      }
      const __m256 scale = _mm256_set1_ps(scale_of_e8m0(w.scale_bytes[r * G + g]));
      for (int v = 0; v < V; ++v) acc[v] = _mm256_fmadd_ps(_mm256_add_ps(ga[v], gb[v]), scale, acc[v]);
    }
    for (int v = 0; v < V; ++v) s[v].acc = acc[v];
  }

  template <int V>
  TPCLI_AVX2 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v) out[v * ld_out] = hsum256(s[v].acc);
  }
};

template <bool Bf16>
TPCLI_AVX2 void half_rows_256(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto* h = reinterpret_cast<const uint16_t*>(w.data + r * w.row_bytes);
    __m256 a0 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= w.cols; c += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + c));
      __m256 f;
      if constexpr (Bf16) f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
      else f = _mm256_cvtph_ps(v);
      a0 = _mm256_fmadd_ps(f, _mm256_loadu_ps(x + c), a0);
    }
    out[r - r0] = half_tail<Bf16>(hsum256(a0), h, x, c, w.cols);
  }
}

// half_rows_256 for several rows and vectors: a register tile of ROWS rows x V vectors, as
// F32Tile256, 8 weights converted once a step for the V vectors.
template <bool Bf16>
struct HalfTile256 {
  static constexpr int MAX_V = 4, ROWS = 3;  // 12 running sums, 3 converted weight vectors and an x vector: the 16 registers
  struct State {
    __m256 a0;
  };
  static int64_t unit(const View&) { return 8; }
  static int64_t body(const View& w) { return w.cols / 8 * 8; }

  static const uint16_t* row(const View& w, int64_t r) { return reinterpret_cast<const uint16_t*>(w.data + r * w.row_bytes); }

  template <int RT, int V>
  TPCLI_AVX2 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const uint16_t* h[RT];
    __m256 a0[RT][V];
    for (int i = 0; i < RT; ++i) {
      h[i] = row(w, r + i);
      for (int v = 0; v < V; ++v) a0[i][v] = s[i][v].a0;
    }
    for (int64_t c = c0; c < c1; c += 8) {
      __m256 f[RT];
      for (int i = 0; i < RT; ++i) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h[i] + c));
        if constexpr (Bf16) f[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
        else f[i] = _mm256_cvtph_ps(raw);
      }
      for (int v = 0; v < V; ++v) {
        const __m256 xv = in_register(_mm256_loadu_ps(in.x[v] + c));
        for (int i = 0; i < RT; ++i) a0[i][v] = _mm256_fmadd_ps(f[i], xv, a0[i][v]);
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) s[i][v].a0 = a0[i][v];
  }

  template <int V>
  TPCLI_AVX2 static void finish(float* out, int64_t ld_out, State (&s)[V], const View& w, int64_t r, const Vectors& vs) {
    const TileInputs<V> in(vs);
    for (int v = 0; v < V; ++v) out[v * ld_out] = half_tail<Bf16>(hsum256(s[v].a0), row(w, r), in.x[v], body(w), w.cols);
  }
};

}  // namespace

MatvecKernel avx2_kernel(const WeightFormat& f) {
  switch (f.kind) {
    case WeightKind::BF16: return {nullptr, half_rows_256<true>, in_vector_tiles<HalfTile256<true>>};
    case WeightKind::F16: return {nullptr, half_rows_256<false>, in_vector_tiles<HalfTile256<false>>};
    case WeightKind::Mxfp8: return {nullptr, mxfp8_rows_256, in_vector_tiles<Mxfp8Tile256>};
    case WeightKind::Affine:
      if (f.bits == 8) return {nullptr, affine_rows_256, in_vector_tiles<AffineTile256>};
      if (f.bits == 4) return {prepare4_256, affine_rows_256, in_vector_tiles<AffineTile256>};
      return {};
    case WeightKind::F32: return {nullptr, f32_rows_256, in_vector_tiles<F32Tile256>};
    case WeightKind::Ggml: return ggml_avx2_kernel(f);
  }
  return {};
}

MatvecKernel avx512_kernel(const WeightFormat& f) {
  switch (f.kind) {
    case WeightKind::BF16: return {nullptr, half_rows_512<true>, in_vector_tiles<HalfTile512<true>>};
    case WeightKind::F16: return {nullptr, half_rows_512<false>, in_vector_tiles<HalfTile512<false>>};
    case WeightKind::Mxfp8: return {nullptr, mxfp8_rows_512, in_vector_tiles<Mxfp8Tile512>};
    case WeightKind::Affine:
      if (f.bits == 8) return {nullptr, affine_rows_512, affine_batch_512<8>(f.group_size)};
      if (f.bits == 4 && f.group_size % BF16_CHUNK == 0 && cpu_has_avx512_bf16())
        return {prepare4_bf16_512, affine4_bf16_rows_512, in_vector_tiles<Affine4Bf16Tile512>};
      if (f.bits == 4) return {prepare4_512, affine_rows_512, affine_batch_512<4>(f.group_size)};
      return {};
    case WeightKind::F32: return {nullptr, f32_rows_512, f32_rows_batch_512};
    case WeightKind::Ggml: return ggml_avx512_kernel(f);
  }
  return {};
}

#else  // not x86-64: the plain C++ kernels only

MatvecKernel avx2_kernel(const WeightFormat&) { return {}; }
MatvecKernel avx512_kernel(const WeightFormat&) { return {}; }

#endif

}  // namespace tpcli::tensor::kernels
