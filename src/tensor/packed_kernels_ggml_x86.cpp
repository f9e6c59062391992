// AVX2 and AVX-512 matrix-vector kernels for ggml's block types (tensor/ggml_blocks.h): the blocks
// are read as a GGUF file stores them and unpacked in registers, never written out as floats.
//
// Why they differ from the plain C++ kernel (which decodes each block as ggml's dequantizer does,
// then multiplies): a block's scale is applied once to a group's sum of code * x, and a group's
// offset (-min, or -32 and -8 for the symmetric types' codes) once to the group's sum of x, which
// the caller computes once for all rows (WeightFormat::sum_group). A weight then costs a widening,
// a mask or shift, a conversion and an FMA. The values differ from dequantize-then-multiply by f32
// rounding only: the tests hold every set within 1e-4 of double products of ggml's dequantization.
// Each row is its own chains in a fixed order (the row range, the other rows and the other vectors
// of a batch change no bit).
//
// Layouts (ggml_blocks.h), the parts these kernels read:
//   Q8_0  half d; i8 q[32]
//   Q4_K  half d, dmin; u8 scales[12]; u8 qs[128]: bytes 32j..32j+31 hold group 2j in their low
//         nibbles and group 2j+1 in their high ones, element l of each at byte l (natural order)
//   Q6_K  u8 ql[128]; u8 qh[64]; i8 scales[16]; half d: per half of 128, element l < 32 of the four
//         quarters from ql[l] low, ql[l + 32] low, ql[l] high, ql[l + 32] high, with bit pairs
//         0-1, 2-3, 4-5, 6-7 of qh[l] above them; 16 groups of 16
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/packed_kernels.h"
#include "tensor/x86_bf16_codes.h"
#include "tensor/x86_tiles.h"

#if defined(__x86_64__)
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // _mm512_reduce_add_ps (packed_kernels_x86.cpp)
#pragma GCC diagnostic ignored "-Wuninitialized"
#define TPCLI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TPCLI_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#define TPCLI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

namespace tpcli::tensor::kernels {

#if defined(__x86_64__)

namespace {

constexpr int QK_K = 256;
constexpr int Q8_0_BYTES = 34, Q4_K_BYTES = 144, Q6_K_BYTES = 210;

__attribute__((target("f16c"))) float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

TPCLI_AVX2 float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

TPCLI_AVX2 __m128i load8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
TPCLI_AVX2 __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// Q4_K's eight 6-bit scales and mins from its 12 scale bytes, as bytes 0-7 of two words. Groups
// 0-3 keep the low six bits of bytes 0-3 (scales) and 4-7 (mins); groups 4-7 take their low four
// bits from the nibbles of bytes 8-11 and their top two from the spare high bits of bytes 0-7.
struct ScaleMinBytes {
  uint64_t scales, mins;
};
ScaleMinBytes q4_k_scale_min_bytes(const uint8_t* b) {
  uint32_t w[3];
  std::memcpy(w, b, 12);
  const uint32_t six = 0x3F3F3F3Fu, four = 0x0F0F0F0Fu, two = 0x03030303u;
  const uint32_t scales_high = (w[2] & four) | (((w[0] >> 6) & two) << 4);
  const uint32_t mins_high = ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4);
  return {(w[0] & six) | (uint64_t{scales_high} << 32), (w[1] & six) | (uint64_t{mins_high} << 32)};
}

// The eight groups' d * scale and dmin * min, each product as ggml's dequantizer rounds it.
TPCLI_AVX2 inline __attribute__((always_inline)) void q4_k_scales(const uint8_t* block, float* scale, __m256* min) {
  const ScaleMinBytes sm = q4_k_scale_min_bytes(block + 4);
  const __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sm.scales))));
  const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sm.mins))));
  _mm256_storeu_ps(scale, _mm256_mul_ps(_mm256_set1_ps(half_at(block)), s));
  *min = _mm256_mul_ps(_mm256_set1_ps(half_at(block + 2)), m);
}

