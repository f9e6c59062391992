// tpcli::tensor — ggml's tensor types (llama.cpp's GGUF files): each type's block and its values.
//
// A row of K values is K / block_elements blocks of block_bytes each. The layouts (ggml-common.h),
// "half" an IEEE f16, QK_K = 256 values per super-block:
//   Q4_0   half d; u8 qs[16]                      x = d * (nibble - 8); low nibbles values 0..15, high 16..31
//   Q4_1   half d, m; u8 qs[16]                   x = d * nibble + m
//   Q5_0   half d; u32 qh; u8 qs[16]              fifth bit of value j is bit j of qh; x = d * (q - 16)
//   Q5_1   half d, m; u32 qh; u8 qs[16]           x = d * q + m
//   Q8_0   half d; i8 qs[32]                      x = d * q
//   Q2_K   u8 scales[16]; u8 qs[64]; half d, dmin         16 groups of 16: 4-bit scale and min each
//   Q3_K   u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d 16 groups of 16: 6-bit signed scales
//   Q4_K   half d, dmin; u8 scales[12]; u8 qs[128]        8 groups of 32: 6-bit scale and min each
//   Q5_K   half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
//   Q6_K   u8 ql[128]; u8 qh[64]; i8 scales[16]; half d    16 groups of 16: 8-bit signed scales
//   IQ4_NL half d; u8 qs[16]                      x = d * KVALUES[nibble] (a fixed non-linear codebook)
//   IQ4_XS half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]   8 groups of 32: 6-bit scales - 32
// dequantize_row computes what ggml's reference dequantize_row_* computes, in the same float
// operations in the same order, none fused (this file's .cpp is compiled with -ffp-contract=off);
// quantize_row is the writer's mirror for the types tpcli writes (formats/gguf_writer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace tpcli::tensor {

// ggml.h's enum ggml_type: the numbers GGUF files store.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
};

struct GgmlTypeTraits {
  const char* name;      // "Q4_K"
  int block_elements;    // values per block (1 for plain numbers)
  int block_bytes;       // bytes per block
  bool dequantizable;    // dequantize_row reads it
};

// nullopt for a number that is no known type.
std::optional<GgmlType> ggml_type_of(uint32_t number);
// The type's traits (every GgmlType enumerator has them).
const GgmlTypeTraits& ggml_traits(GgmlType type);

// One block of a quantized type: out[block_elements] = its values, as dequantize_row computes them.
using GgmlBlockDecoder = void (*)(const uint8_t* block, float* out);
// nullptr for a plain number type or one tpcli does not dequantize.
GgmlBlockDecoder ggml_block_decoder(GgmlType type);

// out[n] = the values of a row of n values stored as `type` (n a multiple of its block_elements).
// std::invalid_argument for a type that is not dequantizable.
void dequantize_row(GgmlType type, const std::byte* blocks, float* out, int64_t n);

// Whether quantize_row writes the type: F32, F16, BF16, Q8_0.
bool quantizable(GgmlType type);
// blocks = a row of n values (n a multiple of its block_elements) stored as `type`, as ggml's
// reference quantizers write it: F16 and BF16 rounded to nearest even (a NaN stays a quiet NaN,
// as ggml_compute_fp32_to_bf16 keeps it); Q8_0 as quantize_row_q8_0_ref: per block of 32,
// d = max|x| / 127, q = roundf(x * (1/d)) (0 when d is 0), d stored as F16.
// std::invalid_argument for a type it does not write or an n that is no whole number of blocks.
void quantize_row(GgmlType type, const float* in, std::byte* blocks, int64_t n);

}  // namespace tpcli::tensor
