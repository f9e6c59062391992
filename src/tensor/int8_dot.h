// tpcli::tensor — internal: the integer matrix-vector kernels for affine 8-bit and 4-bit weights
// (llama.cpp's q8_0 x q8_0 scheme applied to MLX's affine format). Not included outside src/tensor/.
//
// Dimension legend: R rows, K columns, GS group size (32, 64, 128), G = K / GS groups per row,
// GP = G rounded up to a multiple of 16 (the padded per-group arrays).
//
// The activation vector is quantized once per matvec, per group of GS columns, to int8:
//   x[c] ~ xscale[g] * xq[c],  xq in [-127, 127],  xscale[g] = max|x over g| / 127,
// and the exact f32 group sum xsum[g] is kept for the affine bias. Then, per row r:
//   idot[r, g] = sum_{c in g} q[r, c] * xq[c]                   (int32, exact; q unsigned codes)
//   t[r, g]    = fma(scale[r, g], xscale[g] * float(idot), bias[r, g] * xsum[g])
//   acc[j]    += t[r, g] for g = j, j + 8, j + 16, ...           (8 lanes, g in order)
//   out[r]     = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
// Every instruction set computes the same integers and exactly this float sequence, so the plain
// C++, AVX2 and AVX-512 kernels give bit-identical outputs (TPCLI_ISA changes no token). Each group
// is quantized from its own values only, so a column shard (whole groups) quantizes its groups as
// one device would.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/isa.h"
#include "tensor/packed_kernels.h"

namespace tpcli::tensor::kernels {

struct QuantizedInput {
  int64_t cols = 0, group_size = 0;
  std::vector<int8_t> xq;       // [K] codes; in nibble order (below) when the kernel asks for it
  std::vector<float> xscale;    // [GP] zero past G; NaN for a group with a non-finite value
  std::vector<float> xsum;      // [GP] exact f32 sums, in column order
  std::vector<int32_t> xqsum;   // [GP] sums of the codes (the AVX2 8-bit kernel's offset term)
};

// Nibble order (4-bit SIMD kernels): each run of 32 columns is stored as its 16 even columns, then
// its 16 odd ones, matching a 16-byte run of packed 4-bit codes split into low and high nibbles.
void quantize_input(QuantizedInput& out, const float* x, int64_t cols, int64_t group_size, bool nibble_order);

struct Int8Kernel {
  bool nibble_order = false;  // wants QuantizedInput in nibble order
  // out[i - r0] for rows [r0, r1)
  void (*rows)(float* out, const View& w, const QuantizedInput& x, int64_t r0, int64_t r1) = nullptr;
  // Optional (nullptr: `rows` once per vector). B vectors x[B]: out[v * ld_out + i - r0] is bit for
  // bit what `rows` gives x[v] alone (the integers are exact and each (row, vector) keeps the float
  // sequence above), but each chunk of codes is loaded, and unpacked, once for several vectors.
  void (*rows_batch)(float* out, int64_t ld_out, const View& w, const QuantizedInput* x, int64_t B, int64_t r0,
                     int64_t r1) = nullptr;
};

// Affine 8-bit and 4-bit (any group size) only; `rows` is nullptr for other formats, or when the
// instruction set has no kernel (AVX-512 without VNNI: the AVX2 one is used).
Int8Kernel scalar_int8_kernel(const WeightFormat& format);
Int8Kernel avx2_int8_kernel(const WeightFormat& format);
Int8Kernel avx512_int8_kernel(const WeightFormat& format);
Int8Kernel int8_kernel_for(const WeightFormat& format, Isa isa);

// out[n] = rows [row0, row0 + n) of w times x, split over threads as run_rows (packed_kernels.h).
void run_int8_rows(const Int8Kernel& k, float* out, const View& w, const QuantizedInput& x, int64_t row0, int64_t n);
// B vectors: out[v * ld_out + i] = row row0 + i of w times x[v], in the row blocks of run_int8_rows,
// a few rows at a time over all B vectors (each row's codes read from memory once for the batch).
void run_int8_rows_batch(const Int8Kernel& k, float* out, int64_t ld_out, const View& w, const QuantizedInput* x,
                         int64_t B, int64_t row0, int64_t n);

// The formats the integer kernels cover.
inline bool int8_matvec_format(const WeightFormat& f) {
  return f.kind == WeightKind::Affine && (f.bits == 8 || f.bits == 4);
}

}  // namespace tpcli::tensor::kernels