// ---- one row, V vectors ----
//
// Each type's kernel is a struct with row<V>(row, cols, x, xsum, out): row `row` times V vectors,
// out[v] for vector v. A block's codes are unpacked and its scales decoded once for the V vectors;
// each vector's sums are its own chains, the same operations in the same order whatever V is, so a
// batch gives each vector the bits it gets alone.
template <int V>
struct Inputs {
  const float* x[V];
  const float* sum[V];
};

template <class Type, int V>
void row_range(float* out, int64_t ld_out, const View& w, const Inputs<V>& in, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float o[V];
    Type::template row<V>(w.data + r * w.row_bytes, w.cols, in, o);
    for (int v = 0; v < V; ++v) out[v * ld_out + r - r0] = o[v];
  }
}

template <class Type>
void single_rows(float* out, const View& w, const float* x, const float* xsum, int64_t r0, int64_t r1) {
  row_range<Type, 1>(out, 0, w, Inputs<1>{{x}, {xsum}}, r0, r1);
}

// The vectors in tiles of Type::MAX_V (the last one smaller), row by row, so a row read from memory
// for the first tile comes from L1 for the others.
template <class Type, int V>
void tile_of(float* out_row, int64_t ld_out, const View& w, const Vectors& x, int64_t first, int64_t count, int64_t r) {
  if constexpr (V > 1) {
    if (count < V) return tile_of<Type, V - 1>(out_row, ld_out, w, x, first, count, r);
  }
  Inputs<V> in;
  for (int v = 0; v < V; ++v) in.x[v] = x.x(first + v), in.sum[v] = x.sum(first + v);
  float o[V];
  Type::template row<V>(w.data + r * w.row_bytes, w.cols, in, o);
  for (int v = 0; v < V; ++v) out_row[(first + v) * ld_out] = o[v];
}

template <class Type>
void batch_rows(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t v = 0; v < x.count; v += Type::MAX_V)
      tile_of<Type, Type::MAX_V>(out + r - r0, ld_out, w, x, v, std::min<int64_t>(Type::MAX_V, x.count - v), r);
}

template <class Type>
MatvecKernel kernel_of() {
  return {nullptr, single_rows<Type>, batch_rows<Type>};
}

// ---- AVX-512 ----

struct Q4_Kx512 {
  static constexpr int MAX_V = 4;
  template <int V>
  TPCLI_AVX512 static void row(const uint8_t* row, int64_t cols, const Inputs<V>& in, float* out) {
    const __m512i low4 = _mm512_set1_epi32(15);
    __m512 acc[V][2];
    __m256 min_acc[V];
    for (int v = 0; v < V; ++v) acc[v][0] = acc[v][1] = _mm512_setzero_ps(), min_acc[v] = _mm256_setzero_ps();
    for (int64_t b = 0; b < cols / QK_K; ++b) {
      const uint8_t* block = row + b * Q4_K_BYTES;
      alignas(32) float scale[8];
      __m256 min;
      q4_k_scales(block, scale, &min);
      for (int v = 0; v < V; ++v) min_acc[v] = _mm256_fmadd_ps(min, _mm256_loadu_ps(in.sum[v] + 8 * b), min_acc[v]);
      for (int j = 0; j < 4; ++j) {
        const uint8_t* q = block + 16 + 32 * j;
        _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_BYTES), _MM_HINT_T0);
        const __m512i b0 = _mm512_cvtepu8_epi32(load16(q)), b1 = _mm512_cvtepu8_epi32(load16(q + 16));
        const __m512 lo0 = _mm512_cvtepi32_ps(_mm512_and_si512(b0, low4)), lo1 = _mm512_cvtepi32_ps(_mm512_and_si512(b1, low4));
        const __m512 hi0 = _mm512_cvtepi32_ps(_mm512_srli_epi32(b0, 4)), hi1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(b1, 4));
        const __m512 s0 = _mm512_set1_ps(scale[2 * j]), s1 = _mm512_set1_ps(scale[2 * j + 1]);
        for (int v = 0; v < V; ++v) {
          const float* xg = in.x[v] + b * QK_K + 64 * j;
          const __m512 ga = _mm512_fmadd_ps(lo1, _mm512_loadu_ps(xg + 16), _mm512_mul_ps(lo0, _mm512_loadu_ps(xg)));
          const __m512 gb = _mm512_fmadd_ps(hi1, _mm512_loadu_ps(xg + 48), _mm512_mul_ps(hi0, _mm512_loadu_ps(xg + 32)));
          acc[v][0] = _mm512_fmadd_ps(ga, s0, acc[v][0]);
          acc[v][1] = _mm512_fmadd_ps(gb, s1, acc[v][1]);
        }
      }
    }
    for (int v = 0; v < V; ++v) out[v] = _mm512_reduce_add_ps(_mm512_add_ps(acc[v][0], acc[v][1])) - hsum256(min_acc[v]);
  }
};

