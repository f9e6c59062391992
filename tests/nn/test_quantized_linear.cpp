// int8 group-wise quantized linears: the quantization bound, the product against a double
// reference on the dequantized weights, and the sharded forms against the unsharded quantized layer.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "dist/runtime.h"
#include "fd_check.h"
#include "nn/quantized_linear.h"

using namespace tpcli;
using nn::testing::random_vector;

TEST_CASE("quantized Linear: error bound, forward and input gradient against double references", "[nn][quantized]") {
  std::mt19937 rng(91);
  const int64_t N = 3, OUT = 5, IN = 37, G = 8;  // last group of each row is short (37 = 4*8 + 5)
  auto w = random_vector(OUT * IN, rng);
  auto x = random_vector(N * IN, rng), dout = random_vector(N * OUT, rng);
  tensor::Tensor wt({OUT, IN}, w);
  nn::QuantizedLinear q(wt, G);
  const tensor::Tensor d = q.dequantize();
  for (int64_t o = 0; o < OUT; ++o)
    for (int64_t g = 0; g * G < IN; ++g) {
      float amax = 0;
      for (int64_t i = g * G; i < std::min(IN, (g + 1) * G); ++i) amax = std::max(amax, std::abs(w[o * IN + i]));
      for (int64_t i = g * G; i < std::min(IN, (g + 1) * G); ++i)
        CHECK(std::abs(d[o * IN + i] - w[o * IN + i]) <= amax / 127.0f / 2.0f * 1.001f + 1e-7f);
    }
  std::vector<float> out(N * OUT), dinp(N * IN, 0.0f);
  q.forward(out.data(), x.data(), N);
  q.backward_input(dinp.data(), dout.data(), N);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double s = 0, exact = 0, bound = 0;
      for (int64_t i = 0; i < IN; ++i) {
        s += double(d[o * IN + i]) * x[n * IN + i];
        exact += double(w[o * IN + i]) * x[n * IN + i];
        bound += std::abs(double(x[n * IN + i])) * std::abs(d[o * IN + i] - w[o * IN + i]);
      }
      CHECK(out[n * OUT + o] == Approx(s).epsilon(1e-5).margin(1e-5));
      CHECK(std::abs(out[n * OUT + o] - exact) <= bound + 1e-5);  // only the int8 rounding error
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IN; ++i) {
      double s = 0;
      for (int64_t o = 0; o < OUT; ++o) s += double(dout[n * OUT + o]) * d[o * IN + i];
      CHECK(dinp[n * IN + i] == Approx(s).epsilon(1e-5).margin(1e-5));
    }
  CHECK(q.bytes() == OUT * IN + OUT * 5 * 4);
}

TEST_CASE("quantized sharded linears equal the unsharded quantized layer on 1..4 devices", "[nn][quantized][sharded]") {
  std::mt19937 rng(92);
  const int64_t N = 2, C = 64, OUT = 10, G = 16;  // ShardedToAll columns 64 over 2 or 4: group-aligned
  auto w_a = random_vector(OUT * C, rng), w_b = random_vector(C * OUT * 0 + OUT * C, rng);
  auto x = random_vector(N * C, rng), dout_a = random_vector(N * OUT, rng), dout_b = random_vector(N * OUT, rng);
  nn::QuantizedLinear qa(tensor::Tensor({OUT, C}, w_a), G), qb(tensor::Tensor({OUT, C}, w_b), G);
  std::vector<float> ref_a(N * OUT), ref_b(N * OUT), ref_da(N * C, 0.0f);
  qa.forward(ref_a.data(), x.data(), N);
  qb.forward(ref_b.data(), x.data(), N);
  qa.backward_input(ref_da.data(), dout_a.data(), N);
  for (int T : {1, 2, 4}) {
    std::vector<std::vector<float>> out_a(T), out_b(T), da(T), db(T);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      const int r = g.rank();
      auto rows = dist::even_split(OUT, T, r);
      auto cols = dist::even_split(C, T, r);
      auto a = std::get<nn::AllToShardedLinear>(
          nn::shard_linear(nn::Linear(tensor::Tensor({OUT, C}, w_a)), nn::Sharding::AllToSharded, g));
      auto b = std::get<nn::ShardedToAllLinear>(
          nn::shard_linear(nn::Linear(tensor::Tensor({OUT, C}, w_b)), nn::Sharding::ShardedToAll, g));
      nn::QuantizedAllToShardedLinear qa_s(a, g, G);
      nn::QuantizedShardedToAllLinear qb_s(b, g, G);
      std::vector<float> oa(N * rows.count), dl(N * rows.count), dxa(N * C, 0.0f), ob(N * OUT), xl, dxb(N * cols.count, 0.0f);
      qa_s.forward(oa.data(), x.data(), N);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < rows.count; ++j) dl[n * rows.count + j] = dout_a[n * OUT + rows.offset + j];
      qa_s.backward(dxa.data(), dl.data(), N);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < cols.count; ++j) xl.push_back(x[n * C + cols.offset + j]);
      qb_s.forward(ob.data(), xl.data(), N);
      qb_s.backward(dxb.data(), dout_b.data(), N);
      out_a[r] = oa;
      da[r] = dxa;
      out_b[r] = ob;
      db[r] = dxb;
    });
    for (int r = 0; r < T; ++r) {
      INFO(T << " devices, device " << r);
      auto rows = dist::even_split(OUT, T, r);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < rows.count; ++j)
          CHECK(out_a[r][n * rows.count + j] == Approx(ref_a[n * OUT + rows.offset + j]).epsilon(1e-5));
      for (int64_t i = 0; i < N * C; ++i) CHECK(da[r][i] == Approx(ref_da[i]).epsilon(1e-4).margin(1e-5));
      for (int64_t i = 0; i < N * OUT; ++i) CHECK(out_b[r][i] == Approx(ref_b[i]).epsilon(1e-4).margin(1e-5));
    }
  }
}
