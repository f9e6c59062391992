#include "tensor/packed_matrix.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <stdexcept>

#include "tensor/blas.h"
#include "tensor/int8_dot.h"
#include "tensor/packed_kernels.h"
#include "tensor/quant_formats.h"

namespace tpcli::tensor {

std::string WeightFormat::name() const {
  switch (kind) {
    case WeightKind::F32: return "f32";
    case WeightKind::BF16: return "bf16";
    case WeightKind::F16: return "f16";
    case WeightKind::Affine: return "affine " + std::to_string(bits) + "-bit g" + std::to_string(group_size);
    case WeightKind::Mxfp8: return "mxfp8";
    case WeightKind::Ggml: return ggml_traits(ggml).name;
  }
  return "?";
}

WeightFormat WeightFormat::ggml_blocks(GgmlType type) {
  const GgmlTypeTraits& t = ggml_traits(type);
  if (t.block_elements == 1 || !t.dequantizable)
    throw std::invalid_argument(std::string("packed matrix: ggml type ") + t.name + " is not a quantized type tpcli reads");
  WeightFormat f{WeightKind::Ggml, 0, t.block_elements};
  f.ggml = type;
  return f;
}

int64_t WeightFormat::row_bytes(int64_t cols) const {
  if (kind == WeightKind::Ggml) return cols / group_size * ggml_traits(ggml).block_bytes;
  return cols * bits / 8;
}

int WeightFormat::sum_group() const {
  if (kind == WeightKind::Affine) return group_size;
  if (kind != WeightKind::Ggml) return 0;
  switch (ggml) {  // the SIMD kernels apply a group's min (Q4_K) or code offset (Q6_K) to its sum of x
    case GgmlType::Q4_K: return 32;
    case GgmlType::Q6_K: return 16;
    default: return 0;
  }
}

namespace {

void check_format(const WeightFormat& f, int64_t cols) {
  const bool ok = (f.kind == WeightKind::F32 && f.bits == 32) ||
                  ((f.kind == WeightKind::BF16 || f.kind == WeightKind::F16) && f.bits == 16) ||
                  (f.kind == WeightKind::Mxfp8 && f.bits == 8 && f.group_size == 32) ||
                  (f.kind == WeightKind::Affine && f.bits >= 2 && f.bits <= 8 &&
                   (f.group_size == 32 || f.group_size == 64 || f.group_size == 128)) ||
                  (f.kind == WeightKind::Ggml && f.bits == 0 && f.group_size == ggml_traits(f.ggml).block_elements &&
                   f.group_size > 1 && ggml_traits(f.ggml).dequantizable);
  if (!ok) throw std::invalid_argument("packed matrix: unsupported format " + f.name());
  if (f.quantized() && cols % f.group_size != 0)
    throw std::invalid_argument("packed matrix: " + std::to_string(cols) + " columns are not a multiple of the " +
                                f.name() + " group size " + std::to_string(f.group_size));
}

int64_t words_for(int64_t bytes) { return (bytes + 3) / 4; }

}  // namespace

namespace {
std::atomic<bool> int8_activations_on{false};
}  // namespace

void set_int8_activations(bool on) { int8_activations_on.store(on); }
bool int8_activations() { return int8_activations_on.load(); }

namespace kernels {

MatvecKernel kernel_for(const WeightFormat& f, Isa isa) {
  MatvecKernel k;
  if (isa == Isa::Avx512) k = avx512_kernel(f);
  if (!k.rows && (isa == Isa::Avx512 || isa == Isa::Avx2)) k = avx2_kernel(f);
  if (!k.rows) k = scalar_kernel(f);
  return k;
}

namespace {

// block(a, b) for row blocks [a, b) covering [0, n), split over blas_threads() threads when the
// matrix is large enough to pay for waking them.
template <typename Block>
void for_row_blocks(const View& w, int64_t n, Block block) {
  const int threads = blas_threads();
  // Threads pay off only when the matrix is far larger than the cost of waking them: 2^18
  // elements for f32 (as tuned for it), 2^18 bytes for the formats that convert as they read.
  const int64_t enough = w.format.kind == WeightKind::F32 ? int64_t{1} << 20 : int64_t{1} << 18;
  if (threads > 1 && n * w.row_bytes >= enough && n >= 4 * threads) {
#pragma omp parallel num_threads(threads)
    {
      // Row blocks that are multiples of 4 keep the 4-row kernels busy.
      const int t = omp_get_thread_num(), T = omp_get_num_threads();
      const int64_t per = ((n + T - 1) / T + 3) / 4 * 4;
      const int64_t a = std::min<int64_t>(n, t * per), b = std::min<int64_t>(n, a + per);
      if (a < b) block(a, b);
    }
    return;
  }
  block(0, n);
}

}  // namespace

void run_rows(const MatvecKernel& k, float* out, const View& w, const float* xp, const float* xsum, int64_t row0,
              int64_t n) {
  for_row_blocks(w, n, [&](int64_t a, int64_t b) { k.rows(out + a, w, xp, xsum, row0 + a, row0 + b); });
}

void run_rows_batch(const MatvecKernel& k, float* out, int64_t ld_out, const View& w, const float* xp, int64_t ld_x,
                    const float* xsum, int64_t ld_sum, int64_t B, int64_t row0, int64_t n) {
  // 16 rows (a multiple of the kernels' 4) of the widest rows tpcli meets stay in L2 across the
  // B vectors; a block boundary inside a thread's rows falls where the 4-row kernels would step anyway.
  constexpr int64_t ROWS = 16;
  Vectors vectors{xp, ld_x, xsum, ld_sum, B};
  // The batch kernels read a tile's vectors side by side, column for column: vectors a multiple of
  // 4 KB apart would all fall in the same L1 sets and, past its 12 ways, evict each other, so
  // such a batch is copied to a stride one cache line longer first.
  thread_local std::vector<float> staggered;  // [B, ld_x + 16]
  if (k.rows_batch && B > 1 && (ld_x * int64_t{sizeof(float)}) % 4096 == 0) {
    const int64_t ld = ld_x + 16;
    staggered.resize(static_cast<size_t>(B * ld));
    for (int64_t v = 0; v < B; ++v)  // bytes: prepared x may be bf16 words (packed_kernels_x86.cpp)
      std::memcpy(staggered.data() + v * ld, xp + v * ld_x, static_cast<size_t>(ld_x) * sizeof(float));
    vectors.xp = staggered.data();
    vectors.ld_x = ld;
  }
  // Many vectors (a prompt's rows) go in chunks whose x fits in L2 beside the row block: every row
  // block then reads its chunk from L2 instead of streaming all B vectors from memory again.
  const int64_t chunk = std::clamp<int64_t>((int64_t{512} << 10) / std::max<int64_t>(ld_x * int64_t{sizeof(float)}, 1) / 8 * 8,
                                            8, std::max<int64_t>(B, 8));
  for_row_blocks(w, n, [&](int64_t a, int64_t b) {
    for (int64_t v0 = 0; v0 < B; v0 += chunk) {
      const Vectors part = vectors.slice(v0, std::min(chunk, B - v0));
      for (int64_t c0 = a; c0 < b; c0 += ROWS) {
        const int64_t c1 = std::min(b, c0 + ROWS);
        float* o = out + v0 * ld_out + c0;
        if (k.rows_batch && part.count > 1) {  // one vector: `rows` itself, with its own row order
          k.rows_batch(o, ld_out, w, part, row0 + c0, row0 + c1);
          continue;
        }
        for (int64_t v = 0; v < part.count; ++v) k.rows(o + v * ld_out, w, part.x(v), part.sum(v), row0 + c0, row0 + c1);
      }
    }
  });
}

void run_int8_rows(const Int8Kernel& k, float* out, const View& w, const QuantizedInput& x, int64_t row0, int64_t n) {
  for_row_blocks(w, n, [&](int64_t a, int64_t b) { k.rows(out + a, w, x, row0 + a, row0 + b); });
}

void run_int8_rows_batch(const Int8Kernel& k, float* out, int64_t ld_out, const View& w, const QuantizedInput* x,
                         int64_t B, int64_t row0, int64_t n) {
  // 16 rows' codes stay in L1 while the batch's vectors go through them (x is a byte per column).
  constexpr int64_t ROWS = 16;
  for_row_blocks(w, n, [&](int64_t a, int64_t b) {
    for (int64_t c0 = a; c0 < b; c0 += ROWS) {
      const int64_t c1 = std::min(b, c0 + ROWS);
      if (k.rows_batch && B > 1) {
        k.rows_batch(out + c0, ld_out, w, x, B, row0 + c0, row0 + c1);
        continue;
      }
      for (int64_t v = 0; v < B; ++v) k.rows(out + v * ld_out + c0, w, x[v], row0 + c0, row0 + c1);
    }
  });
}

}  // namespace kernels

PackedMatrix PackedMatrix::from_f32(const float* w, int64_t rows, int64_t cols, WeightFormat format) {
  check_format(format, cols);
  PackedMatrix m;
  m.rows_ = rows;
  m.cols_ = cols;
  m.format_ = format;
  m.data_.assign(static_cast<size_t>(words_for(rows * m.row_bytes())), 0u);
  const int64_t G = m.groups_per_row();
  switch (format.kind) {
    case WeightKind::F32:
      std::memcpy(m.data_.data(), w, static_cast<size_t>(rows * cols) * sizeof(float));
      break;
    case WeightKind::BF16:
    case WeightKind::F16: {
      auto* h = reinterpret_cast<uint16_t*>(m.data_.data());
      for (int64_t i = 0; i < rows * cols; ++i)
        h[i] = format.kind == WeightKind::BF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
      break;
    }
    case WeightKind::Affine:
      m.scales_.resize(static_cast<size_t>(rows * G));
      m.biases_.resize(static_cast<size_t>(rows * G));
      affine_quantize(m.data_.data(), m.scales_.data(), m.biases_.data(), w, rows, cols, format.bits, format.group_size);
      break;
    case WeightKind::Mxfp8:
      m.scale_bytes_.resize(static_cast<size_t>(rows * G));
      mxfp8_quantize(m.data_.data(), m.scale_bytes_.data(), w, rows, cols);
      break;  case WeightKind::Ggml:
      throw std::invalid_argument("packed matrix: quantizing to " + format.name() + " is not supported");
  }
  return m;
}

PackedMatrix PackedMatrix::copy_of(WeightFormat format, int64_t rows, int64_t cols, const Parts& parts, int64_t row0,
                                   int64_t nrows, const std::vector<Columns>& columns) {
  check_format(format, cols);
  if (row0 < 0 || nrows < 0 || row0 + nrows > rows)
    throw std::invalid_argument("packed matrix: rows [" + std::to_string(row0) + ", +" + std::to_string(nrows) +
                                ") outside " + std::to_string(rows));
  // A borrowed full matrix, then the ordinary slicing (which checks the column ranges).
  PackedMatrix full;
  full.rows_ = nrows;
  full.cols_ = cols;
  full.format_ = format;
  const int64_t rb = full.row_bytes(), G = full.groups_per_row();
  full.data_.assign(static_cast<size_t>(words_for(nrows * rb)), 0u);
  std::memcpy(full.data_.data(), static_cast<const uint8_t*>(parts.data) + row0 * rb, static_cast<size_t>(nrows * rb));
  if (format.kind == WeightKind::Affine) {
    full.scales_.assign(parts.scales + row0 * G, parts.scales + (row0 + nrows) * G);
    full.biases_.assign(parts.biases + row0 * G, parts.biases + (row0 + nrows) * G);
  } else if (format.kind == WeightKind::Mxfp8) {
    full.scale_bytes_.assign(parts.scale_bytes + row0 * G, parts.scale_bytes + (row0 + nrows) * G);
  }
  return columns.empty() ? full : full.slice_columns(columns);
}

int64_t PackedMatrix::bytes() const {
  return rows_ * row_bytes() + static_cast<int64_t>((scales_.size() + biases_.size()) * sizeof(float) +
                                                    scale_bytes_.size());
}

PackedMatrix::Parts PackedMatrix::parts() const {
  return {data_.data(), scales_.empty() ? nullptr : scales_.data(), biases_.empty() ? nullptr : biases_.data(),
          scale_bytes_.empty() ? nullptr : scale_bytes_.data()};
}

void PackedMatrix::dequantize_row(float* out, int64_t r) const {
  const uint8_t* row = row_data(r);
  const int64_t G = groups_per_row();
  switch (format_.kind) {
    case WeightKind::F32:
      std::memcpy(out, row, static_cast<size_t>(cols_) * sizeof(float));
      break;
    case WeightKind::BF16:
    case WeightKind::F16:
      for (int64_t c = 0; c < cols_; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * c, 2);
        out[c] = format_.kind == WeightKind::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      break;
    case WeightKind::Affine:
      affine_dequantize_row(out, reinterpret_cast<const uint32_t*>(row), scales_.data() + r * G,
                            biases_.data() + r * G, cols_, format_.bits, format_.group_size);
      break;
    case WeightKind::Mxfp8:
      mxfp8_dequantize_row(out, reinterpret_cast<const uint32_t*>(row), scale_bytes_.data() + r * G, cols_);
      break;
    case WeightKind::Ggml:
      tensor::dequantize_row(format_.ggml, reinterpret_cast<const std::byte*>(row), out, cols_);
      break;
  }
}

void PackedMatrix::dequantize_row_columns(float* out, int64_t r, int64_t c0, int64_t count) const {
  const uint8_t* row = row_data(r);
  const int64_t G = groups_per_row(), GS = format_.group_size;
  switch (format_.kind) {
    case WeightKind::F32:
      std::memcpy(out, row + c0 * 4, static_cast<size_t>(count) * sizeof(float));
      break;
    case WeightKind::BF16:
      for (int64_t c = 0; c < count; ++c) {  // bf16_to_f32, inline: the high half of an f32
        uint16_t h;
        std::memcpy(&h, row + 2 * (c0 + c), 2);
        out[c] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
      }
      break;
    case WeightKind::F16:
      for (int64_t c = 0; c < count; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * (c0 + c), 2);
        out[c] = f16_to_f32(h);
      }
      break;
    case WeightKind::Affine:  // c0 is a whole group: GS elements are a whole number of words
      affine_dequantize_row(out, reinterpret_cast<const uint32_t*>(row) + c0 * format_.bits / 32,
                            scales_.data() + r * G + c0 / GS, biases_.data() + r * G + c0 / GS, count, format_.bits, GS);
      break;
    case WeightKind::Mxfp8:
      mxfp8_dequantize_row(out, reinterpret_cast<const uint32_t*>(row) + c0 / 4, scale_bytes_.data() + r * G + c0 / GS,
                           count);
      break;
    case WeightKind::Ggml:  // c0 is a whole block
      tensor::dequantize_row(format_.ggml, reinterpret_cast<const std::byte*>(row + format_.row_bytes(c0)), out, count);
      break;
  }
}