// Q4_K on CPUs with AVX512_BF16: a code 0..15 becomes its bf16 value by a table lookup and
// vdpbf16ps does 32 products an instruction, against x split into bf16 halves, hi = bf16(x) and
// lo = bf16(x - hi) (the affine 4-bit path's method, packed_kernels_x86.cpp: each product of a code
// with a half is exact in f32; x loses at most 2^-16 of itself, and x below 2^-126 counts as 0).
// Prepared x, per 32 elements: [hi of the 32, lo of the 32], so 32 codes in element order (one
// Q4_K group, two Q6_K groups) line up with their x.
TPCLI_AVX512BF16 void prepare_halves_512(float* xp, const float* x, int64_t cols) {
  auto* out = reinterpret_cast<uint16_t*>(xp);  // [cols / 32][64] words: the same bytes as x
  for (int64_t c = 0; c < cols; c += 32) {
    const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + c + 16);
    const __m512i hi = bf16_halves(a, b);
    const __m512 ra = _mm512_sub_ps(a, bf16_to_f32_16(_mm512_castsi512_si256(hi)));
    const __m512 rb = _mm512_sub_ps(b, bf16_to_f32_16(_mm512_extracti64x4_epi64(hi, 1)));
    _mm512_storeu_si512(out + 2 * c, hi);
    _mm512_storeu_si512(out + 2 * c + 32, bf16_halves(ra, rb));
  }
}

// 32 codes times the prepared x of their 32 elements (hi, lo): lane i holds elements 2i and 2i + 1.
TPCLI_AVX512BF16 __m512 halves_dot(__m512bh codes, __m512bh hi, __m512bh lo) {
  return _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), codes, hi), codes, lo);
}

TPCLI_AVX512BF16 __m512bh prepared_words(const float* p) {  // 32 bf16 words: 16 floats' bytes
  return reinterpret_cast<__m512bh>(in_register(_mm512_loadu_si512(p)));
}

// The bf16 kernels are register tiles of ROWS rows x V vectors (x86_tiles.h): a block's codes are
// looked up once for the V vectors and each prepared x vector loaded once for the rows. One vector
// alone (`rows`) runs the same tile, so its bits are the batch's.
struct Q4_KTileBf16 {
  static constexpr int MAX_V = 4, ROWS = 2;  // 16 sums, 4 code vectors, 4 x halves, the table
  struct State {
    __m512 acc[2];  // the even and the odd groups of the row
    __m256 min;     // the groups' dmin * min times their sums of x
  };
  static int64_t unit(const View&) { return QK_K; }
  static int64_t body(const View& w) { return w.cols; }

