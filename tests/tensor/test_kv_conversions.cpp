// The conversions a bf16 / f16 KV cache stores through (tensor/quant_formats.h), against
// independent references: bf16 by exact distances in double, f16 by the CPU's F16C instruction.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "tensor/quant_formats.h"

using namespace tpcli::tensor;

namespace {

std::vector<float> normal_floats(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> halves(const std::vector<float>& v, uint16_t (*convert)(float)) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(convert(x));
  return h;
}

// A bf16 value with an unbounded exponent: inf stands for 2^128, where rounding past the largest
// finite value lands (IEEE: overflow at half an ulp beyond it).
double unbounded_bf16(uint16_t b) {
  if ((b & 0x7FFF) == 0x7F80) return std::ldexp(b & 0x8000 ? -1.0 : 1.0, 128);
  return bf16_to_f32(b);
}

// bf16 nearest to finite x, ties to the even one, by comparing exact distances in double.
uint16_t reference_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t down = static_cast<uint16_t>(u >> 16), up = static_cast<uint16_t>(down + 1);
  if (std::isinf(x)) return down;
  const double below = std::fabs(double(x) - unbounded_bf16(down)), above = std::fabs(unbounded_bf16(up) - double(x));
  if (below != above) return below < above ? down : up;
  return (down & 1) ? up : down;
}

std::vector<float> edge_values() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          65504.0f, 65519.99f, 65520.0f, -65520.0f, 6.1035156e-05f, 6.1035e-05f, 5.9604645e-08f, 2.9802322e-08f,
                          2.9802326e-08f, 8.9406967e-08f, 1e-10f};
  // halfway and near-halfway cases of both formats: 1 + k ulp/2 around 1 (ties to even up and down)
  for (uint32_t low : {0x8000u, 0x18000u, 0x7FFFu, 0x8001u, 0x1000u, 0x3000u, 0x2000u, 0x0FFFu})
    for (uint32_t base : {0x3F800000u, 0xBF800000u, 0x00800000u, 0x7F7F0000u, 0x33800000u}) v.push_back(std::bit_cast<float>(base + low));
  std::mt19937 rng(7);
  for (float x : normal_floats(rng, 200)) v.push_back(x * 1e3f);
  return v;
}

}  // namespace

TEST_CASE("KV conversions: bf16 and f16 round to nearest even against independent references, NaN, inf and subnormals too",
          "[tensor][half]") {
  const std::vector<float> values = edge_values();
  const std::vector<uint16_t> bf16 = halves(values, f32_to_bf16), f16 = halves(values, f32_to_f16);
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = values[i];
    INFO("x = " << x << " bits " << std::hex << std::bit_cast<uint32_t>(x));
    if (std::isnan(x)) {
      CHECK(std::isnan(bf16_to_f32(bf16[i])));
      CHECK(std::isnan(f16_to_f32(f16[i])));
      CHECK(std::signbit(bf16_to_f32(bf16[i])) == std::signbit(x));
      continue;
    }
    CHECK(bf16[i] == reference_bf16(x));
#if defined(__x86_64__)
    CHECK(f16[i] == _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#endif
  }
  // widening back is exact: every bf16 and f16 value survives the round trip
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float b = bf16_to_f32(static_cast<uint16_t>(h)), f = f16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(b)) REQUIRE(reference_bf16(b) == h);
#if defined(__x86_64__)
    if (!std::isnan(f)) REQUIRE(std::bit_cast<uint32_t>(f) == std::bit_cast<uint32_t>(_cvtsh_ss(static_cast<uint16_t>(h))));
#endif
  }
}