Tensor PackedMatrix::dequantize() const {
  Tensor t({rows_, cols_});
  for (int64_t r = 0; r < rows_; ++r) dequantize_row(t.data() + r * cols_, r);
  return t;
}

void PackedMatrix::matvec(float* out, const float* x, int64_t row0, int64_t n, Isa isa) const {
  if (row0 < 0 || n < 0 || row0 + n > rows_)
    throw std::out_of_range("packed matvec: rows [" + std::to_string(row0) + ", +" + std::to_string(n) +
                            ") outside " + std::to_string(rows_));
  if (n == 0) return;
  const kernels::View view{format_, cols_, row_bytes(), row_data(0), scales_.data(), biases_.data(),
                           scale_bytes_.data()};
  if (int8_activations() && kernels::int8_matvec_format(format_)) {  // integer dot products
    const kernels::Int8Kernel k = kernels::int8_kernel_for(format_, isa);
    thread_local kernels::QuantizedInput xq;
    kernels::quantize_input(xq, x, cols_, format_.group_size, k.nibble_order);
    kernels::run_int8_rows(k, out, view, xq, row0, n);
    return;
  }
  const kernels::MatvecKernel k = kernels::kernel_for(format_, isa);
  thread_local std::vector<float> xp, xsum;  // [K] x in the kernel's order, [G] group sums
  const float* xk = x;
  if (k.prepare) {
    xp.resize(static_cast<size_t>(cols_));
    k.prepare(xp.data(), x, cols_);
    xk = xp.data();
  }
  if (const int64_t GS = format_.sum_group()) {
    const int64_t G = cols_ / GS;
    xsum.assign(static_cast<size_t>(G), 0.0f);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < GS; ++i) xsum[static_cast<size_t>(g)] += x[g * GS + i];
  }
  kernels::run_rows(k, out, view, xk, xsum.data(), row0, n);
}