  template <int RT, int V>
  TPCLI_AVX512BF16 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const __m512i table = code_table_bf16();
    __m512 acc[RT][V][2];
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) acc[i][v][0] = s[i][v].acc[0], acc[i][v][1] = s[i][v].acc[1];
    for (int64_t b = c0 / QK_K; b < c1 / QK_K; ++b) {
      const uint8_t* block[RT];
      alignas(32) float scale[RT][8];
      for (int i = 0; i < RT; ++i) {
        block[i] = w.data + (r + i) * w.row_bytes + b * Q4_K_BYTES;
        for (int p = 0; p < Q4_K_BYTES; p += 64) _mm_prefetch(reinterpret_cast<const char*>(block[i] + p + PREFETCH_BYTES), _MM_HINT_T0);
        __m256 min;
        q4_k_scales(block[i], scale[i], &min);
        for (int v = 0; v < V; ++v) s[i][v].min = _mm256_fmadd_ps(min, _mm256_loadu_ps(in.sum[v] + 8 * b), s[i][v].min);
      }
      for (int j = 0; j < 4; ++j) {
        CodesBf16 codes[RT];
        for (int i = 0; i < RT; ++i) {
          codes[i] = chunk_codes_bf16(block[i] + 16 + 32 * j, table);
        }
        for (int v = 0; v < V; ++v) {
          const float* xc = in.x[v] + b * QK_K + 64 * j;  // prepared: 32 elements take 32 floats' bytes
          const __m512bh a_hi = prepared_words(xc), a_lo = prepared_words(xc + 16);
          const __m512bh b_hi = prepared_words(xc + 32), b_lo = prepared_words(xc + 48);
          for (int i = 0; i < RT; ++i) {
            acc[i][v][0] = _mm512_fmadd_ps(halves_dot(codes[i].even, a_hi, a_lo), _mm512_set1_ps(scale[i][2 * j]), acc[i][v][0]);
            acc[i][v][1] = _mm512_fmadd_ps(halves_dot(codes[i].odd, b_hi, b_lo), _mm512_set1_ps(scale[i][2 * j + 1]), acc[i][v][1]);
          }
        }
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) s[i][v].acc[0] = acc[i][v][0], s[i][v].acc[1] = acc[i][v][1];
  }

  template <int V>
  TPCLI_AVX512BF16 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v) out[v * ld_out] = _mm512_reduce_add_ps(_mm512_add_ps(s[v].acc[0], s[v].acc[1])) - hsum256(s[v].min);
  }
};

// Q6_K: code q (0..63) stands for q - 32; the -32 is applied once per group through the group's
// sum of x (sum_group 16), so a group's 16 codes are one vector of lanes converted as they are.
struct Q6_Kx512 {
  static constexpr int MAX_V = 4;
  template <int V>
  TPCLI_AVX512 static void row(const uint8_t* row, int64_t cols, const Inputs<V>& in, float* out) {
    const __m512i low4 = _mm512_set1_epi32(15), bits45 = _mm512_set1_epi32(48);
    __m512 acc[V][4], offset_acc[V];
    for (int v = 0; v < V; ++v) {
      for (int k = 0; k < 4; ++k) acc[v][k] = _mm512_setzero_ps();
      offset_acc[v] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < cols / QK_K; ++b) {
      const uint8_t* block = row + b * Q6_K_BYTES;
      for (int p = 0; p < Q6_K_BYTES; p += 64) _mm_prefetch(reinterpret_cast<const char*>(block + p + PREFETCH_BYTES), _MM_HINT_T0);
      alignas(64) float scale[16];
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(half_at(block + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(block + 192))));
      _mm512_store_ps(scale, s);
      for (int v = 0; v < V; ++v) offset_acc[v] = _mm512_fmadd_ps(s, _mm512_loadu_ps(in.sum[v] + 16 * b), offset_acc[v]);
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = block + 64 * half;
        const uint8_t* qh = block + 128 + 32 * half;
        for (int c = 0; c < 32; c += 16) {
          const __m512i a = _mm512_cvtepu8_epi32(load16(ql + c)), bq = _mm512_cvtepu8_epi32(load16(ql + 32 + c));
          const __m512i h = _mm512_cvtepu8_epi32(load16(qh + c));
          const __m512 q[4] = {
              _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_and_si512(a, low4), _mm512_and_si512(_mm512_slli_epi32(h, 4), bits45))),
              _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_and_si512(bq, low4), _mm512_and_si512(_mm512_slli_epi32(h, 2), bits45))),
              _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_srli_epi32(a, 4), _mm512_and_si512(h, bits45))),
              _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_srli_epi32(bq, 4), _mm512_and_si512(_mm512_srli_epi32(h, 2), bits45)))};
          for (int k = 0; k < 4; ++k) {
            const int element = 128 * half + 32 * k + c;
            const __m512 sk = _mm512_set1_ps(scale[element / 16]);
            for (int v = 0; v < V; ++v) {
              const __m512 p = _mm512_mul_ps(q[k], _mm512_loadu_ps(in.x[v] + b * QK_K + element));
              acc[v][k] = _mm512_fmadd_ps(p, sk, acc[v][k]);
            }
          }
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[v][0], acc[v][1]), _mm512_add_ps(acc[v][2], acc[v][3]));
      out[v] = std::fma(-32.0f, _mm512_reduce_add_ps(offset_acc[v]), _mm512_reduce_add_ps(sum));
    }
  }
};

