// Plain C++ matrix-vector kernels for every PackedMatrix format (the reference the SIMD kernels
// are tested against, and the fallback on CPUs without AVX2).
#include <cmath>
#include <cstring>

#include "tensor/packed_kernels.h"
#include "tensor/quant_formats.h"

namespace tpcli::tensor::kernels {

namespace {

void f32_rows(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = reinterpret_cast<const float*>(w.data + r * w.row_bytes);
    float s = 0.0f;
    for (int64_t c = 0; c < w.cols; ++c) s += row[c] * x[c];
    out[r - r0] = s;
  }
}

template <float (*Convert)(uint16_t)>
void half_rows(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = w.data + r * w.row_bytes;
    float s = 0.0f;
    for (int64_t c = 0; c < w.cols; ++c) {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      s += Convert(h) * x[c];
    }
    out[r - r0] = s;
  }
}

// Affine, any bit width: per group scale * sum(x*q) + bias * sum(x).
void affine_rows(float* out, const View& w, const float* x, const float* xsum, int64_t r0, int64_t r1) {
  const int bits = w.format.bits, GS = w.format.group_size;
  const int64_t G = w.cols / GS;
  for (int64_t r = r0; r < r1; ++r) {
    const auto* words = reinterpret_cast<const uint32_t*>(w.data + r * w.row_bytes);
    const uint8_t* bytes = w.data + r * w.row_bytes;
    float s = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      float dot = 0.0f;
      const int64_t c0 = g * GS;
      if (bits == 8) {
        for (int i = 0; i < GS; ++i) dot += static_cast<float>(bytes[c0 + i]) * x[c0 + i];
      } else if (bits == 4) {
        for (int i = 0; i < GS; i += 2) {
          const uint8_t b = bytes[(c0 + i) / 2];
          dot += static_cast<float>(b & 15) * x[c0 + i] + static_cast<float>(b >> 4) * x[c0 + i + 1];
        }
      } else {
        for (int i = 0; i < GS; ++i) dot += static_cast<float>(unpack_code(words, c0 + i, bits)) * x[c0 + i];
      }
      s += w.scales[r * G + g] * dot + w.biases[r * G + g] * xsum[g];
    }
    out[r - r0] = s;
  }
}

void mxfp8_rows(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  const int64_t G = w.cols / 32;
  float table[256];
  for (int i = 0; i < 256; ++i) table[i] = e4m3_to_f32(static_cast<uint8_t>(i));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    float s = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      float dot = 0.0f;
      for (int i = 0; i < 32; ++i) dot += table[row[g * 32 + i]] * x[g * 32 + i];
      s += dot * e8m0_to_f32(w.scale_bytes[r * G + g]);
    }
    out[r - r0] = s;
  }
}

// A ggml block type: each block decoded as ggml's dequantizer computes it, then multiplied in 8
// lanes (the fixed order every row and vector gets; the compiler makes them one vector register).
void ggml_rows(float* out, const View& w, const float* x, const float*, int64_t r0, int64_t r1) {
  const GgmlBlockDecoder decode = ggml_block_decoder(w.format.ggml);
  const int BE = w.format.group_size;
  const int64_t block_bytes = ggml_traits(w.format.ggml).block_bytes, blocks = w.cols / BE;
  alignas(64) float values[256];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    float lanes[8] = {};
    for (int64_t b = 0; b < blocks; ++b) {
      decode(row + b * block_bytes, values);
      const float* xb = x + b * BE;
      for (int i = 0; i < BE; i += 8)
        for (int k = 0; k < 8; ++k) lanes[k] = std::fma(values[i + k], xb[i + k], lanes[k]);
    }
    out[r - r0] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
}

}  // namespace

MatvecKernel scalar_kernel(const WeightFormat& format) {
  switch (format.kind) {
    case WeightKind::F32: return {nullptr, f32_rows};
    case WeightKind::BF16: return {nullptr, half_rows<bf16_to_f32>};
    case WeightKind::F16: return {nullptr, half_rows<f16_to_f32>};
    case WeightKind::Affine: return {nullptr, affine_rows};
    case WeightKind::Mxfp8: return {nullptr, mxfp8_rows};
    case WeightKind::Ggml: return {nullptr, ggml_rows};
  }
  return {};
}

}  // namespace tpcli::tensor::kernels
