// The input gradient through frozen packed weights (QLoRA's backward): QuantizedLinear and its
// sharded forms on 1, 2 and 3 devices against the unsharded f32 Linear's backward with the
// dequantized weight, and against central finite differences of their own forward; the frozen
// packed SwiGLU feed-forward's input gradient against the f32 SwiGluFeedForward's on 1 and 2 devices.
//
// Tolerance against the f32 backward: both multiply the same f32 values; only the order of the f32
// sums differs (tiles, parts, lanes, the all_sum over devices), so the difference is bounded by a
// few ulps of sum |dout * W| per element: we allow 1e-5 of that sum. Finite differences: forward is
// linear in inp, so a central difference is exact up to rounding of the loss (~1e-7 of
// sum |out * g|, divided by 2 eps = 0.02): 1e-3 absolute and relative.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "nn/feed_forward.h"
#include "nn/linear.h"
#include "nn/quantized_linear.h"

using namespace tpcli;
using nn::testing::random_vector;
using tensor::WeightFormat;

namespace {

constexpr int64_t GS = 32;

const std::vector<WeightFormat> FORMATS = {WeightFormat::affine(4, 32), WeightFormat::affine(8, 32), WeightFormat::mxfp8(),
                                           WeightFormat::bf16(), WeightFormat::f16()};

// dinp[N, IN] = start + dout[N, OUT] @ W through the f32 Linear with the dequantized weight, and
// magnitude[N, IN] = |start| + sum_o |dout[n, o] * W[o, i]| (the scale of its rounding).
struct Reference {
  std::vector<float> dinp;
  std::vector<double> magnitude;
};

Reference f32_backward(const nn::QuantizedLinear& q, const std::vector<float>& dout, const std::vector<float>& start,
                       int64_t N) {
  const int64_t OUT = q.out_features(), IN = q.in_features();
  nn::Linear f32(q.weight().dequantize());
  Reference ref{start, std::vector<double>(size_t(N * IN))};
  const std::vector<float> inp(size_t(N * IN), 0.0f);  // (only the weight gradient reads it)
  f32.backward(ref.dinp.data(), dout.data(), inp.data(), N);
  const tensor::Tensor& w = f32.weight();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IN; ++i) {
      double m = std::fabs(double(start[size_t(n * IN + i)]));
      for (int64_t o = 0; o < OUT; ++o) m += std::fabs(double(dout[size_t(n * OUT + o)]) * w[o * IN + i]);
      ref.magnitude[size_t(n * IN + i)] = m;
    }
  return ref;
}

// How many elements of got are further than 1e-5 * magnitude from the reference's.
int64_t mismatches(const std::vector<float>& got, const Reference& ref) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - ref.dinp[i]) <= 1e-5 * ref.magnitude[i] + 1e-30)) ++bad;
  return bad;
}

// Columns [c0, c0 + count) of a row-major [N, width] matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t N, int64_t width, int64_t c0, int64_t count) {
  std::vector<float> out;
  for (int64_t n = 0; n < N; ++n) out.insert(out.end(), m.begin() + n * width + c0, m.begin() + n * width + c0 + count);
  return out;
}

// |analytic - numeric| <= 1e-3 + 1e-3 * max(|analytic|, |numeric|) for every element.
int64_t fd_mismatches(const std::vector<float>& analytic, const std::vector<double>& numeric) {
  int64_t bad = 0;
  for (size_t i = 0; i < analytic.size(); ++i)
    if (!(std::fabs(analytic[i] - numeric[i]) <= 1e-3 + 1e-3 * std::max(std::fabs(double(analytic[i])), std::fabs(numeric[i]))))
      ++bad;
  return bad;
}

// sum over the group of a double each member holds, carried as two floats (hi + lo) per member.
double all_sum_double(dist::Group& g, double x) {
  const float hi = float(x), lo = float(x - double(hi));
  std::vector<float> mine = {hi, lo}, all(size_t(2 * g.size()));
  g.all_gather(mine, all);
  double s = 0;
  for (size_t i = 0; i < all.size(); ++i) s += double(all[i]);
  return s;
}

}  // namespace

