// tpcli::tensor — MLX's weight formats, bit for bit (../shared/QUANT.md): affine quantization
// (2..8 bits, groups of 32/64/128 input columns), mxfp8 (E4M3 elements, E8M0 scales per 32), and
// the 16-bit float storage types (bf16, f16).
//
// Dimension legend: R rows (output features), K columns (input features), GS group size,
// G = K / GS groups per row, W = K * bits / 32 packed words per row.
// Packing (every mode): each row is one little-endian, LSB-first bitstream; element i occupies
// stream bits [i*bits, i*bits + bits), stream bit b is bit b % 32 of word b / 32.
//
// Arithmetic follows MLX's CPU backend: float32, true IEEE division, rint (ties to even). This
// file must not be compiled with -ffast-math.
#pragma once

#include <cstdint>

namespace tpcli::tensor {

// ---- scalar conversions ----
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);  // round to nearest even (NaN stays NaN)
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);   // round to nearest even, overflow to inf
float e4m3_to_f32(uint8_t code);    // 0x7F / 0xFF read as +-480 (MLX's CPU decoder)
uint8_t f32_to_e4m3(float value);   // nearest, ties to even; |x| >= 448, inf, NaN -> +-448
float e8m0_to_f32(uint8_t code);    // 2^(code - 127); 255 -> inf

// ---- affine ----
// w[R, K] -> words[R, W], scales[R, G], biases[R, G]. K % GS == 0; bits in 2..8; GS in {32, 64, 128}.
void affine_quantize(uint32_t* words, float* scales, float* biases, const float* w, int64_t rows, int64_t cols,
                     int bits, int group_size);
// Code of element `col` of a packed row (any bit width).
uint32_t unpack_code(const uint32_t* row_words, int64_t col, int bits);
// out[K] = code * scale + bias, for one row.
void affine_dequantize_row(float* out, const uint32_t* row_words, const float* row_scales, const float* row_biases,
                           int64_t cols, int bits, int group_size);

// ---- mxfp8 (group size 32) ----
// w[R, K] -> words[R, K/4] (E4M3 bytes in element order), scale bytes[R, K/32] (E8M0).
void mxfp8_quantize(uint32_t* words, uint8_t* scale_bytes, const float* w, int64_t rows, int64_t cols);
void mxfp8_dequantize_row(float* out, const uint32_t* row_words, const uint8_t* row_scales, int64_t cols);

}  // namespace tpcli::tensor
