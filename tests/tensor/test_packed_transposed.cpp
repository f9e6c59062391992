// PackedMatrix::transposed_product (the input gradient through a frozen packed weight, QLoRA's
// backward): dinp = beta * dinp + dout @ dequantize(W), for every format, against the f32 gemm with
// the dequantized matrix and against a double sum; odd row counts, column counts that are not
// multiples of 16 (the 16-bit formats' block unit) nor, where the format allows, of the group;
// several column blocks with a narrower last one (R = 2000: blocks of 96 and of 112 columns);
// strided operands.
//
// Tolerance: both sides multiply the same f32 values (W dequantized) and differ only in the order
// of the f32 sums over R, so |got - ref| <= 2 * gamma_R * sum_r |dout[n, r] * W[r, k]| at worst
// (gamma_R ~ R * 6e-8); blocked sums are far below that (~sqrt(R) * 6e-8 = 1e-6 at R = 300). We
// allow 1e-5 of sum_r |dout * W| (plus the beta term's own rounding), which a wrong element, a
// wrong block or a group misread would exceed by orders of magnitude.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tensor/blas.h"
#include "tensor/packed_matrix.h"

using namespace tpcli::tensor;

namespace {

std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Case {
  WeightFormat format;
  int64_t R, K;  // K not a multiple of the 128-column block; R odd
};

std::vector<Case> cases() {
  std::vector<Case> s = {{WeightFormat::f32(), 37, 301},  {WeightFormat::bf16(), 37, 301},
                          {WeightFormat::f16(), 300, 131}, {WeightFormat::bf16(), 1, 7},
                          {WeightFormat::mxfp8(), 37, 160}, {WeightFormat::mxfp8(), 300, 288},
                          {WeightFormat::affine(4, 32), 37, 160}, {WeightFormat::affine(4, 64), 300, 192},
                          {WeightFormat::affine(8, 64), 37, 320}, {WeightFormat::affine(4, 128), 37, 384},
                          {WeightFormat::affine(3, 32), 37, 96},  {WeightFormat::affine(6, 64), 37, 192},
                          {WeightFormat::affine(8, 32), 300, 288}, {WeightFormat::affine(4, 32), 2000, 288},
                          {WeightFormat::bf16(), 2000, 301}, {WeightFormat::affine(2, 64), 37, 192},
                          {WeightFormat::affine(5, 128), 37, 256}, {WeightFormat::affine(5, 32), 300, 2016}};
  return s;
}

}  // namespace

TEST_CASE("packed transposed product: every format equals the f32 gemm with the dequantized matrix",
          "[tensor][quant][backward]") {
  std::mt19937 rng(30);
  for (const Case& s : cases()) {
    const int64_t R = s.R, K = s.K;
    const auto w = random_floats(rng, size_t(R * K), 0.05f);
    const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, s.format);
    const Tensor d = m.dequantize();  // [R, K]
    for (int64_t N : {1, 37}) {
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        INFO(s.format.name() << " R=" << R << " K=" << K << " N=" << N << " beta=" << beta);
        // strided: dout [N, R + 3], dinp [N, K + 5]; the padding must stay untouched
        const int64_t ldo = R + 3, ldi = K + 5;
        const auto dout = random_floats(rng, size_t(N * ldo));
        const auto start = random_floats(rng, size_t(N * ldi));
        std::vector<float> got = start;
        if (beta == 0.0f)  // overwritten, NaNs included
          for (int64_t n = 0; n < N; ++n)
            for (int64_t k = 0; k < K; ++k) got[size_t(n * ldi + k)] = std::numeric_limits<float>::quiet_NaN();
        m.transposed_product(got.data(), dout.data(), N, beta, ldo, ldi);
        std::vector<float> ref = start;
        gemm(Trans::No, Trans::No, N, K, R, 1.0f, dout.data(), ldo, d.data(), K, beta, ref.data(), ldi);
        int64_t bad = 0, bad_double = 0;
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t k = 0; k < K; ++k) {
            double exact = beta * double(start[size_t(n * ldi + k)]), magnitude = std::fabs(exact);
            for (int64_t r = 0; r < R; ++r) {
              const double t = double(dout[size_t(n * ldo + r)]) * d[r * K + k];
              exact += t;
              magnitude += std::fabs(t);
            }
            const double tol = 1e-5 * magnitude + 1e-30;
            const float g = got[size_t(n * ldi + k)];
            if (!(std::fabs(g - ref[size_t(n * ldi + k)]) <= tol)) ++bad;
            if (!(std::fabs(g - exact) <= tol)) ++bad_double;
          }
          for (int64_t k = K; k < ldi; ++k) CHECK(got[size_t(n * ldi + k)] == start[size_t(n * ldi + k)]);
        }
        CHECK(bad == 0);
        CHECK(bad_double == 0);
      }
    }
  }
}

TEST_CASE("packed transposed product: the free function, contiguous, and a matrix with no rows",
          "[tensor][quant][backward]") {
  std::mt19937 rng(31);
  const int64_t R = 5, K = 64, N = 3;
  const auto w = random_floats(rng, size_t(R * K));
  const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, WeightFormat::affine(4, 64));
  const auto dout = random_floats(rng, size_t(N * R));
  std::vector<float> a(size_t(N * K), 1.0f), b(size_t(N * K), 1.0f);
  packed_transposed_product(a.data(), dout.data(), m, N, 1.0f);
  gemm(Trans::No, Trans::No, N, K, R, 1.0f, dout.data(), R, m.dequantize().data(), K, 1.0f, b.data(), K);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-5));
  // no rows: nothing flows back, dinp = beta * dinp
  const PackedMatrix none = m.slice_rows(0, 0);
  std::vector<float> c(size_t(N * K), 2.0f);
  none.transposed_product(c.data(), nullptr, N, 0.5f);
  for (float x : c) CHECK(x == 1.0f);
}