TEST_CASE("QuantizedLinear backward equals the f32 Linear's with the dequantized weight, and finite differences",
          "[nn][quantized][backward]") {
  std::mt19937 rng(301);
  const int64_t OUT = 37, IN = 160;  // 5 groups of 32
  const auto w = random_vector(size_t(OUT * IN), rng);
  for (const auto& f : FORMATS) {
    const auto q = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({OUT, IN}, w)), f);
    for (int64_t N : {1, 37}) {
      INFO(f.name() << ", N = " << N);
      const auto dout = random_vector(size_t(N * OUT), rng), start = random_vector(size_t(N * IN), rng);
      std::vector<float> dinp = start;
      q.backward(dinp.data(), dout.data(), N);
      CHECK(mismatches(dinp, f32_backward(q, dout, start, N)) == 0);
    }
    // finite differences of L = sum out * g over every input element
    INFO(f.name() << ", finite differences");
    const int64_t N = 3;
    auto x = random_vector(size_t(N * IN), rng);
    const auto g = random_vector(size_t(N * OUT), rng);
    std::vector<float> analytic(size_t(N * IN), 0.0f), out(size_t(N * OUT));
    q.backward(analytic.data(), g.data(), N);
    std::vector<double> numeric(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      numeric[i] = nn::testing::central_difference(x[i], [&] {
        q.forward(out.data(), x.data(), N);
        return nn::testing::dot(out, g);
      });
    CHECK(fd_mismatches(analytic, numeric) == 0);
  }
}

TEST_CASE("quantized sharded linears' backward on 1..3 devices equals the unsharded f32 backward",
          "[nn][quantized][sharded][backward]") {
  std::mt19937 rng(302);
  const int64_t OUT = 10, IN = 160;  // 5 groups of 32: dealt out 5, 3/2, 2/2/1
  const auto wa = random_vector(size_t(2 * OUT * IN), rng), wb = random_vector(size_t(OUT * IN), rng);
  for (const auto& f : FORMATS) {
    // w1|w3-like: two segments split by rows (backward all-sums); w2-like: split by input columns,
    // one lane per group (the gradient must go through every lane's columns)
    const auto qa = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({2 * OUT, IN}, wa)), f);
    const auto qb = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({OUT, IN}, wb)), f);
    for (int64_t N : {1, 37}) {
      const auto dout_a = random_vector(size_t(N * 2 * OUT), rng), dout_b = random_vector(size_t(N * OUT), rng);
      const auto start_a = random_vector(size_t(N * IN), rng), start_b = random_vector(size_t(N * IN), rng);
      const Reference ref_a = f32_backward(qa, dout_a, start_a, N), ref_b = f32_backward(qb, dout_b, start_b, N);
      for (int T = 1; T <= 3; ++T) {
        std::vector<std::vector<float>> got_a(T), got_b(T);
        std::vector<int> lanes(T);
        dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
          dist::Group& g = dev.axis("model");
          const int r = g.rank();
          auto a = std::get<nn::QuantizedAllToShardedLinear>(
              nn::shard_linear(qa, nn::Sharding::AllToSharded, g, nn::even_segments(2 * OUT, 2, g)));
          const dist::Range rows = dist::even_split(OUT, T, r), groups = dist::even_split(IN / GS, T, r);
          std::vector<float> da;  // this device's columns of dout_a: its rows of each segment
          for (int64_t n = 0; n < N; ++n)
            for (int s = 0; s < 2; ++s)
              for (int64_t j = 0; j < rows.count; ++j) da.push_back(dout_a[size_t(n * 2 * OUT + s * OUT + rows.offset + j)]);
          std::vector<float> dinp_a = start_a;
          a.backward(dinp_a.data(), da.data(), N);
          got_a[r] = dinp_a;
          std::vector<nn::QuantizedLinear> lane_parts;
          for (int64_t k = 0; k < groups.count; ++k)
            lane_parts.emplace_back(qb.weight().slice_columns({{(groups.offset + k) * GS, GS}}));
          nn::QuantizedShardedToAllLinear b(std::move(lane_parts), g);
          lanes[r] = b.lanes();
          std::vector<float> dinp_b = columns(start_b, N, IN, groups.offset * GS, groups.count * GS);
          b.backward(dinp_b.data(), dout_b.data(), N);
          got_b[r] = dinp_b;
        });
        for (int r = 0; r < T; ++r) {
          INFO(f.name() << ", N = " << N << ", " << T << " devices, device " << r);
          const dist::Range groups = dist::even_split(IN / GS, T, r);
          CHECK(lanes[r] == groups.count);
          CHECK(mismatches(got_a[r], ref_a) == 0);
          Reference local{columns(ref_b.dinp, N, IN, groups.offset * GS, groups.count * GS), {}};
          for (int64_t n = 0; n < N; ++n)
            for (int64_t i = groups.offset * GS; i < (groups.offset + groups.count) * GS; ++i)
              local.magnitude.push_back(ref_b.magnitude[size_t(n * IN + i)]);
          CHECK(mismatches(got_b[r], local) == 0);
        }
      }
    }
  }
}