// Q6_K on CPUs with AVX512_BF16, as Q4_KTileBf16: code q becomes the bf16 of q - 32 through a
// 64-word table (vpermt2w reads 6 index bits), a quarter's 32 codes in one vector, two groups of
// 16: lanes 0-7 take the first group's scale, 8-15 the second's. The -32 is in the table, not
// applied to the group's sum of x: x's bf16 halves miss up to 2^-16 of x, and a sum of q * x, 32
// times the size of the sum of (q - 32) * x, would carry 32 times that error into the difference.
TPCLI_AVX512BF16 __m512i code_table64_bf16(int half) {  // bf16 of 32 * half + 0..31 - 32
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) {
    const float f = static_cast<float>(32 * half + i - 32);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    table[i] = static_cast<uint16_t>(bits >> 16);  // exact: at most 6 significant bits
  }
  return _mm512_load_si512(table);
}

struct Q6_KTileBf16 {
  static constexpr int MAX_V = 4;  // 16 sums, 4 code vectors, 2 x halves, 2 tables
  struct State {
    __m512 acc[4];  // one per quarter of a half
  };
  static int64_t unit(const View&) { return QK_K; }
  static int64_t body(const View& w) { return w.cols; }

  template <int V>
  TPCLI_AVX512BF16 static void columns(State (&s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    const __m512i table_low = code_table64_bf16(0), table_high = code_table64_bf16(1);
    const __m512i low4 = _mm512_set1_epi16(15), bits45 = _mm512_set1_epi16(48);
    const __m512i two_groups = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[V][4];
    for (int v = 0; v < V; ++v)
      for (int k = 0; k < 4; ++k) acc[v][k] = s[v].acc[k];
    for (int64_t b = c0 / QK_K; b < c1 / QK_K; ++b) {
      const uint8_t* block = w.data + r * w.row_bytes + b * Q6_K_BYTES;
      for (int p = 0; p < Q6_K_BYTES; p += 64) _mm_prefetch(reinterpret_cast<const char*>(block + p + PREFETCH_BYTES), _MM_HINT_T0);
      const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(half_at(block + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(block + 192))));
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = block + 64 * half;
        const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql)));
        const __m512i bq = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32)));
        const __m512i h = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half)));
        const __m512i q[4] = {
            _mm512_or_si512(_mm512_and_si512(a, low4), _mm512_and_si512(_mm512_slli_epi16(h, 4), bits45)),
            _mm512_or_si512(_mm512_and_si512(bq, low4), _mm512_and_si512(_mm512_slli_epi16(h, 2), bits45)),
            _mm512_or_si512(_mm512_srli_epi16(a, 4), _mm512_and_si512(h, bits45)),
            _mm512_or_si512(_mm512_srli_epi16(bq, 4), _mm512_and_si512(_mm512_srli_epi16(h, 2), bits45))};
        for (int k = 0; k < 4; ++k) {
          const __m512bh codes = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(table_low, q[k], table_high));
          const int first = 128 * half + 32 * k;
          const __m512 sk = _mm512_permutexvar_ps(_mm512_add_epi32(two_groups, _mm512_set1_epi32(first / 16)), scale);
          for (int v = 0; v < V; ++v) {
            const float* xc = in.x[v] + b * QK_K + first;
            acc[v][k] = _mm512_fmadd_ps(halves_dot(codes, prepared_words(xc), prepared_words(xc + 16)), sk, acc[v][k]);
          }
        }
      }
    }
    for (int v = 0; v < V; ++v)
      for (int k = 0; k < 4; ++k) s[v].acc[k] = acc[v][k];
  }

  template <int V>
  TPCLI_AVX512BF16 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v)
      out[v * ld_out] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[v].acc[0], s[v].acc[1]), _mm512_add_ps(s[v].acc[2], s[v].acc[3])));
  }
};