void PackedMatrix::matvec_batch(float* out, int64_t ld_out, const float* x, int64_t B, int64_t row0, int64_t n,
                                Isa isa) const {
  if (row0 < 0 || n < 0 || row0 + n > rows_ || B < 0)
    throw std::out_of_range("packed matvec_batch: " + std::to_string(B) + " vectors, rows [" + std::to_string(row0) + ", +" +
                            std::to_string(n) + ") outside " + std::to_string(rows_));
  if (n == 0 || B == 0) return;
  const int64_t ld = ld_out ? ld_out : n;
  const kernels::View view{format_, cols_, row_bytes(), row_data(0), scales_.data(), biases_.data(),
                           scale_bytes_.data()};
  if (int8_activations() && kernels::int8_matvec_format(format_)) {  // each vector quantized on its own, as matvec does
    const kernels::Int8Kernel k = kernels::int8_kernel_for(format_, isa);
    thread_local std::vector<kernels::QuantizedInput> xq;  // [B]
    if (static_cast<int64_t>(xq.size()) < B) xq.resize(static_cast<size_t>(B));
    for (int64_t v = 0; v < B; ++v)
      kernels::quantize_input(xq[static_cast<size_t>(v)], x + v * cols_, cols_, format_.group_size, k.nibble_order);
    kernels::run_int8_rows_batch(k, out, ld, view, xq.data(), B, row0, n);
    return;
  }
  const kernels::MatvecKernel k = kernels::kernel_for(format_, isa);
  thread_local std::vector<float> xp, xsum;  // [B, K] the vectors in the kernel's order, [B, G] group sums
  const float* xk = x;
  if (k.prepare) {
    xp.resize(static_cast<size_t>(B * cols_));
    for (int64_t v = 0; v < B; ++v) k.prepare(xp.data() + v * cols_, x + v * cols_, cols_);
    xk = xp.data();
  }
  const int64_t GS = format_.sum_group(), G = GS ? cols_ / GS : 0;
  if (GS) {
    xsum.assign(static_cast<size_t>(B * G), 0.0f);
    for (int64_t v = 0; v < B; ++v)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < GS; ++i) xsum[static_cast<size_t>(v * G + g)] += x[v * cols_ + g * GS + i];
  }
  kernels::run_rows_batch(k, out, ld, view, xk, cols_, GS ? xsum.data() : nullptr, G, B, row0, n);
}

