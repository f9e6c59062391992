// MLX's quantized linears: QuantizedLinear against a double product with its dequantized weight;
// the sharded forms built by shard_linear on 1..4 devices against the unsharded QuantizedLinear
// (input columns dealt out in whole groups, unevenly); the one-line error for a split that cuts a
// group; shard_inplace.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "nn/quantized_linear.h"

using namespace tpcli;
using nn::testing::random_vector;
using tensor::WeightFormat;

namespace {

// out[N, OUT] = x[N, IN] @ dequantize(W)^T in double.
std::vector<double> reference(const nn::QuantizedLinear& q, const std::vector<float>& x, int64_t N) {
  const tensor::Tensor w = q.weight().dequantize();
  const int64_t OUT = q.out_features(), IN = q.in_features();
  std::vector<double> out(size_t(N * OUT));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double s = 0;
      for (int64_t i = 0; i < IN; ++i) s += double(w[o * IN + i]) * x[size_t(n * IN + i)];
      out[size_t(n * OUT + o)] = s;
    }
  return out;
}

const std::vector<WeightFormat> FORMATS = {WeightFormat::affine(4, 32), WeightFormat::affine(8, 64),
                                           WeightFormat::mxfp8(), WeightFormat::bf16()};

}  // namespace

TEST_CASE("QuantizedLinear forward equals x @ dequantize(W)^T, decode and batched", "[nn][quantized]") {
  std::mt19937 rng(91);
  const int64_t OUT = 9, IN = 128;
  const auto w = random_vector(OUT * IN, rng);
  for (const auto& f : FORMATS) {
    INFO(f.name());
    const auto q = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({OUT, IN}, w)), f);
    CHECK(q.format() == f);
    for (int64_t N : {1, 4}) {
      const auto x = random_vector(N * IN, rng);
      std::vector<float> out(size_t(N * OUT));
      q.forward(out.data(), x.data(), N);
      const auto ref = reference(q, x, N);
      for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == Approx(ref[i]).epsilon(1e-5).margin(1e-4));
    }
  }
}

TEST_CASE("QuantizedLinear on columns that cut groups holds the groups they touch: the product and input gradient of those columns alone",
          "[nn][quantized]") {
  std::mt19937 rng(92);
  const int64_t OUT = 7, K = 256, lead = 40, IN = 100;  // columns [40, 140) of groups of 64: the groups [0, 192)
  const auto w = random_vector(OUT * K, rng);
  for (const auto& f : {WeightFormat::affine(4, 64), WeightFormat::affine(8, 64)}) {
    INFO(f.name());
    const tensor::PackedMatrix whole = tensor::PackedMatrix::from_f32(w.data(), OUT, K, f);
    const tensor::Tensor dequantized = whole.dequantize();
    const nn::QuantizedLinear part(tensor::PackedMatrix::from_f32(w.data(), OUT, K, f).slice_columns({{0, 192}}), lead, IN);
    CHECK(part.in_features() == IN);
    for (int64_t N : {1, 3}) {
      const auto x = random_vector(N * IN, rng), dout = random_vector(N * OUT, rng);
      std::vector<float> out(size_t(N * OUT)), dx(size_t(N * IN), 1.0f);
      part.forward(out.data(), x.data(), N);
      part.input_gradient(dx.data(), dout.data(), N, true);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t o = 0; o < OUT; ++o) {
          double s = 0;
          for (int64_t i = 0; i < IN; ++i) s += double(dequantized[o * K + lead + i]) * x[size_t(n * IN + i)];
          CHECK(out[size_t(n * OUT + o)] == Approx(s).epsilon(1e-5).margin(1e-4));
        }
        for (int64_t i = 0; i < IN; ++i) {
          double g = 1.0;  // accumulated onto
          for (int64_t o = 0; o < OUT; ++o) g += double(dequantized[o * K + lead + i]) * dout[size_t(n * OUT + o)];
          CHECK(dx[size_t(n * IN + i)] == Approx(g).epsilon(1e-5).margin(1e-4));
        }
      }
    }
  }
  CHECK_THROWS_WITH(nn::QuantizedLinear(tensor::PackedMatrix::from_f32(w.data(), OUT, K, WeightFormat::affine(4, 64)), 200, 100),
                    Catch::Contains("not within the weight's 256"));
}