// Q8_0 as a register tile of two rows x up to four vectors: a block's 32 weights d * q are exact
// in f32 (an f16 times an int8), so they are made once for the vectors and multiplied as f32 ones,
// each (row, vector) with two chains (the block's first and second 16), each x vector loaded once
// for the rows.
struct Q8_0Tile512 {
  static constexpr int MAX_V = 4, ROWS = 2;  // 16 sums, 4 weight vectors, 2 x vectors
  struct State {
    __m512 acc[2];
  };
  static int64_t unit(const View&) { return 32; }
  static int64_t body(const View& w) { return w.cols; }

  template <int RT, int V>
  TPCLI_AVX512 static void rows_columns(State (*s)[V], const View& w, int64_t r, int64_t c0, int64_t c1, const Vectors& vs) {
    const TileInputs<V> in(vs);
    __m512 acc[RT][V][2];
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) acc[i][v][0] = s[i][v].acc[0], acc[i][v][1] = s[i][v].acc[1];
    for (int64_t b = c0 / 32; b < c1 / 32; ++b) {
      // The RT rows' blocks are RT streams side by side that run into one another: one prefetch a
      // step, sweeping at RT blocks a step, asks for each line ahead about once, not RT times.
      _mm_prefetch(reinterpret_cast<const char*>(w.data + r * w.row_bytes + PREFETCH_BYTES + RT * b * Q8_0_BYTES), _MM_HINT_T0);
      __m512 lo[RT], hi[RT];
      for (int i = 0; i < RT; ++i) {
        const uint8_t* block = w.data + (r + i) * w.row_bytes + b * Q8_0_BYTES;
        const __m512 d = _mm512_set1_ps(half_at(block));
        lo[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(block + 2))), d);
        hi[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(block + 18))), d);
      }
      for (int v = 0; v < V; ++v) {
        const __m512 x0 = in_register(_mm512_loadu_ps(in.x[v] + 32 * b)), x1 = in_register(_mm512_loadu_ps(in.x[v] + 32 * b + 16));
        for (int i = 0; i < RT; ++i) {
          acc[i][v][0] = _mm512_fmadd_ps(lo[i], x0, acc[i][v][0]);
          acc[i][v][1] = _mm512_fmadd_ps(hi[i], x1, acc[i][v][1]);
        }
      }
    }
    for (int i = 0; i < RT; ++i)
      for (int v = 0; v < V; ++v) s[i][v].acc[0] = acc[i][v][0], s[i][v].acc[1] = acc[i][v][1];
  }

  template <int V>
  TPCLI_AVX512 static void finish(float* out, int64_t ld_out, State (&s)[V], const View&, int64_t, const Vectors&) {
    for (int v = 0; v < V; ++v) out[v * ld_out] = _mm512_reduce_add_ps(_mm512_add_ps(s[v].acc[0], s[v].acc[1]));
  }
};

// A tile kernel's single vector: the batch's tile with one vector.
template <class Tile>
void tile_rows_one(float* out, const View& w, const float* x, const float* xsum, int64_t r0, int64_t r1) {
  in_vector_tiles<Tile>(out, 0, w, Vectors{x, 0, xsum, 0, 1}, r0, r1);
}

template <class Tile>
MatvecKernel tile_kernel(void (*prepare)(float*, const float*, int64_t)) {
  return {prepare, tile_rows_one<Tile>, in_vector_tiles<Tile>};
}

// ---- AVX2 ----

