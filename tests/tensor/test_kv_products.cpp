// tensor/: the KV products give every query row the same bits whether it runs alone or beside
// others, on every instruction set, in every element type, and match the plain C++ sequence.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "support/isas.h"
#include "support/normal_values.h"
#include "tensor/kv_products.h"
#include "tensor/quant_formats.h"

using namespace tpcli::tensor;

using tpcli::testing::normal_values;

namespace {

// n cache rows of `len` elements `stride` apart, stored as `element`.
struct Cache {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  KvRows rows;
  Cache(KvElement element, int64_t n, int64_t stride, int64_t len, uint32_t seed) : f32(normal_values(size_t(n * stride), seed)) {
    rows = {f32.data(), element, n, stride, len};
    if (element == KvElement::F32) return;
    for (float x : f32) half.push_back(element == KvElement::BF16 ? f32_to_bf16(x) : f32_to_f16(x));
    rows.data = half.data();
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("kv products: many query rows give each row its single-row bits, on every set, as the plain C++ sequence", "[tensor][kv]") {
  for (KvElement element : {KvElement::F32, KvElement::BF16, KvElement::F16})
    for (int64_t len : {8, 64, 72, 128}) {
      const int64_t n = 37, stride = len * 3 + 5, R = 11;
      const Cache cache(element, n, stride, len, 41);
      const std::vector<float> q = normal_values(size_t(R * len), 42), a = normal_values(size_t(R * n), 43);
      std::vector<float> ref_scores(size_t(R * n)), ref_y(size_t(R * len), 0.5f);
      kv_dots(ref_scores.data(), n, q.data(), len, R, cache.rows, 8.0f, Isa::Scalar);
      kv_weighted_sums(ref_y.data(), len, a.data(), n, R, cache.rows, Isa::Scalar);
      for (Isa isa : tpcli::testing::isas_here()) {
        INFO("element " << int(element) << ", len " << len << ", isa " << isa_name(isa));
        std::vector<float> scores(size_t(R * n)), y(size_t(R * len), 0.5f);
        kv_dots(scores.data(), n, q.data(), len, R, cache.rows, 8.0f, isa);
        kv_weighted_sums(y.data(), len, a.data(), n, R, cache.rows, isa);
        CHECK(same_bits(scores, ref_scores));
        CHECK(same_bits(y, ref_y));
        std::vector<float> one_scores(size_t(R * n)), one_y(size_t(R * len), 0.5f);
        for (int64_t r = 0; r < R; ++r) {  // each row alone, and the cache rows in two runs (blocks of a pool)
          KvRows first = cache.rows, rest = cache.rows;
          first.n = 5;
          rest.n = n - 5;
          rest.data = static_cast<const char*>(cache.rows.data) + 5 * stride * (element == KvElement::F32 ? 4 : 2);
          kv_dots(one_scores.data() + r * n, n, q.data() + r * len, len, 1, first, 8.0f, isa);
          kv_dots(one_scores.data() + r * n + 5, n, q.data() + r * len, len, 1, rest, 8.0f, isa);
          kv_weighted_sums(one_y.data() + r * len, len, a.data() + r * n, n, 1, first, isa);
          kv_weighted_sums(one_y.data() + r * len, len, a.data() + r * n + 5, n, 1, rest, isa);
        }
        CHECK(same_bits(one_scores, ref_scores));
        CHECK(same_bits(one_y, ref_y));
      }
    }
}

TEST_CASE("kv products: the plain C++ sequence against a double-precision dot product", "[tensor][kv]") {
  const int64_t len = 64, n = 9;
  const Cache cache(KvElement::F32, n, len, len, 51);
  const std::vector<float> q = normal_values(size_t(len), 52);
  std::vector<float> scores(static_cast<size_t>(n));
  kv_dots(scores.data(), n, q.data(), len, 1, cache.rows, 2.0f, Isa::Scalar);
  for (int64_t j = 0; j < n; ++j) {
    double exact = 0;
    for (int64_t i = 0; i < len; ++i) exact += double(q[size_t(i)]) * cache.f32[size_t(j * len + i)];
    CHECK(scores[size_t(j)] == Approx(exact / 2.0).margin(1e-5));
  }
}
