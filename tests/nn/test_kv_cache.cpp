// Attention over a bf16 / f16 KV cache (nn/attention.h KvDtype): the rows' keys and values are
// stored rounded (tensor/quant_formats.h's conversions), and decode over them, many rows at once
// or over scattered blocks, gives exactly what f32 attention gives over the same values widened.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fd_check.h"
#include "nn/attention.h"
#include "tensor/quant_formats.h"

using namespace tpcli;
using nn::testing::random_vector;

namespace {

uint16_t to_half(float x, nn::KvDtype d) { return d == nn::KvDtype::BF16 ? tensor::f32_to_bf16(x) : tensor::f32_to_f16(x); }
float to_f32(uint16_t h, nn::KvDtype d) { return d == nn::KvDtype::BF16 ? tensor::bf16_to_f32(h) : tensor::f16_to_f32(h); }

}  // namespace

TEST_CASE("attention over a bf16 or f16 KV cache: stored rounded, read widened, decode's bits wherever the blocks lie",
          "[nn][attention][kv]") {
  std::mt19937 rng(43);
  const int64_t S = 160;
  const int32_t first_block = 0;
  const std::span<const int32_t> whole_cache(&first_block, 1);
  for (nn::KvDtype dtype : {nn::KvDtype::BF16, nn::KvDtype::F16})
    for (int HS : {8, 16, 48}) {  // 8 and 48: lanes past the head size masked
      std::vector<int> kv_of = {0, 1, 1};
      nn::AttentionShape s{3, 2, HS, kv_of};
      const int64_t QKV = s.qkv_dim(), QL = s.q_dim(), KVL = s.kv_dim();
      for (const auto& [pos, P] : std::vector<std::pair<int, int64_t>>{{0, 130}, {29, 100}, {5, 1}}) {
        INFO(nn::kv_dtype_name(dtype) << ", head size " << HS << ", " << P << " rows from position " << pos);
        const auto prefix = random_vector(pos * QKV, rng), qkv = random_vector(P * QKV, rng);
        // Decode row by row over the 16-bit cache; the f32 reference over the same values widened.
        std::vector<uint16_t> kc(S * KVL), vc(S * KVL);
        std::vector<float> kw(S * KVL), vw(S * KVL), expected(P * QL), reference(P * QL), ignored(QL);
        auto decode_row = [&](const float* row, int t, float* out, float* out_reference) {
          nn::attention_cached(out, row, {kc.data(), vc.data(), whole_cache, S, dtype}, t, 1, s);
          for (int64_t i = 0; i < KVL; ++i) {
            REQUIRE(kc[t * KVL + i] == to_half(row[QL + i], dtype));  // written rounded to nearest even
            REQUIRE(vc[t * KVL + i] == to_half(row[QL + KVL + i], dtype));
            kw[t * KVL + i] = to_f32(kc[t * KVL + i], dtype);
            vw[t * KVL + i] = to_f32(vc[t * KVL + i], dtype);
          }
          nn::attention_decode(out_reference, row, {kw.data(), vw.data(), whole_cache, S}, t, s);
        };
        for (int t = 0; t < pos; ++t) decode_row(prefix.data() + t * QKV, t, ignored.data(), ignored.data());
        const auto prefix_k = kc, prefix_v = vc;
        for (int64_t n = 0; n < P; ++n)
          decode_row(qkv.data() + n * QKV, pos + static_cast<int>(n), expected.data() + n * QL, reference.data() + n * QL);
        CHECK(expected == reference);

        // P rows at once, on a cache holding only the prefix: it writes the rows itself.
        std::vector<uint16_t> kb = prefix_k, vb = prefix_v;
        std::vector<float> out(P * QL);
        nn::attention_cached(out.data(), qkv.data(), {kb.data(), vb.data(), whole_cache, S, dtype}, pos, P, s);
        CHECK(kb == kc);
        CHECK(vb == vc);
        CHECK(out == expected);

        // Scattered 16-position blocks: decode's bits.
        const int64_t BS = 16, blocks = S / BS;
        std::vector<int32_t> table;
        for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>((b * 3 + 1) % blocks));  // 3 coprime to 10
        std::vector<uint16_t> kp(blocks * BS * KVL), vp(blocks * BS * KVL);
        for (int t = 0; t < pos; ++t) {
          const int64_t at = (table[static_cast<size_t>(t / BS)] * BS + t % BS) * KVL;
          std::copy_n(prefix_k.begin() + t * KVL, KVL, kp.begin() + at);
          std::copy_n(prefix_v.begin() + t * KVL, KVL, vp.begin() + at);
        }
        std::vector<float> paged(P * QL);
        nn::attention_cached(paged.data(), qkv.data(), {kp.data(), vp.data(), table, BS, dtype}, pos, P, s);
        CHECK(paged == expected);
      }
    }
}

TEST_CASE("KV dtypes: names, sizes, and a name that is none", "[nn][attention][kv]") {
  for (nn::KvDtype d : {nn::KvDtype::F32, nn::KvDtype::BF16, nn::KvDtype::F16}) CHECK(nn::kv_dtype_from_name(nn::kv_dtype_name(d)) == d);
  CHECK(nn::kv_dtype_bytes(nn::KvDtype::F32) == 4);
  CHECK(nn::kv_dtype_bytes(nn::KvDtype::BF16) == 2);
  CHECK(nn::kv_dtype_bytes(nn::KvDtype::F16) == 2);
  CHECK_FALSE(nn::kv_dtype_from_name("f8"));
  CHECK_FALSE(nn::kv_dtype_from_name("BF16"));
}
