// tpcli::tensor — a frozen inference weight matrix in one of the stored formats: f32, bf16, f16,
// MLX affine (bits, group size), mxfp8 (tensor/quant_formats.h) or a ggml block type as a GGUF file
// stores it (tensor/ggml_blocks.h: Q8_0, Q4_K, ...). Kernels read the stored form directly (no
// dequantized copy of the matrix) and accumulate in f32.
//
// Dimension legend: R rows (output features), K columns (input features), N input rows (tokens),
// GS group size, G = K / GS groups per row.
//
//   matvec     out[R] = W[R, K] @ x[K]            decode; AVX-512 / AVX2 / plain C++ by CPU
//   matmul     out[N, R] = x[N, K] @ W^T          prefill/training shapes: a tile of rows is
//                                                 dequantized to f32 at a time, then BLIS gemm
//   transposed_product dinp[N, K] = dout[N, R] @ W  backward through a frozen matrix (QLoRA): a
//                                                 block of columns dequantized at a time, then BLIS gemm
//   dequantize_row                                embedding lookups
//   slice_rows / slice_columns                    sharding (columns: whole groups only)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/aligned_storage.h"
#include "tensor/ggml_blocks.h"
#include "tensor/isa.h"
#include "tensor/tensor.h"

namespace tpcli::tensor {

enum class WeightKind { F32, BF16, F16, Affine, Mxfp8, Ggml };

struct WeightFormat {
  WeightKind kind = WeightKind::F32;
  int bits = 32;       // per element: 32, 16, affine 2..8, mxfp8 8; ggml: 0 (its blocks' bytes say)
  int group_size = 0;  // affine 32/64/128, mxfp8 32, ggml the block's values (32 or 256); 0 for the float kinds
  GgmlType ggml = GgmlType::F32;  // kind Ggml: the block type

  static WeightFormat f32() { return {WeightKind::F32, 32, 0}; }
  static WeightFormat bf16() { return {WeightKind::BF16, 16, 0}; }
  static WeightFormat f16() { return {WeightKind::F16, 16, 0}; }
  static WeightFormat affine(int bits, int group_size) { return {WeightKind::Affine, bits, group_size}; }
  static WeightFormat mxfp8() { return {WeightKind::Mxfp8, 8, 32}; }
  // A quantized ggml block type (dequantizable, not a plain number type).
  static WeightFormat ggml_blocks(GgmlType type);
  bool quantized() const { return kind == WeightKind::Affine || kind == WeightKind::Mxfp8 || kind == WeightKind::Ggml; }
  // Bytes of a row of `cols` elements (whole groups or blocks) as stored, scales of other arrays aside.
  int64_t row_bytes(int64_t cols) const;
  // Input columns per group whose sum of x the kernels use (affine: a group); 0: no sums.
  int sum_group() const;
  // "f32", "bf16", "f16", "affine 4-bit g64", "mxfp8", "Q4_K"
  std::string name() const;
  bool operator==(const WeightFormat&) const = default;
};

// A half-open column range [offset, offset + count).
struct Columns {
  int64_t offset = 0, count = 0;
};

// 8- and 4-bit affine weights with int8 activations (llama.cpp's q8_0 scheme; the integer kernels
// of tensor/int8_dot.h): matvec and matvec_batch quantize each x per group to int8 and multiply
// integers, batch-invariant as the float kernels are. Split-invariant where the float path is (the
// sharded-to-all layers' lanes are whole groups, each quantized from its own values; the lanes' sums
// keep their fixed tree: tests/model/test_split_invariance.cpp). Every instruction set gives
// bit-identical results. Off by default (figures in BENCHMARKS.md). Process-wide; set before
// the model runs.
void set_int8_activations(bool on);
bool int8_activations();

class PackedMatrix {
 public:
  PackedMatrix() = default;
  // Converts or quantizes a row-major f32 matrix w[R, K]. Quantized formats need K % GS == 0
  // (std::invalid_argument otherwise).
  static PackedMatrix from_f32(const float* w, int64_t rows, int64_t cols, WeightFormat format);
  // Borrowed stored parts of a matrix (e.g. a mapped file): `data` is the row-major element
  // storage (f32 / 16-bit values, or packed uint32 words), `scales`/`biases` (affine, f32 [R, G])
  // or `scale_bytes` (mxfp8 E8M0 [R, G]). Copies rows [row0, row0 + nrows) and, when `columns` is
  // not empty, only those column ranges (concatenated; group-aligned for quantized formats).
  struct Parts {
    const void* data = nullptr;
    const float* scales = nullptr;
    const float* biases = nullptr;
    const uint8_t* scale_bytes = nullptr;
  };
  static PackedMatrix copy_of(WeightFormat format, int64_t rows, int64_t cols, const Parts& parts, int64_t row0,
                              int64_t nrows, const std::vector<Columns>& columns = {});

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  const WeightFormat& format() const { return format_; }
  bool empty() const { return rows_ == 0; }
  int64_t groups_per_row() const { return format_.group_size ? cols_ / format_.group_size : 0; }
  int64_t row_bytes() const { return format_.row_bytes(cols_); }
  int64_t bytes() const;  // element storage + scales + biases
  Parts parts() const;    // borrowed views of this matrix's storage (for writing files)