struct Q8_0x256 {
  static constexpr int MAX_V = 3;
  template <int V>
  TPCLI_AVX2 static void row(const uint8_t* row, int64_t cols, const Inputs<V>& in, float* out) {
    __m256 acc[V][2];
    for (int v = 0; v < V; ++v) acc[v][0] = acc[v][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < cols / 32; ++b) {
      const uint8_t* q = row + b * Q8_0_BYTES + 2;
      _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_BYTES), _MM_HINT_T0);
      __m256 c[4];
      for (int k = 0; k < 4; ++k) c[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(q + 8 * k)));
      const __m256 d = _mm256_set1_ps(half_at(q - 2));
      for (int v = 0; v < V; ++v) {
        const float* xb = in.x[v] + 32 * b;
        __m256 g = _mm256_mul_ps(c[0], _mm256_loadu_ps(xb));
        for (int k = 1; k < 4; ++k) g = _mm256_fmadd_ps(c[k], _mm256_loadu_ps(xb + 8 * k), g);
        acc[v][b & 1] = _mm256_fmadd_ps(g, d, acc[v][b & 1]);
      }
    }
    for (int v = 0; v < V; ++v) out[v] = hsum256(_mm256_add_ps(acc[v][0], acc[v][1]));
  }
};

struct Q4_Kx256 {
  static constexpr int MAX_V = 3;
  template <int V>
  TPCLI_AVX2 static void row(const uint8_t* row, int64_t cols, const Inputs<V>& in, float* out) {
    const __m256i low4 = _mm256_set1_epi32(15);
    __m256 acc[V][2], min_acc[V];
    for (int v = 0; v < V; ++v) acc[v][0] = acc[v][1] = min_acc[v] = _mm256_setzero_ps();
    for (int64_t b = 0; b < cols / QK_K; ++b) {
      const uint8_t* block = row + b * Q4_K_BYTES;
      alignas(32) float scale[8];
      __m256 min;
      q4_k_scales(block, scale, &min);
      for (int v = 0; v < V; ++v) min_acc[v] = _mm256_fmadd_ps(min, _mm256_loadu_ps(in.sum[v] + 8 * b), min_acc[v]);
      for (int j = 0; j < 4; ++j) {
        const uint8_t* q = block + 16 + 32 * j;
        _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_BYTES), _MM_HINT_T0);
        __m256 ga[V], gb[V];
        for (int k = 0; k < 4; ++k) {
          const __m256i u = _mm256_cvtepu8_epi32(load8(q + 8 * k));
          const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(u, low4)), hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(u, 4));
          for (int v = 0; v < V; ++v) {
            const float* xg = in.x[v] + b * QK_K + 64 * j + 8 * k;
            ga[v] = k == 0 ? _mm256_mul_ps(lo, _mm256_loadu_ps(xg)) : _mm256_fmadd_ps(lo, _mm256_loadu_ps(xg), ga[v]);
            gb[v] = k == 0 ? _mm256_mul_ps(hi, _mm256_loadu_ps(xg + 32)) : _mm256_fmadd_ps(hi, _mm256_loadu_ps(xg + 32), gb[v]);
          }
        }
        const __m256 s0 = _mm256_set1_ps(scale[2 * j]), s1 = _mm256_set1_ps(scale[2 * j + 1]);
        for (int v = 0; v < V; ++v) {
          acc[v][0] = _mm256_fmadd_ps(ga[v], s0, acc[v][0]);
          acc[v][1] = _mm256_fmadd_ps(gb[v], s1, acc[v][1]);
        }
      }
    }
    for (int v = 0; v < V; ++v) out[v] = hsum256(_mm256_add_ps(acc[v][0], acc[v][1])) - hsum256(min_acc[v]);
  }
};

