// The collective matmuls against their plain forms (serial products on the full matrices).
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "fd_check.h"
#include "nn/collective_matmul.h"

using namespace tpcli;
using nn::testing::random_vector;

TEST_CASE("all_gather_matmul and matmul_reduce_scatter, one-way and two-way, equal the plain forms on 1..4 devices",
          "[nn][collective_matmul]") {
  const nn::Ring ring = GENERATE(nn::Ring::OneWay, nn::Ring::TwoWay);
  // N = 7 rows over 2..4 devices: uneven chunks, padded in transit (two-way: halves of 2 and 1 rows);
  // N = 16: even chunks. With the links modelled the started ppermutes go through the booking path.
  const int64_t N = GENERATE(7, 16);
  const bool modelled = GENERATE(false, true);
  INFO((ring == nn::Ring::TwoWay ? "two-way" : "one-way") << ", N = " << N << (modelled ? ", links modelled" : ""));
  dist::RunOptions options;
  if (modelled) options.links = {{"model", {50, 0, dist::Topology::Ring}}};
  std::mt19937 rng(101);
  const int64_t IN = 12, OUT = 9;
  auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng);
  nn::Linear full(tensor::Tensor({OUT, IN}, w));
  std::vector<float> ref(N * OUT);
  full.forward(ref.data(), x.data(), N);
  for (int T = 1; T <= 4; ++T) {
    std::vector<std::vector<float>> gathered(T), scattered(T);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      const int r = g.rank();
      auto a = std::get<nn::AllToShardedLinear>(nn::shard_linear(full, nn::Sharding::AllToSharded, g));
      auto b = std::get<nn::ShardedToAllLinear>(nn::shard_linear(full, nn::Sharding::ShardedToAll, g));
      const auto rows = dist::even_split(N, T, r), cols = dist::even_split(IN, T, r);
      std::vector<float> out_a(N * a.out_features());
      nn::all_gather_matmul(out_a.data(), x.data() + rows.offset * IN, N, a, g, ring);
      const tensor::Tensor xl = nn::slice_columns(x.data(), N, IN, {cols});  // this device's input columns, all rows
      std::vector<float> out_b(rows.count * OUT);
      nn::matmul_reduce_scatter(out_b.data(), xl.data(), N, b, g, ring);
      gathered[r] = out_a;
      scattered[r] = out_b;
    }, options);
    for (int r = 0; r < T; ++r) {
      INFO(T << " devices, device " << r);
      const auto orow = dist::even_split(OUT, T, r), rows = dist::even_split(N, T, r);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < orow.count; ++j)
          CHECK(gathered[r][n * orow.count + j] == Approx(ref[n * OUT + orow.offset + j]).epsilon(1e-5).margin(1e-6));
      for (int64_t n = 0; n < rows.count; ++n)
        for (int64_t o = 0; o < OUT; ++o)
          CHECK(scattered[r][n * OUT + o] == Approx(ref[(rows.offset + n) * OUT + o]).epsilon(1e-5).margin(1e-5));
    }
  }
}

TEST_CASE("all_gather_contracting_matmul equals the product over the whole input on 1..4 devices",
          "[nn][collective_matmul]") {
  // IN = 10 over 3 and 4 devices: uneven column chunks, padded in transit; IN = 2 over 3 and 4
  // devices: some members hold no columns at all. Fused (3 segments) and single-part layers.
  const int64_t IN = GENERATE(10, 2), N = 5, OUT = 12;
  const int segments = GENERATE(1, 3);
  const bool modelled = GENERATE(false, true);
  INFO("IN = " << IN << ", " << segments << " segment(s)" << (modelled ? ", links modelled" : ""));
  dist::RunOptions options;
  if (modelled) options.links = {{"model", {50, 0, dist::Topology::Ring}}};
  std::mt19937 rng(7);
  auto w = random_vector(OUT * IN, rng), x = random_vector(N * IN, rng);
  nn::Linear full(tensor::Tensor({OUT, IN}, w));
  std::vector<float> ref(N * OUT);  // [N, OUT]: the unsharded product, the reference
  full.forward(ref.data(), x.data(), N);
  for (int T = 1; T <= 4; ++T) {
    std::vector<std::vector<float>> got(T), want(T);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      dist::Group& g = dev.axis("model");
      const int r = g.rank();
      const auto segs = nn::even_segments(OUT, segments, g);
      auto a = std::get<nn::AllToShardedLinear>(nn::shard_linear(full, nn::Sharding::AllToSharded, g, segs));
      const auto cols = dist::even_split(IN, T, r);
      const tensor::Tensor xl = nn::slice_columns(x.data(), N, IN, {cols});  // this device's input columns, all rows
      got[r].assign(N * a.out_features(), NAN);
      nn::all_gather_contracting_matmul(got[r].data(), xl.data(), N, a, g);
      for (int64_t n = 0; n < N; ++n) {  // this device's output columns of ref: each segment's local rows
        int64_t seg_start = 0;
        for (const nn::Segment& seg : segs) {
          for (int64_t j = 0; j < seg.local.count; ++j) want[r].push_back(ref[n * OUT + seg_start + seg.local.offset + j]);
          seg_start += seg.size;
        }
      }
    }, options);
    for (int r = 0; r < T; ++r) {
      INFO(T << " devices, device " << r);
      REQUIRE(got[r].size() == want[r].size());
      for (size_t i = 0; i < got[r].size(); ++i) CHECK(got[r][i] == Approx(want[r][i]).epsilon(1e-5).margin(1e-6));
    }
  }
}