void PackedMatrix::matmul(float* out, const float* x, int64_t N, int64_t row0, int64_t n, int64_t ld_out) const {
  const int64_t ld = ld_out ? ld_out : n;
  if (N == 1) {
    matvec(out, x, row0, n);
    return;
  }
  if (decode_rows()) {  // each row as if alone (blas.h DecodeRows)
    matvec_batch(out, ld, x, N, row0, n);
    return;
  }
  if (format_.kind == WeightKind::F32) {
    const auto* w = reinterpret_cast<const float*>(row_data(row0));
    gemm(Trans::No, Trans::Yes, N, n, cols_, 1.0f, x, cols_, w, cols_, 0.0f, out, ld);
    return;
  }
  // Dequantize a tile of rows at a time (a few hundred KB, cache-resident), then gemm into its columns.
  const int64_t TILE = std::max<int64_t>(16, (int64_t{1} << 16) / std::max<int64_t>(cols_, 1));
  thread_local std::vector<float> tile;  // [TILE, K]
  tile.resize(static_cast<size_t>(TILE * cols_));
  for (int64_t t0 = 0; t0 < n; t0 += TILE) {
    const int64_t rows = std::min(TILE, n - t0);
    for (int64_t i = 0; i < rows; ++i) dequantize_row(tile.data() + i * cols_, row0 + t0 + i);
    gemm(Trans::No, Trans::Yes, N, rows, cols_, 1.0f, x, cols_, tile.data(), cols_, 0.0f, out + t0, ld);
  }
}

