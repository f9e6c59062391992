// Llama 3's rope_scaling: RopeTable's angles against transformers' _compute_llama3_parameters,
// written out directly in double (wavelength bands, then the smooth interpolation).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "nn/rope.h"

using tpcli::nn::RopeScaling;
using tpcli::nn::RopeTable;

namespace {

// transformers: inv_freq / factor where wavelen > low_freq_wavelen, inv_freq where wavelen <
// high_freq_wavelen, else (1 - smooth) * inv_freq / factor + smooth * inv_freq.
double llama3_inv_freq(int i, int head_size, double theta, const RopeScaling& s) {
  const double inv_freq = 1.0 / std::pow(theta, 2.0 * i / head_size);
  const double wavelen = 2.0 * M_PI / inv_freq;
  const double low_freq_wavelen = s.original_max_position / s.low_freq_factor;
  const double high_freq_wavelen = s.original_max_position / s.high_freq_factor;
  if (wavelen > low_freq_wavelen) return inv_freq / s.factor;
  if (wavelen < high_freq_wavelen) return inv_freq;
  const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

// The angle of pair i at `pos`, read back from the table by rotating (1, 0).
double table_angle(const RopeTable& table, int pos, int i) {
  std::vector<float> x(static_cast<size_t>(table.head_size()), 0.0f);
  x[static_cast<size_t>(2 * i)] = 1.0f;
  table.forward(x.data(), 1, pos);
  return std::atan2(x[static_cast<size_t>(2 * i + 1)], x[static_cast<size_t>(2 * i)]);
}

}  // namespace

TEST_CASE("RoPE llama3 scaling: angles match transformers' formula in every band", "[nn][rope]") {
  const RopeScaling llama32{32.0f, 1.0f, 4.0f, 8192};  // Llama 3.2 1B's config.json
  const int HS = 64, S = 3000;
  const double theta = 500000.0;
  const RopeTable scaled(S, HS, float(theta), llama32), plain(S, HS, float(theta));
  int low = 0, medium = 0, high = 0;
  for (int i = 0; i < HS / 2; ++i) {
    const double wavelen = 2.0 * M_PI * std::pow(theta, 2.0 * i / HS);
    (wavelen > 8192.0 ? low : wavelen < 2048.0 ? high : medium) += 1;
    const double f = llama3_inv_freq(i, HS, theta, llama32);
    for (int pos : {1, 7, 100, 2999}) {
      INFO("pair " << i << " pos " << pos);
      const double expected = std::remainder(pos * f, 2.0 * M_PI);
      CHECK(std::remainder(table_angle(scaled, pos, i) - expected, 2.0 * M_PI) == Approx(0.0).margin(2e-3));
      const double unscaled = std::remainder(pos / std::pow(theta, 2.0 * i / HS), 2.0 * M_PI);
      CHECK(std::remainder(table_angle(plain, pos, i) - unscaled, 2.0 * M_PI) == Approx(0.0).margin(2e-3));
    }
  }
  // Llama 3.2's head size and theta put pairs in all three bands, so each branch was compared.
  CHECK(low > 0);
  CHECK(medium > 0);
  CHECK(high > 0);
  CHECK(tpcli::nn::llama3_frequency(0.5f, llama32) == 0.5f);                 // short wavelength: kept
  CHECK(tpcli::nn::llama3_frequency(1e-5f, llama32) == Approx(1e-5f / 32));  // long: divided by factor
}

// A GGUF's rope_freqs: one divisor per pair. The factors of a llama3 scaling turn the plain table
// into the scaled one (to float rounding), and a count that is not HS/2 is refused.
TEST_CASE("RoPE frequency factors: the llama3 scaling's factors give its angles, a wrong count is refused", "[nn][rope]") {
  const RopeScaling llama32{32.0f, 1.0f, 4.0f, 8192};
  const int HS = 64, S = 3000;
  const float theta = 500000.0f;
  const std::vector<float> factors = tpcli::nn::llama3_frequency_factors(HS, theta, llama32);
  REQUIRE(factors.size() == HS / 2);
  CHECK(factors.front() == 1.0f);   // the shortest wavelength: unscaled
  CHECK(factors.back() == 32.0f);   // the longest: divided by factor
  const RopeTable scaled(S, HS, theta, llama32), by_factors(S, HS, theta, std::nullopt, factors);
  for (int i = 0; i < HS / 2; ++i)
    for (int pos : {1, 100, 2999}) {
      INFO("pair " << i << " pos " << pos);
      const double want = llama3_inv_freq(i, HS, theta, llama32);
      CHECK(std::remainder(table_angle(by_factors, pos, i) - pos * want, 2.0 * M_PI) == Approx(0.0).margin(2e-3));
      CHECK(std::remainder(table_angle(by_factors, pos, i) - table_angle(scaled, pos, i), 2.0 * M_PI) == Approx(0.0).margin(1e-3));
    }
  const std::vector<float> seven(7, 1.0f);
  CHECK_THROWS_WITH(RopeTable(S, 16, theta, std::nullopt, seven), Catch::Contains("7 frequency factors for 8 pairs"));
}