TEST_CASE("quantized sharded linears' input gradient matches finite differences of their forward on 2 and 3 devices",
          "[nn][quantized][sharded][backward]") {
  std::mt19937 rng(303);
  const int64_t N = 3, OUT = 6, IN = 96;  // 3 groups of 32
  const auto wa = random_vector(size_t(2 * OUT * IN), rng), wb = random_vector(size_t(OUT * IN), rng);
  const auto x = random_vector(size_t(N * IN), rng);
  const auto ga = random_vector(size_t(N * 2 * OUT), rng), gb = random_vector(size_t(N * OUT), rng);
  const WeightFormat f = WeightFormat::affine(4, 32);
  const auto qa = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({2 * OUT, IN}, wa)), f);
  const auto qb = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({OUT, IN}, wb)), f);
  for (int T : {2, 3}) {
    std::vector<std::vector<float>> analytic_a(T), analytic_b(T);
    std::vector<std::vector<double>> numeric_a(T), numeric_b(T);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      const int r = g.rank();
      // all-to-sharded: x mirrored, L = sum over devices of out_local . g_local
      auto a = std::get<nn::QuantizedAllToShardedLinear>(
          nn::shard_linear(qa, nn::Sharding::AllToSharded, g, nn::even_segments(2 * OUT, 2, g)));
      const dist::Range rows = dist::even_split(OUT, T, r);
      std::vector<float> g_local;
      for (int64_t n = 0; n < N; ++n)
        for (int s = 0; s < 2; ++s)
          for (int64_t j = 0; j < rows.count; ++j) g_local.push_back(ga[size_t(n * 2 * OUT + s * OUT + rows.offset + j)]);
      std::vector<float> xa = x, out_a(size_t(N * a.out_features()));
      analytic_a[r].assign(size_t(N * IN), 0.0f);
      a.backward(analytic_a[r].data(), g_local.data(), N);
      for (size_t i = 0; i < xa.size(); ++i)
        numeric_a[r].push_back(nn::testing::central_difference(xa[i], [&] {
          a.forward(out_a.data(), xa.data(), N);
          return all_sum_double(g, nn::testing::dot(out_a, g_local));
        }));
      // sharded-to-all: x split by whole groups, out mirrored; every device steps through every
      // element of the full x in lockstep, the owner moving it
      auto b = std::get<nn::QuantizedShardedToAllLinear>(nn::shard_linear(qb, nn::Sharding::ShardedToAll, g));
      const dist::Range groups = dist::even_split(IN / GS, T, r);
      const int64_t c0 = groups.offset * GS, IL = groups.count * GS;
      std::vector<float> xb = columns(x, N, IN, c0, IL), out_b(size_t(N * OUT));
      analytic_b[r].assign(size_t(N * IL), 0.0f);
      b.backward(analytic_b[r].data(), gb.data(), N);
      numeric_b[r].assign(size_t(N * IL), 0.0);
      float unused = 0.0f;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < IN; ++i) {
          const bool mine = i >= c0 && i < c0 + IL;
          const double d = nn::testing::central_difference(mine ? xb[size_t(n * IL + i - c0)] : unused, [&] {
            b.forward(out_b.data(), xb.data(), N);
            return nn::testing::dot(out_b, gb);
          });
          if (mine) numeric_b[r][size_t(n * IL + i - c0)] = d;
        }
    });
    for (int r = 0; r < T; ++r) {
      INFO(T << " devices, device " << r);
      CHECK(fd_mismatches(analytic_a[r], numeric_a[r]) == 0);
      CHECK(fd_mismatches(analytic_b[r], numeric_b[r]) == 0);
    }
  }
}