void PackedMatrix::transposed_product(float* dinp, const float* dout, int64_t N, float beta, int64_t ld_dout,
                                      int64_t ld_dinp) const {
  const int64_t R = rows_, K = cols_;
  const int64_t ldo = ld_dout ? ld_dout : R, ldi = ld_dinp ? ld_dinp : K;
  if (N <= 0 || K == 0) return;
  if (R == 0 || format_.kind == WeightKind::F32) {  // the stored matrix is the f32 one (R == 0: dinp *= beta)
    gemm(Trans::No, Trans::No, N, K, R, 1.0f, dout, ldo, reinterpret_cast<const float*>(row_data(0)), K, beta, dinp, ldi);
    return;
  }
  // Column blocks of W, all R rows each: one gemm per block contracts over the whole R (BLIS's
  // efficient shape) and writes its block of dinp once; only the block is ever dequantized.
  // Wider blocks repack dout (BLIS packs A again for every call) fewer times; blocks of equal
  // width (whole groups) keep the last one from being a narrow, slow gemm. 1 MB rather than 512 KB:
  // OUT = 768, IN = 288 (bench matmul) then takes one block, ~0.92x of sgemm instead of ~0.85x.
  constexpr int64_t SCRATCH_FLOATS = (int64_t{1024} << 10) / 4;
  const int64_t unit = format_.quantized() ? format_.group_size : 16;
  const int64_t widest = std::max<int64_t>(unit, SCRATCH_FLOATS / R / unit * unit);
  const int64_t blocks = (K + widest - 1) / widest;
  const int64_t width = std::min(K, ((K + blocks - 1) / blocks + unit - 1) / unit * unit);
  thread_local std::vector<float> block;  // [R, width]
  block.resize(static_cast<size_t>(R * width));
  for (int64_t c0 = 0; c0 < K; c0 += width) {
    const int64_t cols = std::min(width, K - c0);
    for (int64_t r = 0; r < R; ++r) dequantize_row_columns(block.data() + r * cols, r, c0, cols);
    gemm(Trans::No, Trans::No, N, cols, R, 1.0f, dout, ldo, block.data(), cols, beta, dinp + c0, ldi);
  }
}

