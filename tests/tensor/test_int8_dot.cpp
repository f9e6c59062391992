// The integer matvec of affine 8- and 4-bit weights (src/tensor/int8_dot.h): activation
// quantization against its rule, the plain C++ kernel against a double-precision reference, every
// SIMD set this CPU has bit for bit against the plain C++ one, and the error against f32 activations.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "support/isas.h"
#include "tensor/blas.h"
#include "tensor/int8_dot.h"
#include "tensor/packed_matrix.h"

using namespace tpcli::tensor;

using tpcli::testing::isas_here;

namespace {

std::vector<float> normal_floats(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<WeightFormat> int8_formats() {
  std::vector<WeightFormat> f;
  for (int bits : {8, 4})
    for (int gs : {32, 64, 128}) f.push_back(WeightFormat::affine(bits, gs));
  return f;
}

// sum_g scale * xscale * idot + bias * xsum in double, the integers from the unpacked codes.
double reference_row(const PackedMatrix& m, const kernels::QuantizedInput& q, int64_t r) {
  const PackedMatrix::Parts p = m.parts();
  const auto* row = static_cast<const uint8_t*>(p.data) + r * m.row_bytes();
  const int64_t GS = m.format().group_size, G = m.groups_per_row();
  double y = 0;
  for (int64_t g = 0; g < G; ++g) {
    int64_t idot = 0;
    for (int64_t c = g * GS; c < (g + 1) * GS; ++c) {
      const int code = m.format().bits == 8 ? row[c] : (row[c / 2] >> (4 * (c % 2))) & 15;
      idot += int64_t(code) * q.xq[size_t(c)];
    }
    y += double(p.scales[r * G + g]) * q.xscale[size_t(g)] * double(idot) + double(p.biases[r * G + g]) * q.xsum[size_t(g)];
  }
  return y;
}

// matvec takes the integer path only while tensor::int8_activations() is on.
struct Int8ActivationsOn {
  Int8ActivationsOn() { set_int8_activations(true); }
  ~Int8ActivationsOn() { set_int8_activations(false); }
};

}  // namespace

TEST_CASE("int8 activations: per group, codes in [-127, 127] within half a step, exact sums", "[tensor][quant][kernels]") {
  std::mt19937 rng(3);
  auto x = normal_floats(rng, 256, 2.0f);
  for (int i = 64; i < 128; ++i) x[size_t(i)] = 0.0f;  // an all-zero group
  kernels::QuantizedInput q;
  kernels::quantize_input(q, x.data(), 256, 64, false);
  REQUIRE(q.xscale.size() == 16);  // padded to a multiple of 16 groups with zeros
  CHECK(q.xscale[1] == 0.0f);
  CHECK(q.xscale[4] == 0.0f);
  for (int g = 0; g < 4; ++g) {
    float amax = 0, sum = 0;
    int32_t qsum = 0;
    for (int i = g * 64; i < g * 64 + 64; ++i) {
      amax = std::max(amax, std::fabs(x[size_t(i)]));
      sum += x[size_t(i)];
      qsum += q.xq[size_t(i)];
    }
    CHECK(q.xscale[size_t(g)] == amax / 127.0f);
    CHECK(q.xsum[size_t(g)] == sum);
    CHECK(q.xqsum[size_t(g)] == qsum);
    for (int i = g * 64; i < g * 64 + 64; ++i) {
      CHECK(std::abs(q.xq[size_t(i)]) <= 127);
      CHECK(std::fabs(q.xscale[size_t(g)] * q.xq[size_t(i)] - x[size_t(i)]) <= 0.5001f * q.xscale[size_t(g)]);
    }
  }
  // nibble order: per 32 columns the even ones, then the odd ones
  kernels::QuantizedInput n;
  kernels::quantize_input(n, x.data(), 256, 64, true);
  for (int c = 0; c < 256; ++c) CHECK(n.xq[size_t(c / 32 * 32 + (c % 2) * 16 + (c % 32) / 2)] == q.xq[size_t(c)]);
}

TEST_CASE("int8 matvec: every kernel set equals the plain C++ one bit for bit, and a double reference",
          "[tensor][quant][kernels]") {
  const Int8ActivationsOn on;
  std::mt19937 rng(11);
  for (const WeightFormat& f : int8_formats()) {
    // 11 and 3 groups: full blocks of 8 groups and tails; odd row counts: the paired rows' tail
    for (int64_t G : {11, 3}) {
      const int64_t R = 13, K = G * f.group_size;
      INFO(f.name() << ", " << G << " groups");
      const auto w = normal_floats(rng, size_t(R * K), 0.05f);
      const auto x = normal_floats(rng, size_t(K), 1.0f);
      const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
      kernels::QuantizedInput q;
      kernels::quantize_input(q, x.data(), K, f.group_size, false);
      std::vector<float> plain(static_cast<size_t>(R));
      m.matvec(plain.data(), x.data(), 0, R, Isa::Scalar);
      for (int64_t r = 0; r < R; ++r) CHECK(plain[size_t(r)] == Approx(reference_row(m, q, r)).margin(1e-5));
      for (Isa isa : isas_here()) {
        INFO(isa_name(isa));
        std::vector<float> out(static_cast<size_t>(R), NAN);
        m.matvec(out.data(), x.data(), 0, R, isa);
        for (int64_t r = 0; r < R; ++r) CHECK(out[size_t(r)] == plain[size_t(r)]);
        std::vector<float> part(3, NAN);  // a row range starting on an odd row
        m.matvec(part.data(), x.data(), 5, 3, isa);
        for (int64_t r = 0; r < 3; ++r) CHECK(part[size_t(r)] == plain[size_t(5 + r)]);
      }
    }
  }
}

TEST_CASE("int8 matvec: the activation rounding costs at most half a step per column, and non-finite x stays non-finite",
          "[tensor][quant][kernels]") {
  const Int8ActivationsOn on;
  std::mt19937 rng(5);
  const int64_t R = 9, K = 512;
  const auto w = normal_floats(rng, size_t(R * K), 0.05f);
  auto x = normal_floats(rng, size_t(K), 1.0f);
  for (const WeightFormat& f : int8_formats()) {
    INFO(f.name());
    const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
    kernels::QuantizedInput q;
    kernels::quantize_input(q, x.data(), K, f.group_size, false);
    std::vector<float> out(static_cast<size_t>(R)), row(static_cast<size_t>(K));
    m.matvec(out.data(), x.data());
    const int64_t G = m.groups_per_row();
    for (int64_t r = 0; r < R; ++r) {
      m.dequantize_row(row.data(), r);
      // the biases meet exact sums of x; the codes' part scale * q = w - bias meets x rounded by
      // at most half a step
      double exact = 0, bound = 1e-5;
      for (int64_t c = 0; c < K; ++c) {
        const int64_t g = c / f.group_size;
        exact += double(row[size_t(c)]) * x[size_t(c)];
        bound += std::fabs(double(row[size_t(c)]) - m.parts().biases[r * G + g]) * q.xscale[size_t(g)] * 0.5;
      }
      CHECK(std::fabs(out[size_t(r)] - exact) <= bound);
    }
    for (float bad : {NAN, INFINITY}) {
      auto y = x;
      y[100] = bad;
      for (Isa isa : isas_here()) {
        m.matvec(out.data(), y.data(), 0, R, isa);
        for (int64_t r = 0; r < R; ++r) CHECK(!std::isfinite(out[size_t(r)]));
      }
    }
  }
}

// The batched integer kernel (int8_dot.h rows_batch) tiles 4 and 2 vectors over one row at a time:
// every batch size from 1 to 17 (tiles and their tails), blocks of 8 groups and a tail block,
// row ranges that are not multiples of 4, each vector memcmp-equal to the plain C++ matvec of it alone.
TEST_CASE("int8 matvec_batch: every vector gets the single-vector bits, in every kernel set",
          "[tensor][quant][kernels][batch]") {
  const Int8ActivationsOn on;
  std::mt19937 rng(17);
  for (const WeightFormat& f : int8_formats())
    for (int64_t G : {11, 3}) {
      const int64_t R = 13, K = G * f.group_size;
      const auto w = normal_floats(rng, size_t(R * K), 0.05f);
      const auto x = normal_floats(rng, size_t(17 * K), 1.0f);
      const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
      std::vector<float> alone(size_t(17 * R));  // [17, R] each vector alone, plain C++
      for (int64_t v = 0; v < 17; ++v) m.matvec(alone.data() + v * R, x.data() + v * K, 0, R, Isa::Scalar);
      for (Isa isa : isas_here())
        for (int64_t B = 1; B <= 17; ++B)
          for (auto [row0, n] : {std::pair<int64_t, int64_t>{0, R}, std::pair<int64_t, int64_t>{5, 7}}) {
            INFO(f.name() << ", " << G << " groups, " << isa_name(isa) << ", B " << B << ", rows " << row0 << "+" << n);
            const int64_t ld = n + 3;  // an output stride wider than the rows
            std::vector<float> out(size_t(B * ld), NAN);
            m.matvec_batch(out.data(), ld, x.data(), B, row0, n, isa);
            for (int64_t v = 0; v < B; ++v)
              CHECK(std::memcmp(out.data() + v * ld, alone.data() + v * R + row0, size_t(n) * sizeof(float)) == 0);
          }
    }
}

// A matrix large enough to be split over threads: each thread's row block through the batched kernel.
TEST_CASE("int8 matvec_batch: the same bits over 2 threads", "[tensor][quant][kernels][batch]") {
  const Int8ActivationsOn on;
  std::mt19937 rng(19);
  const int64_t R = 1030, K = 1024, B = 7;
  const auto w = normal_floats(rng, size_t(R * K), 0.05f);
  const auto x = normal_floats(rng, size_t(B * K), 1.0f);
  for (const WeightFormat& f : {WeightFormat::affine(8, 64), WeightFormat::affine(4, 32)}) {
    const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
    std::vector<float> alone(size_t(B * R)), out(size_t(B * R));
    for (int64_t v = 0; v < B; ++v) m.matvec(alone.data() + v * R, x.data() + v * K, 0, R, Isa::Scalar);
    set_blas_threads(2);
    for (Isa isa : isas_here()) {
      INFO(f.name() << ", " << isa_name(isa));
      m.matvec_batch(out.data(), 0, x.data(), B, 0, R, isa);
      CHECK(std::memcmp(out.data(), alone.data(), out.size() * sizeof(float)) == 0);
    }
    set_blas_threads(1);
  }
}
