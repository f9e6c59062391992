// tpcli::tensor — internal (x86-64 kernel files only): 4-bit codes as bf16 words for vdpbf16ps,
// and x split into bf16 halves (packed_kernels_x86.cpp's affine 4-bit path, and Q4_K's in
// packed_kernels_ggml_x86.cpp): hi = bf16(x), lo = bf16(x - hi).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#define TPCLI_BF16_CODES __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

namespace tpcli::tensor::kernels {

TPCLI_BF16_CODES inline __m512i bf16_halves(__m512 a, __m512 b) {  // [bf16(a), bf16(b)], round to nearest even
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
}

TPCLI_BF16_CODES inline __m512 bf16_to_f32_16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 32 bytes' 64 codes as bf16 words: `even` from the low nibbles, `odd` from the high ones (affine
// 4-bit rows hold elements 2j and 2j+1 there; Q4_K holds a group's element j and the next group's).
struct CodesBf16 {
  __m512bh even, odd;
};

TPCLI_BF16_CODES inline CodesBf16 chunk_codes_bf16(const uint8_t* q, __m512i table) {
  const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
  return {reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(bytes, table)),  // index: low 5 bits
          reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table))};
}

// bf16 bit patterns of 0..15, twice: vpermw reads the low 5 bits of a word, so a widened byte
// indexes its low nibble directly.
TPCLI_BF16_CODES inline __m512i code_table_bf16() {
  alignas(64) static const uint16_t table[32] = {
      0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120,
      0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0,
      0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  return _mm512_load_si512(table);
}

}  // namespace tpcli::tensor::kernels

#endif