PackedMatrix PackedMatrix::slice_rows(int64_t first, int64_t count) const {
  return copy_of(format_, rows_, cols_, parts(), first, count);
}

PackedMatrix PackedMatrix::concat_rows(const std::vector<PackedMatrix>& parts) {
  if (parts.empty()) throw std::invalid_argument("packed matrix: nothing to concatenate");
  PackedMatrix m;
  m.cols_ = parts[0].cols_;
  m.format_ = parts[0].format_;
  for (const auto& p : parts) {
    if (p.cols_ != m.cols_ || !(p.format_ == m.format_))
      throw std::invalid_argument("packed matrix: concatenated parts differ in columns or format");
    m.rows_ += p.rows_;
  }
  m.data_.assign(static_cast<size_t>(words_for(m.rows_ * m.row_bytes())), 0u);
  auto* dst = reinterpret_cast<uint8_t*>(m.data_.data());
  for (const auto& p : parts) {
    std::memcpy(dst, p.row_data(0), static_cast<size_t>(p.rows_ * p.row_bytes()));
    dst += p.rows_ * p.row_bytes();
    m.scales_.insert(m.scales_.end(), p.scales_.begin(), p.scales_.end());
    m.biases_.insert(m.biases_.end(), p.biases_.begin(), p.biases_.end());
    m.scale_bytes_.insert(m.scale_bytes_.end(), p.scale_bytes_.begin(), p.scale_bytes_.end());
  }
  return m;
}

PackedMatrix PackedMatrix::slice_columns(const std::vector<Columns>& columns) const {
  const int64_t unit = format_.quantized() ? format_.group_size : 1;
  int64_t local = 0;
  for (const auto& c : columns) {
    if (c.offset < 0 || c.count < 0 || c.offset + c.count > cols_)
      throw std::invalid_argument("packed matrix: columns [" + std::to_string(c.offset) + ", +" +
                                  std::to_string(c.count) + ") outside " + std::to_string(cols_));
    if (c.offset % unit != 0 || c.count % unit != 0)
      throw std::invalid_argument("packed matrix: columns [" + std::to_string(c.offset) + ", +" +
                                  std::to_string(c.count) + ") do not cover whole groups of " + std::to_string(unit) +
                                  " (" + format_.name() + ")");
    local += c.count;
  }
  PackedMatrix m;
  m.rows_ = rows_;
  m.cols_ = local;
  m.format_ = format_;
  const int64_t rb = m.row_bytes(), G = groups_per_row(), GL = m.groups_per_row();
  m.data_.assign(static_cast<size_t>(words_for(rows_ * rb)), 0u);
  auto* dst = reinterpret_cast<uint8_t*>(m.data_.data());
  for (int64_t r = 0; r < rows_; ++r) {  // a group, a block (or a float column) is a whole number of bytes
    const uint8_t* src = row_data(r);
    for (const auto& c : columns) {
      const int64_t bytes = format_.row_bytes(c.count);
      std::memcpy(dst, src + format_.row_bytes(c.offset), static_cast<size_t>(bytes));
      dst += bytes;
    }
  }
  auto per_group = [&](const auto& full, auto& out) {
    out.resize(static_cast<size_t>(rows_ * GL));
    auto it = out.begin();
    for (int64_t r = 0; r < rows_; ++r)
      for (const auto& c : columns)
        it = std::copy(full.begin() + r * G + c.offset / unit, full.begin() + r * G + (c.offset + c.count) / unit, it);
  };
  if (format_.kind == WeightKind::Affine) {
    per_group(scales_, m.scales_);
    per_group(biases_, m.biases_);
  } else if (format_.kind == WeightKind::Mxfp8) {
    per_group(scale_bytes_, m.scale_bytes_);
  }
  return m;
}

}  // namespace tpcli::tensor
