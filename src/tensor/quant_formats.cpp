#include "tensor/quant_formats.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tpcli::tensor {

// ---- scalar conversions ----

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep it a NaN
  const uint32_t rounding = 0x7FFF + ((u >> 16) & 1);                   // ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const float a = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7E00);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00);  // rounds past the largest finite
  if (a < 6.103515625e-05f) {                                        // subnormal: multiples of 2^-24
    const float q = std::nearbyint(std::ldexp(a, 24));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));  // q == 1024 is the smallest normal
  }
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float q = std::nearbyint(std::ldexp(m, 11)) - 1024.0f;  // 10 mantissa bits, ties to even
  int exp = e - 1 + 15;
  if (q >= 1024.0f) {
    q = 0.0f;
    ++exp;
  }
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00);
  return static_cast<uint16_t>(sign | (exp << 10) | static_cast<uint16_t>(q));
}

float e4m3_to_f32(uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 7;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (code & 0x80) ? -v : v;
}

uint8_t f32_to_e4m3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float a = std::fabs(value);
  if (!(a < 448.0f)) return sign | 0x7E;  // also inf and NaN
  if (a < 0.015625f) {                    // below 2^-6: subnormal steps of 2^-9 (8 is the first normal)
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int e = 0;
  const float m = std::frexp(a, &e);                          // a = m * 2^e, m in [0.5, 1)
  int q = static_cast<int>(std::nearbyint(std::ldexp(m, 4))) - 8;  // 3 mantissa bits, ties to even
  int biased = e - 1 + 7;
  if (q == 8) {
    q = 0;
    ++biased;
  }
  const int code = std::min((biased << 3) | q, 0x7E);
  return static_cast<uint8_t>(sign | code);
}

float e8m0_to_f32(uint8_t code) {
  return code == 255 ? INFINITY : std::ldexp(1.0f, static_cast<int>(code) - 127);
}

// ---- packing ----

namespace {

void check_grouping(const char* what, int64_t cols, int bits, int group_size) {
  if (bits < 2 || bits > 8)
    throw std::invalid_argument(std::string(what) + ": bits = " + std::to_string(bits) + " outside 2..8");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument(std::string(what) + ": group size " + std::to_string(group_size) +
                                " is not 32, 64 or 128");
  if (cols % group_size != 0)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(cols) +
                                " columns are not a multiple of the group size " + std::to_string(group_size));
}

// Writes `bits` bits of `code` at element `col` of a zeroed row bitstream.
void pack_code(uint32_t* row_words, int64_t col, int bits, uint32_t code) {
  const int64_t bit = col * bits;
  const int64_t word = bit / 32;
  const int shift = static_cast<int>(bit % 32);
  row_words[word] |= code << shift;
  if (shift + bits > 32) row_words[word + 1] |= code >> (32 - shift);
}

// MLX CPU rule for one group (QUANT.md section 2): scale and bias from the group's range.
void affine_group_params(const float* g, int group_size, int bits, float& scale, float& bias) {
  float lo = g[0], hi = g[0];
  for (int i = 1; i < group_size; ++i) {
    lo = std::min(lo, g[i]);
    hi = std::max(hi, g[i]);
  }
  const float n = static_cast<float>((1 << bits) - 1);
  const float step = std::max((hi - lo) / n, 1e-7f);
  const bool low_edge = std::fabs(lo) > std::fabs(hi);
  const float edge = low_edge ? lo : hi;
  const float s = low_edge ? step : -step;
  const float q0 = std::nearbyint(edge / s);
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  } else {
    scale = s;
    bias = 0.0f;
  }
}

}  // namespace

uint32_t unpack_code(const uint32_t* row_words, int64_t col, int bits) {
  const int64_t bit = col * bits;
  const int64_t word = bit / 32;
  const int shift = static_cast<int>(bit % 32);
  uint64_t v = row_words[word] >> shift;
  if (shift + bits > 32) v |= static_cast<uint64_t>(row_words[word + 1]) << (32 - shift);
  return static_cast<uint32_t>(v) & ((1u << bits) - 1);
}