TEST_CASE("quantized sharded linears from shard_linear equal the unsharded QuantizedLinear on 1..4 devices",
          "[nn][quantized][sharded]") {
  std::mt19937 rng(92);
  const int64_t N = 2, OUT = 10, IN = 160;  // 5 groups of 32: dealt out 3/2, 2/2/1, 2/1/1/1
  const auto wa = random_vector(2 * OUT * IN, rng), wb = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng);
  for (const auto& f : {WeightFormat::affine(4, 32), WeightFormat::mxfp8()}) {
    INFO(f.name());
    // a fused pair of segments (like w1|w3) split by rows, and a layer split by input columns
    const auto qa = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({2 * OUT, IN}, wa)), f);
    const auto qb = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({OUT, IN}, wb)), f);
    std::vector<float> ref_a(size_t(N * 2 * OUT)), ref_b(size_t(N * OUT));
    qa.forward(ref_a.data(), x.data(), N);
    qb.forward(ref_b.data(), x.data(), N);
    for (int T = 1; T <= 4; ++T) {
      std::vector<std::vector<float>> out_a(T), out_b(T);
      std::vector<int64_t> held(T);
      std::vector<char> formats_kept(T, 0);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        dist::Group& g = dev.axis("model");
        const int r = g.rank();
        auto a = std::get<nn::QuantizedAllToShardedLinear>(
            nn::shard_linear(qa, nn::Sharding::AllToSharded, g, nn::even_segments(2 * OUT, 2, g)));
        auto b = std::get<nn::QuantizedShardedToAllLinear>(nn::shard_linear(qb, nn::Sharding::ShardedToAll, g));
        const dist::Range groups = dist::even_split(IN / 32, T, r);
        held[r] = b.in_features();
        std::vector<float> oa(size_t(N * a.out_features())), ob(size_t(N * OUT)), xl;
        a.forward(oa.data(), x.data(), N);
        for (int64_t n = 0; n < N; ++n)
          xl.insert(xl.end(), x.begin() + n * IN + groups.offset * 32, x.begin() + n * IN + (groups.offset + groups.count) * 32);
        b.forward(ob.data(), xl.data(), N);
        out_a[r] = oa;
        out_b[r] = ob;
        formats_kept[r] = a.part(0).format() == f && b.lane(0).format() == f;
      });
      for (int r = 0; r < T; ++r) {
        INFO(T << " devices, device " << r);
        CHECK(formats_kept[r]);
        CHECK(held[r] == dist::even_split(IN / 32, T, r).count * 32);
        const dist::Range rows = dist::even_split(OUT, T, r);
        const int64_t OL = 2 * rows.count;
        for (int64_t n = 0; n < N; ++n)
          for (int s = 0; s < 2; ++s)
            for (int64_t j = 0; j < rows.count; ++j)
              CHECK(out_a[r][size_t(n * OL + s * rows.count + j)] ==
                    Approx(ref_a[size_t(n * 2 * OUT + s * OUT + rows.offset + j)]).epsilon(1e-5).margin(1e-5));
        for (int64_t i = 0; i < N * OUT; ++i) CHECK(out_b[r][size_t(i)] == Approx(ref_b[size_t(i)]).epsilon(1e-4).margin(1e-4));
      }
    }
  }
}

TEST_CASE("quantized shard_linear refuses a split that cuts a group, and shard_inplace slices the same way",
          "[nn][quantized][sharded]") {
  std::mt19937 rng(93);
  const int64_t OUT = 4, IN = 128;
  const auto w = random_vector(OUT * IN, rng);
  const auto q = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({OUT, IN}, w)), WeightFormat::affine(8, 64));
  std::vector<std::string> errors(2);
  std::vector<nn::QuantizedLinear> cols(2, q), rows(2, q);
  dist::run_on_mesh(dist::Mesh::line(2), [&](dist::Device& dev) {
    dist::Group& g = dev.axis("model");
    const int r = g.rank();
    std::vector<nn::Segment> cut = {{IN, r == 0 ? dist::Range{0, 48} : dist::Range{48, 80}}};
    try {
      nn::shard_linear(q, nn::Sharding::ShardedToAll, g, cut);
    } catch (const std::invalid_argument& e) {
      errors[r] = e.what();
    }
    nn::shard_inplace(cols[r], nn::Sharding::ShardedToAll, g);
    nn::shard_inplace(rows[r], nn::Sharding::AllToSharded, g, nn::even_segments(OUT, 2, g));
  });
  const tensor::Tensor full = q.weight().dequantize();
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(errors[r], Catch::Contains("cut a affine 8-bit g64 group of 64 columns"));
    REQUIRE(cols[r].in_features() == 64);
    REQUIRE(rows[r].out_features() == 2);
    const tensor::Tensor c = cols[r].weight().dequantize(), rw = rows[r].weight().dequantize();
    for (int64_t o = 0; o < OUT; ++o)
      for (int64_t i = 0; i < 64; ++i) CHECK(c[o * 64 + i] == full[o * IN + r * 64 + i]);
    // two segments of 2 rows, one row of each per device: rows {r, 2 + r}
    for (int64_t i = 0; i < IN; ++i) {
      CHECK(rw[i] == full[r * IN + i]);
      CHECK(rw[IN + i] == full[(2 + r) * IN + i]);
    }
  }
}