  // out[K] = row r, in f32.
  void dequantize_row(float* out, int64_t r) const;
  Tensor dequantize() const;  // [R, K]

  // out[n] = W[row0 + i, :] . x for i < n (defaults: every row). Runs on blas_threads() threads.
  void matvec(float* out, const float* x) const { matvec(out, x, 0, rows_, detected_isa()); }
  void matvec(float* out, const float* x, int64_t row0, int64_t n) const { matvec(out, x, row0, n, detected_isa()); }
  void matvec(float* out, const float* x, int64_t row0, int64_t n, Isa isa) const;
  // B vectors x[B, K] at once: out[B, n] (row stride ld_out, 0 = n) = x @ W[row0 : row0 + n, :]^T,
  // every row of out bit for bit what matvec gives that vector alone (batch-invariant: a sequence's
  // result does not depend on what else is in the batch), each weight row read from memory once.
  void matvec_batch(float* out, int64_t ld_out, const float* x, int64_t B, int64_t row0, int64_t n) const {
    matvec_batch(out, ld_out, x, B, row0, n, detected_isa());
  }
  void matvec_batch(float* out, int64_t ld_out, const float* x, int64_t B, int64_t row0, int64_t n, Isa isa) const;
  // out[N, n] (row stride ld_out, 0 = n) = x[N, K] @ W[row0 : row0 + n, :]^T. N == 1 is matvec.
  void matmul(float* out, const float* x, int64_t N, int64_t ld_out = 0) const { matmul(out, x, N, 0, rows_, ld_out); }
  void matmul(float* out, const float* x, int64_t N, int64_t row0, int64_t n, int64_t ld_out) const;

  // The backward's product: dinp[N, K] (row stride ld_dinp, 0 = K) = beta * dinp + dout[N, R] (row
  // stride ld_dout, 0 = R) @ W[R, K], W dequantized. beta == 0 overwrites dinp (NaN there or not).
  // Memory: no f32 copy of W; a thread-local scratch holds one block of columns, W[:, block]
  // dequantized (all R rows, whole groups), while one gemm contracting over all R writes that
  // block of dinp once. Blocks of equal width, as wide as 1 MB of scratch allows (at least one
  // group): the scratch is at most max(1 MB, R x 512 bytes). f32 matrices go straight to gemm.
  // Runs on the calling thread's blas_threads(). (Measured against row tiles contracted one after
  // another, and against sgemm on the whole dequantized matrix: tpcli bench matmul.)
  void transposed_product(float* dinp, const float* dout, int64_t N, float beta, int64_t ld_dout = 0,
                          int64_t ld_dinp = 0) const;

  // Sharding. Rows [first, first + count); the listed column ranges concatenated (for quantized
  // formats each range must start and end on a group boundary: std::invalid_argument otherwise).
  PackedMatrix slice_rows(int64_t first, int64_t count) const;
  PackedMatrix slice_columns(const std::vector<Columns>& columns) const;
  // The parts' rows one after the other (same format and columns).
  static PackedMatrix concat_rows(const std::vector<PackedMatrix>& parts);

 private:
  // out[count] = W[r, c0 : c0 + count] in f32; c0 and count whole groups (or count reaching K).
  void dequantize_row_columns(float* out, int64_t r, int64_t c0, int64_t count) const;
  const uint8_t* row_data(int64_t r) const { return reinterpret_cast<const uint8_t*>(data_.data()) + r * row_bytes(); }

  int64_t rows_ = 0, cols_ = 0;
  WeightFormat format_;
  template <class T>
  using Storage = std::vector<T, AlignedAllocator<T>>;  // aligned, and in a HugePageArena when one is open
  Storage<uint32_t> data_;        // [R, row_bytes] elements or packed words (rows are whole words when packed)
  Storage<float> scales_;         // affine [R, G]
  Storage<float> biases_;         // affine [R, G]
  Storage<uint8_t> scale_bytes_;  // mxfp8 [R, G], E8M0
};

// dinp[N, IN] = beta * dinp + dout[N, OUT] @ dequantize(W[OUT, IN]): the input gradient through a
// frozen packed weight (PackedMatrix::transposed_product, contiguous rows).
inline void packed_transposed_product(float* dinp, const float* dout, const PackedMatrix& W, int64_t N, float beta) {
  W.transposed_product(dinp, dout, N, beta);
}

}  // namespace tpcli::tensor