TEST_CASE("frozen packed SwiGLU feed-forward: dinp equals the f32 SwiGluFeedForward's on dequantized weights, 1 and 2 devices",
          "[nn][quantized][backward][ffn]") {
  std::mt19937 rng(304);
  const int64_t C = 64, F = 96;  // F: 3 groups of 32, dealt out 2/1 on 2 devices
  const WeightFormat f = WeightFormat::affine(4, 32);
  const auto q1 = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({F, C}, random_vector(size_t(F * C), rng, 0.3f))), f);
  const auto q3 = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({F, C}, random_vector(size_t(F * C), rng, 0.3f))), f);
  const auto q2 = nn::QuantizedLinear::from_linear(nn::Linear(tensor::Tensor({C, F}, random_vector(size_t(C * F), rng, 0.3f))), f);
  for (int64_t N : {1, 5}) {
    const auto x = random_vector(size_t(N * C), rng), dout = random_vector(size_t(N * C), rng);
    const auto start = random_vector(size_t(N * C), rng);
    // the reference: the f32 layer on one device, weights dequantized
    std::vector<float> ref_out(size_t(N * C)), ref_dinp = start;
    dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
      nn::SwiGluFeedForward ffn(q1.weight().dequantize(), q3.weight().dequantize(), q2.weight().dequantize(),
                                dev.axis("model"), "", {dist::Range{0, F}}, F);
      ffn.forward(ref_out.data(), x.data(), N);
      ffn.backward(ref_dinp.data(), dout.data(), x.data(), N);
    });
    double largest = 0;
    for (float v : ref_dinp) largest = std::max(largest, std::fabs(double(v)));
    for (int T : {1, 2}) {
      std::vector<std::vector<float>> out(T), dinp(T);
      std::vector<std::string> refused(T);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        dist::Group& g = dev.axis("model");
        const int r = g.rank();
        const dist::Range groups = dist::even_split(F / GS, T, r);
        const int64_t f0 = groups.offset * GS, FL = groups.count * GS;
        std::vector<nn::QuantizedLinear> parts;
        parts.emplace_back(q1.weight().slice_rows(f0, FL));
        parts.emplace_back(q3.weight().slice_rows(f0, FL));
        nn::QuantizedSwiGluFeedForward ffn(nn::QuantizedAllToShardedLinear(std::move(parts), g),
                                           nn::QuantizedShardedToAllLinear(nn::QuantizedLinear(q2.weight().slice_columns({{f0, FL}})), g));
        out[r].resize(size_t(N * C));
        dinp[r] = start;
        ffn.forward(out[r].data(), x.data(), N);
        try {  // forward kept nothing
          ffn.backward(dinp[r].data(), dout.data(), N);
        } catch (const std::logic_error& e) {
          refused[r] = e.what();
        }
        ffn.keep_activations(true);
        ffn.forward(out[r].data(), x.data(), N);
        ffn.backward(dinp[r].data(), dout.data(), N);
      });
      for (int r = 0; r < T; ++r) {
        INFO("N = " << N << ", " << T << " devices, device " << r);
        CHECK_THAT(refused[r], Catch::Contains("needs a forward on them after keep_activations(true)"));
        int64_t bad_out = 0, bad_dinp = 0;
        for (size_t i = 0; i < dinp[r].size(); ++i) {
          if (!(std::fabs(out[r][i] - ref_out[i]) <= 1e-5 * (1 + std::fabs(ref_out[i])))) ++bad_out;
          if (!(std::fabs(dinp[r][i] - ref_dinp[i]) <= 2e-5 * largest)) ++bad_dinp;
        }
        CHECK(bad_out == 0);
        CHECK(bad_dinp == 0);
      }
    }
  }
}