void affine_quantize(uint32_t* words, float* scales, float* biases, const float* w, int64_t rows, int64_t cols,
                     int bits, int group_size) {
  check_grouping("affine quantize", cols, bits, group_size);
  const int64_t W = cols * bits / 32, G = cols / group_size;
  const float n = static_cast<float>((1 << bits) - 1);
  std::fill(words, words + rows * W, 0u);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < G; ++g) {
      const float* src = w + r * cols + g * group_size;
      float scale = 0.0f, bias = 0.0f;
      affine_group_params(src, group_size, bits, scale, bias);
      scales[r * G + g] = scale;
      biases[r * G + g] = bias;
      for (int i = 0; i < group_size; ++i) {
        const float q = std::clamp(std::nearbyint((src[i] - bias) / scale), 0.0f, n);
        pack_code(words + r * W, g * group_size + i, bits, static_cast<uint32_t>(q));
      }
    }
  }
}

void affine_dequantize_row(float* out, const uint32_t* row_words, const float* row_scales, const float* row_biases,
                           int64_t cols, int bits, int group_size) {
  // Group by group, the scale and bias read once; 4 and 8 bits (the common widths) unpack a word
  // at a time. The same arithmetic everywhere (multiply, round, add, round: no fused multiply-add).
  for (int64_t c0 = 0; c0 < cols; c0 += group_size) {
    const float scale = row_scales[c0 / group_size], bias = row_biases[c0 / group_size];
    const int64_t end = std::min<int64_t>(cols, c0 + group_size);
    if ((bits == 4 || bits == 8) && end - c0 == group_size) {  // a group is a whole number of words
      const int per_word = 32 / bits;
      const uint32_t mask = (1u << bits) - 1;
      const uint32_t* words = row_words + c0 * bits / 32;
      for (int64_t w = 0; w < group_size / per_word; ++w)
        for (int i = 0; i < per_word; ++i)
          out[c0 + w * per_word + i] = static_cast<float>((words[w] >> (i * bits)) & mask) * scale + bias;
      continue;
    }
    for (int64_t c = c0; c < end; ++c) out[c] = static_cast<float>(unpack_code(row_words, c, bits)) * scale + bias;
  }
}

void mxfp8_quantize(uint32_t* words, uint8_t* scale_bytes, const float* w, int64_t rows, int64_t cols) {
  constexpr int GS = 32;
  if (cols % GS != 0)
    throw std::invalid_argument("mxfp8 quantize: " + std::to_string(cols) + " columns are not a multiple of 32");
  const int64_t W = cols / 4, G = cols / GS;
  std::fill(words, words + rows * W, 0u);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < G; ++g) {
      const float* src = w + r * cols + g * GS;
      float amax = 0.0f;
      for (int i = 0; i < GS; ++i) amax = std::max(amax, std::fabs(src[i]));
      // CPU rule: e = round-half-even(log2(amax / 448)); an all-zero group gets e = 0.
      int e = amax > 0.0f ? static_cast<int>(std::nearbyint(std::log2(amax / 448.0f))) : 0;
      e = std::clamp(e, -127, 127);
      scale_bytes[r * G + g] = static_cast<uint8_t>(e + 127);
      for (int i = 0; i < GS; ++i) {
        const uint8_t code = f32_to_e4m3(std::ldexp(src[i], -e));
        pack_code(words + r * W, g * GS + i, 8, code);
      }
    }
  }
}

void mxfp8_dequantize_row(float* out, const uint32_t* row_words, const uint8_t* row_scales, int64_t cols) {
  // e4m3_to_f32 of every code, once (ldexp per element was most of the time of a row).
  static const std::array<float, 256> e4m3 = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  const auto* bytes = reinterpret_cast<const uint8_t*>(row_words);
  for (int64_t c0 = 0; c0 < cols; c0 += 32) {
    const float scale = e8m0_to_f32(row_scales[c0 / 32]);
    const int64_t end = std::min<int64_t>(cols, c0 + 32);
    for (int64_t c = c0; c < end; ++c) out[c] = e4m3[bytes[c]] * scale;
  }
}

}  // namespace tpcli::tensor
