// tensor/: matrix-vector products over ggml block types (WeightKind::Ggml) on every instruction set
// here, against double products of ggml_blocks' dequantization (itself checked against ggml's
// definition in tests/formats), on random blocks: any bytes are a valid block once its f16 scales
// are finite, so random bytes reach every code, scale, min and high bit. Then the properties the
// mesh and the batch engine rely on: a row's value does not depend on the row range, and a batch
// gives each vector its single-vector bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "support/isas.h"
#include "support/normal_values.h"
#include "tensor/packed_matrix.h"
#include "tensor/quant_formats.h"

using namespace tpcli::tensor;
using tpcli::testing::isas_here;
using tpcli::testing::normal_values;

namespace {

// Byte offsets of each type's f16 scale fields within its block (ggml_blocks.h's layouts).
std::vector<int> half_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

const GgmlType TYPES[] = {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_0, GgmlType::Q4_1,
                          GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q5_K,
                          GgmlType::IQ4_NL, GgmlType::IQ4_XS};

// R rows of K values as random blocks of `t`, scales in [-scale, scale] (some zero: a block of zeros).
PackedMatrix random_blocks(GgmlType t, int64_t R, int64_t K, uint32_t seed, float scale = 0.01f) {
  const GgmlTypeTraits& traits = ggml_traits(t);
  const int64_t blocks = R * K / traits.block_elements;
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks * traits.block_bytes));
  std::mt19937 rng(seed);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> d(-scale, scale);
  for (int64_t i = 0; i < blocks; ++i)
    for (int offset : half_fields(t)) {
      const uint16_t h = i % 17 == 5 ? uint16_t{0} : f32_to_f16(d(rng));
      std::memcpy(&bytes[static_cast<size_t>(i * traits.block_bytes + offset)], &h, 2);
    }
  PackedMatrix::Parts parts;
  parts.data = bytes.data();
  return PackedMatrix::copy_of(WeightFormat::ggml_blocks(t), R, K, parts, 0, R);
}

std::vector<double> reference_matvec(const PackedMatrix& m, const float* x) {
  std::vector<float> row(static_cast<size_t>(m.cols()));
  std::vector<double> out(static_cast<size_t>(m.rows()));
  for (int64_t r = 0; r < m.rows(); ++r) {
    m.dequantize_row(row.data(), r);
    double s = 0;
    for (int64_t c = 0; c < m.cols(); ++c) s += double(row[size_t(c)]) * x[c];
    out[size_t(r)] = s;
  }
  return out;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("ggml matvec: every type on every kernel set within f32 rounding of the dequantized product", "[tensor][ggml][kernels]") {
  const int64_t R = 37, K = 768;  // three super-blocks, 24 blocks of 32; an odd row count
  const std::vector<float> x = normal_values(static_cast<size_t>(K), 3);
  for (GgmlType t : TYPES) {
    const PackedMatrix m = random_blocks(t, R, K, 5);
    const std::vector<double> ref = reference_matvec(m, x.data());
    double largest = 0;
    for (double v : ref) largest = std::max(largest, std::fabs(v));
    REQUIRE(largest > 0.1);  // the blocks are not all zero
    for (tpcli::tensor::Isa isa : isas_here()) {
      INFO(ggml_traits(t).name << " on " << isa_name(isa));
      std::vector<float> out(static_cast<size_t>(R), NAN);
      m.matvec(out.data(), x.data(), 0, R, isa);
      for (int64_t r = 0; r < R; ++r) CHECK(out[size_t(r)] == Approx(ref[size_t(r)]).margin(2e-6 * largest));
    }
  }
}

TEST_CASE("ggml matvec: extreme scales stay within f32 rounding, and zero blocks give zero", "[tensor][ggml][kernels]") {
  const int64_t R = 8, K = 512;
  const std::vector<float> x = normal_values(static_cast<size_t>(K), 4);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K})
    for (float scale : {60000.0f, 1e-7f}) {  // near f16's largest; f16 subnormals
      const PackedMatrix m = random_blocks(t, R, K, 9, scale);
      const std::vector<double> ref = reference_matvec(m, x.data());
      double largest = 0;
      for (double v : ref) largest = std::max(largest, std::fabs(v));
      for (tpcli::tensor::Isa isa : isas_here()) {
        INFO(ggml_traits(t).name << " scale " << scale << " on " << isa_name(isa));
        std::vector<float> out(static_cast<size_t>(R), NAN);
        m.matvec(out.data(), x.data(), 0, R, isa);
        for (int64_t r = 0; r < R; ++r) CHECK(std::fabs(out[size_t(r)] - ref[size_t(r)]) <= 2e-6 * largest);
      }
    }
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    const PackedMatrix m = random_blocks(t, 2, K, 1, 0.0f);  // every scale and min 0
    for (tpcli::tensor::Isa isa : isas_here()) {
      std::vector<float> out(2, NAN);
      m.matvec(out.data(), x.data(), 0, 2, isa);
      CHECK(out[0] == 0.0f);
      CHECK(out[1] == 0.0f);
    }
  }
}

TEST_CASE("ggml matvec: a row's bits do not depend on the row range or on the batch around it", "[tensor][ggml][batch]") {
  const int64_t R = 45, K = 1024;
  const std::vector<float> x = normal_values(static_cast<size_t>(17 * K), 6);
  for (GgmlType t : TYPES) {
    const PackedMatrix m = random_blocks(t, R, K, 7);
    for (tpcli::tensor::Isa isa : isas_here()) {
      INFO(ggml_traits(t).name << " on " << isa_name(isa));
      std::vector<float> whole(static_cast<size_t>(R), NAN);
      m.matvec(whole.data(), x.data(), 0, R, isa);
      for (int64_t first : {1, 4, 9, 44}) {
        std::vector<float> part(static_cast<size_t>(R - first), NAN);
        m.matvec(part.data(), x.data(), first, R - first, isa);
        CHECK(same_bits(part.data(), whole.data() + first, static_cast<size_t>(R - first)));
      }
      for (int B : {2, 5, 17}) {
        std::vector<float> batched(static_cast<size_t>(B * (R - 3))), alone(static_cast<size_t>(R - 3));
        m.matvec_batch(batched.data(), 0, x.data(), B, 3, R - 3, isa);
        bool same = true;
        for (int v = 0; v < B; ++v) {
          m.matvec(alone.data(), x.data() + v * K, 3, R - 3, isa);
          same = same && same_bits(batched.data() + v * (R - 3), alone.data(), static_cast<size_t>(R - 3));
        }
        INFO("B " << B);
        CHECK(same);
      }
    }
  }
}
