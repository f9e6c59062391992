// tpcli::tensor — internal: the matrix-vector kernels behind PackedMatrix::matvec, one set per
// instruction set. Not included outside src/tensor/.
//
// Dimension legend: K columns, GS group size, G = K / GS groups per row.
// Every kernel computes out[i] = W[r, :] . x for rows r in [r0, r1), out indexed from r0, with f32
// accumulation. Affine: per group, scale * sum(x * q) + bias * sum(x) (MLX's matrix-vector rule),
// so `xsum[G]` holds the groups' sums of x. Some kernels want x in their own order: `prepare`
// rewrites x[K] into xp[K] (the sums do not change, a group's elements stay in the group).
#pragma once

#include <cstdint>

#include "tensor/packed_matrix.h"

namespace tpcli::tensor::kernels {

// Bytes ahead of the weights being read that the quantized kernels prefetch. Without it they
// stall on loads when the weights come from memory (a layer already in cache runs faster): the
// hardware prefetchers restart on every decode row, and rows are a few KB. A few KB ahead is what
// helped (a much shorter distance did not; prefetching to L2 only was no better). The f32 kernel
// does without: explicit prefetches made it slower. The distances tried and their speeds:
// BENCHMARKS.md, Kernel design notes.
constexpr int64_t PREFETCH_BYTES = 4096;

struct View {
  WeightFormat format;
  int64_t cols = 0, row_bytes = 0;
  const uint8_t* data = nullptr;          // [R, row_bytes]
  const float* scales = nullptr;          // affine [R, G]
  const float* biases = nullptr;          // affine [R, G]
  const uint8_t* scale_bytes = nullptr;   // mxfp8 [R, G]
};

// B vectors side by side for `rows_batch`: vector v's prepared x[K] at xp + v * ld_x, its group sums
// xsum[G] (affine; nullptr otherwise) at xsum + v * ld_sum.
struct Vectors {
  const float* xp = nullptr;
  int64_t ld_x = 0;
  const float* xsum = nullptr;
  int64_t ld_sum = 0;
  int64_t count = 0;

  const float* x(int64_t v) const { return xp + v * ld_x; }
  const float* sum(int64_t v) const { return xsum ? xsum + v * ld_sum : nullptr; }
  // Vectors [first, first + n).
  Vectors slice(int64_t first, int64_t n) const { return {x(first), ld_x, sum(first), ld_sum, n}; }
};

struct MatvecKernel {
  // xp[K] = x[K] in the order `rows` reads it (nullptr: x as it is).
  void (*prepare)(float* xp, const float* x, int64_t cols) = nullptr;
  void (*rows)(float* out, const View& w, const float* xp, const float* xsum, int64_t r0, int64_t r1) = nullptr;
  // Optional (nullptr: run `rows` once per vector). For every vector v of x, out[v * ld_out + r - r0]
  // is bit for bit what `rows` gives that vector alone over [r0, r1): each vector keeps `rows`'
  // accumulators, FMA chains, tails and reductions, but each weight chunk is loaded and unpacked
  // once for several vectors, so batched decode stops paying the unpacking B times.
  void (*rows_batch)(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r0, int64_t r1) = nullptr;
};

// nullptr `rows` when the instruction set has no kernel for the format (the caller falls back to
// the next one down); the scalar set covers every format.
MatvecKernel scalar_kernel(const WeightFormat& format);
MatvecKernel avx2_kernel(const WeightFormat& format);
MatvecKernel avx512_kernel(const WeightFormat& format);
// The ggml block types' kernels of each set (packed_kernels_ggml_x86.cpp), which the two above return.
MatvecKernel ggml_avx2_kernel(const WeightFormat& format);
MatvecKernel ggml_avx512_kernel(const WeightFormat& format);
// The kernel of the highest set at or below `isa` that has one for the format.
MatvecKernel kernel_for(const WeightFormat& format, Isa isa);

// out[n] = rows [row0, row0 + n) of w times xp, split over blas_threads() threads (row blocks of
// multiples of 4) when the matrix is large enough to pay for waking them.
void run_rows(const MatvecKernel& k, float* out, const View& w, const float* xp, const float* xsum, int64_t row0,
              int64_t n);

// B vectors at once: out[b * ld_out + i] = row row0 + i of w times xp[b * ld_x ..] (xsum[b * ld_sum ..]
// their group sums), each vector through `k` exactly as run_rows runs it (the same row blocks, so
// every output has the single-vector arithmetic bit for bit), 16 rows at a time over all B
// vectors, so each weight row comes from memory once and from cache for the other vectors:
// through `rows_batch` when the kernel has one (and B > 1), else `rows` once per vector.
void run_rows_batch(const MatvecKernel& k, float* out, int64_t ld_out, const View& w, const float* xp, int64_t ld_x,
                    const float* xsum, int64_t ld_sum, int64_t B, int64_t row0, int64_t n);

}  // namespace tpcli::tensor::kernels