struct Q6_Kx256 {
  static constexpr int MAX_V = 2;
  template <int V>
  TPCLI_AVX2 static void row(const uint8_t* row, int64_t cols, const Inputs<V>& in, float* out) {
    const __m256i low4 = _mm256_set1_epi32(15), bits45 = _mm256_set1_epi32(48);
    __m256 acc[V][4], offset_acc[V];
    for (int v = 0; v < V; ++v) {
      for (int k = 0; k < 4; ++k) acc[v][k] = _mm256_setzero_ps();
      offset_acc[v] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < cols / QK_K; ++b) {
      const uint8_t* block = row + b * Q6_K_BYTES;
      for (int p = 0; p < Q6_K_BYTES; p += 64) _mm_prefetch(reinterpret_cast<const char*>(block + p + PREFETCH_BYTES), _MM_HINT_T0);
      alignas(32) float scale[16];
      const __m256 d = _mm256_set1_ps(half_at(block + 208));
      for (int i = 0; i < 2; ++i) {
        const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(block + 192 + 8 * i))));
        _mm256_store_ps(scale + 8 * i, s);
        for (int v = 0; v < V; ++v)
          offset_acc[v] = _mm256_fmadd_ps(s, _mm256_loadu_ps(in.sum[v] + 16 * b + 8 * i), offset_acc[v]);
      }
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = block + 64 * half;
        const uint8_t* qh = block + 128 + 32 * half;
        for (int c = 0; c < 32; c += 16) {  // one group of 16 in each quarter
          __m256 g[V][4];
          for (int e = 0; e < 16; e += 8) {
            const __m256i a = _mm256_cvtepu8_epi32(load8(ql + c + e)), bq = _mm256_cvtepu8_epi32(load8(ql + 32 + c + e));
            const __m256i h = _mm256_cvtepu8_epi32(load8(qh + c + e));
            const __m256 q[4] = {
                _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi32(h, 4), bits45))),
                _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_and_si256(bq, low4), _mm256_and_si256(_mm256_slli_epi32(h, 2), bits45))),
                _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(h, bits45))),
                _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_srli_epi32(bq, 4), _mm256_and_si256(_mm256_srli_epi32(h, 2), bits45)))};
            for (int v = 0; v < V; ++v)
              for (int k = 0; k < 4; ++k) {
                const __m256 xv = _mm256_loadu_ps(in.x[v] + b * QK_K + 128 * half + 32 * k + c + e);
                g[v][k] = e == 0 ? _mm256_mul_ps(q[k], xv) : _mm256_fmadd_ps(q[k], xv, g[v][k]);
              }
          }
          for (int k = 0; k < 4; ++k) {
            const __m256 sk = _mm256_set1_ps(scale[(128 * half + 32 * k + c) / 16]);
            for (int v = 0; v < V; ++v) acc[v][k] = _mm256_fmadd_ps(g[v][k], sk, acc[v][k]);
          }
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[v][0], acc[v][1]), _mm256_add_ps(acc[v][2], acc[v][3]));
      out[v] = std::fma(-32.0f, hsum256(offset_acc[v]), hsum256(sum));
    }
  }
};

}  // namespace

MatvecKernel ggml_avx2_kernel(const WeightFormat& f) {
  switch (f.ggml) {
    case GgmlType::Q8_0: return kernel_of<Q8_0x256>();
    case GgmlType::Q4_K: return kernel_of<Q4_Kx256>();
    case GgmlType::Q6_K: return kernel_of<Q6_Kx256>();
    default: return {};
  }
}

MatvecKernel ggml_avx512_kernel(const WeightFormat& f) {
  switch (f.ggml) {
    case GgmlType::Q8_0: return tile_kernel<Q8_0Tile512>(nullptr);
    case GgmlType::Q4_K:
      if (cpu_has_avx512_bf16()) return tile_kernel<Q4_KTileBf16>(prepare_halves_512);
      return kernel_of<Q4_Kx512>();
    case GgmlType::Q6_K:
      if (cpu_has_avx512_bf16()) return tile_kernel<Q6_KTileBf16>(prepare_halves_512);
      return kernel_of<Q6_Kx512>();
    default: return {};
  }
}

#else

MatvecKernel ggml_avx2_kernel(const WeightFormat&) { return {}; }
MatvecKernel ggml_avx512_kernel(const WeightFormat&) { return {}; }

#endif

}  // namespace tpcli::tensor::kernels
