// tensor/: the batched decode product is batch-invariant: every vector of a batch gets, bit for
// bit, what the single-vector matvec gives it alone, in every weight format and instruction set,
// with one thread and with the matrix split over two, whatever the batch size, for any row range.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "support/isas.h"
#include "support/normal_values.h"
#include "tensor/blas.h"
#include "tensor/isa.h"
#include "tensor/packed_matrix.h"

using namespace tpcli::tensor;

using tpcli::testing::normal_values;

namespace {

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("matvec_batch: every vector's output is the single-vector matvec's, bit for bit, in every format", "[tensor][batch]") {
  const WeightFormat formats[] = {WeightFormat::f32(),        WeightFormat::bf16(),       WeightFormat::f16(),
                                  WeightFormat::affine(8, 64), WeightFormat::affine(4, 32), WeightFormat::mxfp8()};
  // 37 rows: 16-row blocks and a 4-row kernel's tail; 1024 x 1024 is large enough to be split over threads
  for (auto [R, K] : {std::pair<int64_t, int64_t>{37, 256}, std::pair<int64_t, int64_t>{1024, 1024}})
    for (const WeightFormat& f : formats) {
      const PackedMatrix w = PackedMatrix::from_f32(normal_values(static_cast<size_t>(R * K), 1).data(), R, K, f);
      for (int B : {1, 3, 16}) {
        const std::vector<float> x = normal_values(static_cast<size_t>(B * K), 2 + static_cast<uint32_t>(B));
        for (Isa isa : tpcli::testing::isas_here())
          for (int threads : {1, 2}) {
            set_blas_threads(threads);
            for (auto [row0, n] : {std::pair<int64_t, int64_t>{0, R}, std::pair<int64_t, int64_t>{5, R - 9}}) {
              std::vector<float> batched(static_cast<size_t>(B * n)), alone(static_cast<size_t>(n));
              w.matvec_batch(batched.data(), 0, x.data(), B, row0, n, isa);
              for (int v = 0; v < B; ++v) {
                w.matvec(alone.data(), x.data() + v * K, row0, n, isa);
                INFO(f.name() << " " << R << "x" << K << ", B " << B << ", vector " << v << ", isa " << int(isa) << ", "
                              << threads << " threads, rows " << row0 << "+" << n);
                CHECK(same_bits(batched.data() + v * n, alone.data(), static_cast<size_t>(n)));
              }
            }
          }
        set_blas_threads(1);
      }
    }
}

// The multi-vector kernels (packed_kernels.h rows_batch) tile the batch by a few vectors and walk the
// rows one or two at a time: batch sizes around and past their tiles (4 and 8), row counts that
// are not multiples of 4 (the f32 kernels' 4-row passes and tails) and columns with a tail after
// the widest vector step (f32 and half), in every format, group size and instruction set here.
TEST_CASE("matvec_batch: the multi-vector kernels give each vector the single-vector bits", "[tensor][batch]") {
  const WeightFormat formats[] = {WeightFormat::f32(),         WeightFormat::bf16(),        WeightFormat::f16(),
                                  WeightFormat::affine(8, 32), WeightFormat::affine(8, 64), WeightFormat::affine(8, 128),
                                  WeightFormat::affine(4, 32), WeightFormat::affine(4, 64), WeightFormat::affine(4, 128),
                                  WeightFormat::mxfp8()};
  const int BATCHES[] = {1, 2, 3, 4, 5, 7, 8, 16, 17};
  for (const WeightFormat& f : formats) {
    // 203: a tail after every vector width (8, 16, 32); quantized rows hold whole groups. 4096:
    // vectors a multiple of 4 KB apart (run_rows_batch restrides them) and several column blocks
    // (the kernels pause each row's sums between blocks); 4109: both with a tail.
    const std::vector<int64_t> widths =
        f.quantized() ? std::vector<int64_t>{384, 4096} : std::vector<int64_t>{203, 4096, 4109};
    for (int64_t K : widths)
      for (int64_t R : {13, 64, 67}) {
        const PackedMatrix w = PackedMatrix::from_f32(normal_values(static_cast<size_t>(R * K), 21).data(), R, K, f);
        const std::vector<float> x = normal_values(static_cast<size_t>(17 * K), 22);
        for (Isa isa : tpcli::testing::isas_here())
          for (int B : BATCHES)
            for (auto [row0, n] : {std::pair<int64_t, int64_t>{0, R}, std::pair<int64_t, int64_t>{3, R - 3}}) {
              std::vector<float> batched(static_cast<size_t>(B * n)), alone(static_cast<size_t>(n));
              w.matvec_batch(batched.data(), 0, x.data(), B, row0, n, isa);
              bool same = true;
              for (int v = 0; v < B; ++v) {
                w.matvec(alone.data(), x.data() + v * K, row0, n, isa);
                same = same && same_bits(batched.data() + v * n, alone.data(), static_cast<size_t>(n));
              }
              INFO(f.name() << " " << R << "x" << K << ", B " << B << ", isa " << isa_name(isa) << ", rows " << row0 << "+" << n);
              CHECK(same);
            }
      }
  }
}

TEST_CASE("matvec_batch: the f32 BLAS-door form equals tensor::matvec per vector, with a row stride", "[tensor][batch]") {
  const int64_t N = 300, K = 512, B = 5, LD = N + 7;
  const std::vector<float> w = normal_values(static_cast<size_t>(N * K), 11), x = normal_values(static_cast<size_t>(B * K), 12);
  std::vector<float> batched(static_cast<size_t>(B * LD), -1.0f), alone(static_cast<size_t>(N));
  matvec_batch(batched.data(), LD, w.data(), x.data(), B, N, K);
  for (int64_t v = 0; v < B; ++v) {
    matvec(alone.data(), w.data(), x.data() + v * K, N, K);
    CHECK(same_bits(batched.data() + v * LD, alone.data(), static_cast<size_t>(N)));
    CHECK(batched[static_cast<size_t>(v * LD + N)] == -1.0f);  // the stride's gap untouched
  }
}

// Every product of several rows (a decode step's sequences, a prompt's tokens) runs through the
// batch kernel: any count N gives each row what N = 1 gives it, through the register tiles (4 or 3
// rows by up to 6 or 4 vectors), their partial tiles and the sixteen-at-a-time reductions.
TEST_CASE("matvec_batch: N = 1..64 rows, each the single-vector bits, f32 with and without a column tail", "[tensor][batch]") {
  for (int64_t K : {256, 203}) {
    const int64_t R = 37;
    const PackedMatrix w = PackedMatrix::from_f32(normal_values(static_cast<size_t>(R * K), 31).data(), R, K, WeightFormat::f32());
    const std::vector<float> x = normal_values(static_cast<size_t>(64 * K), 32);
    for (Isa isa : tpcli::testing::isas_here()) {
      std::vector<float> alone(static_cast<size_t>(64 * R));
      for (int v = 0; v < 64; ++v) w.matvec(alone.data() + v * R, x.data() + v * K, 0, R, isa);
      for (int N = 1; N <= 64; ++N) {
        std::vector<float> batched(static_cast<size_t>(N * R));
        w.matvec_batch(batched.data(), 0, x.data(), N, 0, R, isa);
        INFO("K " << K << ", N " << N << ", isa " << isa_name(isa));
        CHECK(same_bits(batched.data(), alone.data(), static_cast<size_t>(N * R)));
      }
    }
  }
}
